package dev.snowkeep.client;

import io.grpc.ManagedChannel;
import io.grpc.Status;
import java.util.Arrays;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Generates ids in this process from machine ids leased through a snowkeep server's Lease API
 * ({@code snowkeep.v1.LeaseService}): no network hop per id. The Java port of the Rust client's
 * {@code EmbeddedGenerator}, under the same Lease API contract (docs/api.md, "EmbeddedGenerator
 * follows the Lease API contract"; docs/design.md, the safety invariant and the fence protocol):
 *
 * <ul>
 *   <li><b>Start</b> ({@link EmbeddedGeneratorBuilder#start()}): Acquire, retrying every 3 s
 *       doubling to 60 s with ±20 % jitter on the retryable codes ({@link
 *       SnowkeepException#isRetryable}); a {@code PERMISSION_DENIED} (this identity holds
 *       machine ids whose grant never reached us) starts over once, at once, under a new nonce.
 *       Fails fast ({@link GrantRejectedException}, after releasing the grant) on an invalid
 *       layout, a machine id outside the machine bits, another count, an expired grant, a clock
 *       past a granted fence, or a clock behind the floor by more than {@code maxFloorWait}.
 *       Otherwise it returns once the clock passed the previous holders' fences.
 *   <li><b>Renew</b>: at once, then at half the remaining lease; while behind, every {@code
 *       min(10 min, remaining/4)}, at least 5 s apart; a Renew that hangs is cut off at the lease's
 *       local deadline. The lease token is kept in memory and sent with every Renew, Check and
 *       Release.
 *   <li><b>Check</b>: every {@code checkInterval} (30 s), so a lease etcd lost stops issuance
 *       within that interval. No answer changes nothing.
 *   <li><b>Stop for good</b> ({@link StopReason}): an empty Renew, other machine ids, a refused
 *       token, the local deadline, a clock past a renewed fence (then the ids are released), or
 *       a Check saying lease gone, namespace gone or rolled back. {@link #stopped()} completes
 *       then, and every call throws {@link GeneratorStoppedException}.
 *   <li><b>Close</b>: blocks issuance, drains, and releases with the last timestamp stamped on
 *       each machine id.
 * </ul>
 *
 * <p>Ids are {@code long}s of at most 63 bits, never negative, strictly ascending per machine id;
 * a batch is strictly ascending. The generator stamps under the namespace's layout (every
 * bit split of 32 to 63 bits and every time unit the server reports), never at or below a
 * floor, never above a fence, never after the local deadline (measured on {@link
 * System#nanoTime()}). Thread-safe, except the {@link Worker}s of {@link #pin()}.
 */
public final class EmbeddedGenerator implements AutoCloseable {
  private final LeaseKeeper keeper;
  private final ManagedChannel channel;
  private final Spread spread;
  private final LeaseTime time;
  private final AtomicLong counter = new AtomicLong();
  private final Object pinLock = new Object();
  /** The machine ids no worker has pinned, in slot order. */
  private volatile Slot[] shared;

  EmbeddedGenerator(LeaseKeeper keeper, ManagedChannel channel) {
    this.keeper = keeper;
    this.channel = channel;
    this.spread = keeper.config.spread;
    this.time = keeper.time;
    this.shared = keeper.slots.clone();
  }

  /**
   * A builder with the defaults: one machine id, this process as the requester, round robin.
   *
   * @return a new builder
   */
  public static EmbeddedGeneratorBuilder builder() {
    return new EmbeddedGeneratorBuilder();
  }

  /** Sleeps on {@code time}; an interrupt becomes a CancellationException (flag set again). */
  static void sleep(LeaseTime time, long nanos) {
    try {
      time.sleepNanos(nanos);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      CancellationException c = new CancellationException("interrupted");
      c.initCause(e);
      throw c;
    }
  }

  /**
   * One id, from one of the machine ids no {@link Worker} pinned, chosen by the {@link Spread};
   * a machine id that cannot issue now is skipped for the next. Blocks while the tick's sequence
   * is used up (until the next tick) or the clock stepped back by at most {@code
   * maxBackwardWait}.
   *
   * @return an id in [0, 2^63 − 1], above every id this generator issued before on its machine id
   * @throws GeneratorStoppedException once issuance stopped for good
   * @throws IdGenerationException when no machine id can issue now (the first one's reason)
   * @throws SnowkeepException {@code FAILED_PRECONDITION} when every machine id is pinned
   * @throws CancellationException when the thread is interrupted while it waits
   */
  public long nextId() {
    return next(0, false);
  }

  /**
   * One id from machine id {@code key mod N} of the unpinned ones (the by-key spread: {@link
   * Spread#BY_THREAD} is this with the thread's id), skipping to the next when it cannot issue
   * now. Calls with the same key go to the same machine id while the pinned set stays the same,
   * so their ids ascend.
   *
   * @param key any number; its floor modulo N picks the machine id
   * @return an id, as {@link #nextId()}
   * @throws SnowkeepException as {@link #nextId()}
   */
  public long nextIdFor(long key) {
    return next(key, true);
  }

  private long next(long key, boolean keyed) {
    for (;;) {
      Slot[] s = shared;
      int n = s.length;
      if (n == 1) {
        long id = one(s[0]);
        if (id >= 0) {
          return id;
        }
        continue;
      }
      if (n == 0) {
        throw allPinned();
      }
      int start = keyed ? (int) Math.floorMod(key, (long) n) : first(n);
      IdGenerationException error = null;
      for (int i = 0; i < n; i++) {
        int k = start + i < n ? start + i : start + i - n;
        try {
          long id = one(s[k]);
          if (id >= 0) {
            return id;
          }
          error = null;
          break;
        } catch (IdGenerationException e) {
          error = error == null ? e : error;
        }
      }
      if (error != null) {
        throw error;
      }
    }
  }

  /** The first machine id a call tries, by the spread. */
  private int first(int n) {
    // 32-bit arithmetic, and a mask for a power of two: a 64-bit division per id costs more
    // than the rest of the call. (Round robin skews once per 2^32 calls when N is no power of 2.)
    int k = spread == Spread.BY_THREAD
        ? (int) Thread.currentThread().getId()
        : (int) counter.getAndIncrement();
    return (n & (n - 1)) == 0 ? k & (n - 1) : Integer.remainderUnsigned(k, n);
  }

  /** One id from a shared slot, waiting as needed; -1 when the slot got pinned meanwhile. */
  private long one(Slot slot) {
    for (;;) {
      long id;
      long wait;
      synchronized (slot) {
        if (slot.pinned) {
          return -1;
        }
        id = slot.take(1);
        wait = slot.waitNanos;
      }
      if (id >= 0) {
        return id;
      }
      sleep(time, wait);
    }
  }

  /**
   * {@code count} strictly ascending ids. A batch of at most one tick's sequence comes from one
   * machine id (chosen by the {@link Spread}, skipping one that cannot issue); a larger one is spread over every unpinned machine
   * id, taken in turns, and merged. On an error the ids already taken are dropped (a gap, never a
   * reuse).
   *
   * @param count how many ids, at least 1
   * @return the ids, strictly ascending, each in [0, 2^63 − 1]
   * @throws SnowkeepException {@code INVALID_ARGUMENT} naming {@code count} when it is below 1;
   *     otherwise as {@link #nextId()}
   */
  public long[] nextIds(int count) {
    if (count < 1) {
      throw SnowkeepException.invalid("count", count + " is below 1");
    }
    for (;;) {
      Slot[] s = shared;
      if (s.length == 0) {
        throw allPinned();
      }
      long[] out = new long[count];
      if (s.length == 1 || count <= keeper.layout.sequencesPerTick()) {
        if (fillOne(s, out)) {
          return out;
        }
      } else if (spreadFill(s, out)) {
        Arrays.sort(out);
        return out;
      }
    }
  }

  /**
   * Fills {@code out} from one slot of {@code s}, chosen by the spread, skipping to the next one
   * that can issue; false when one got pinned meanwhile.
   */
  private boolean fillOne(Slot[] s, long[] out) {
    int n = s.length;
    int start = n == 1 ? 0 : first(n);
    IdGenerationException error = null;
    for (int i = 0; i < n; i++) {
      try {
        return fill(s[start + i < n ? start + i : start + i - n], out, out.length);
      } catch (IdGenerationException e) {
        error = error == null ? e : error;
      }
    }
    throw error;
  }

  /** Fills {@code out} from one shared slot; false when it got pinned meanwhile. */
  private boolean fill(Slot slot, long[] out, int count) {
    int filled = 0;
    while (filled < count) {
      long first;
      long n;
      long wait;
      synchronized (slot) {
        if (slot.pinned) {
          return false;
        }
        first = slot.take(count - filled);
        n = slot.taken;
        wait = slot.waitNanos;
      }
      if (first < 0) {
        sleep(time, wait);
        continue;
      }
      for (int k = 0; k < n; k++) {
        out[filled++] = first + k;
      }
    }
    return true;
  }

  /** Fills {@code out} from every slot of {@code s} in turns; false when one got pinned. */
  private boolean spreadFill(Slot[] s, long[] out) {
    int k = s.length;
    int[] left = new int[k];
    for (int i = 0; i < k; i++) {
      left[i] = out.length / k + (i < out.length % k ? 1 : 0);
    }
    int filled = 0;
    while (filled < out.length) {
      long minWait = Long.MAX_VALUE;
      boolean progress = false;
      for (int i = 0; i < k; i++) {
        if (left[i] == 0) {
          continue;
        }
        long first;
        long n;
        synchronized (s[i]) {
          if (s[i].pinned) {
            return false;
          }
          first = s[i].take(left[i]);
          n = s[i].taken;
          minWait = first < 0 ? Math.min(minWait, s[i].waitNanos) : minWait;
        }
        if (first >= 0) {
          progress = true;
          for (int j = 0; j < n; j++) {
            out[filled++] = first + j;
          }
          left[i] -= (int) n;
        }
      }
      if (!progress) {
        sleep(time, minWait);
      }
    }
    return true;
  }

  /**
   * Pins one machine id to the calling thread (IdKeeper's third spread, one machine id per worker
   * thread): the returned {@link Worker} takes ids from it with no lock and no shared atomic write
   * on its fast path. The machine id leaves the pool {@link #nextId()} spreads over until the
   * worker is closed. A Worker is <b>not</b> thread-safe: only the thread that called {@code pin}
   * may use it (others get {@code FAILED_PRECONDITION}).
   *
   * @return a worker owning the lowest unpinned machine id
   * @throws SnowkeepException {@code FAILED_PRECONDITION} when every machine id is pinned
   */
  public Worker pin() {
    synchronized (pinLock) {
      Slot[] s = shared;
      if (s.length == 0) {
        throw allPinned();
      }
      Slot slot = s[0];
      synchronized (slot) {
        slot.pinned = true;
      }
      shared = Arrays.copyOfRange(s, 1, s.length);
      return new Worker(this, slot, keeper.machineIds[slot.index], Thread.currentThread());
    }
  }

  /** Gives a pinned slot back to the shared pool (a worker's close). */
  void unpin(Slot slot) {
    synchronized (pinLock) {
      synchronized (slot) {
        slot.pinned = false;
      }
      Slot[] s = Arrays.copyOf(shared, shared.length + 1);
      s[s.length - 1] = slot;
      Arrays.sort(s, (a, b) -> Integer.compare(a.index, b.index));
      shared = s;
    }
  }

  private SnowkeepException allPinned() {
    return new SnowkeepException(Status.Code.FAILED_PRECONDITION,
        "all " + keeper.slots.length + " machine ids are pinned to workers: close a Worker or hold more machine ids");
  }

  /** The clock waits of workers. */
  LeaseTime time() {
    return time;
  }

  /**
   * Completes with the reason once issuance stopped for good (including {@link
   * StopReason#SHUT_DOWN} on close): watch it to react to a lost lease. Never completes
   * exceptionally. Each call returns a new dependent future, so completing it changes nothing
   * here.
   *
   * @return a future of the stop reason
   */
  public CompletableFuture<StopReason> stopped() {
    return keeper.stopped().copy();
  }

  /**
   * Whether a call would issue now: not stopped, and some machine id holds a grant whose
   * deadline has not passed with the clock inside its (floor, fence] and the layout (reads the
   * clocks; a pinned machine id counts too).
   *
   * @return true when ids can be issued now
   */
  public boolean isReady() {
    if (keeper.reason() != null) {
      return false;
    }
    for (Slot s : keeper.slots) {
      if (s.ready()) {
        return true;
      }
    }
    return false;
  }

  /**
   * Why issuance stopped for good, if it did.
   *
   * @return the reason, or null while the generator issues
   */
  public StopReason stopReason() {
    return keeper.reason();
  }

  /**
   * The machine ids held, in grant order.
   *
   * @return a copy of the machine ids
   */
  public int[] machineIds() {
    return keeper.machineIds.clone();
  }

  /**
   * The identity the machine ids are held under: the configured one, or the same with a fresh
   * nonce when start had to begin again.
   *
   * @return the requester
   */
  public Requester requester() {
    return keeper.requester;
  }

  /**
   * The namespace's layout, which ids are stamped with.
   *
   * @return the layout from the grant
   */
  public IdLayout layout() {
    return keeper.layout;
  }

  /**
   * Blocks issuance, drains every machine id, and Releases them with the last timestamp stamped
   * on each (layout ms; a machine id never used is left out and keeps its fence). Skipped when
   * issuance already stopped (the lease is gone, or was released). A failed Release is logged,
   * never thrown: the machine ids then free themselves when the lease ends. Idempotent.
   *
   * @return how many machine ids the server released (0 when skipped or failed)
   */
  public int shutdown() {
    int released = keeper.releaseAll(StopReason.SHUT_DOWN, null);
    keeper.stopTasks();
    channel.shutdown();
    return released;
  }

  /** {@link #shutdown()}, for try-with-resources. */
  @Override
  public void close() {
    shutdown();
  }
}
