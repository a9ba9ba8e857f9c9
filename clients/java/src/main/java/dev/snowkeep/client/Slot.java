package dev.snowkeep.client;

import java.util.function.Supplier;

/**
 * The generator of one held machine id: the per-holder sequence state and the one rule for
 * whether a holder may stamp now, ported from the Rust generator ({@code
 * client/src/generator/sequence.rs}, {@code admit}). Package-private.
 *
 * <h2>The invariant it keeps (docs/design.md, the safety invariant)</h2>
 *
 * <ol>
 *   <li>It stamps {@code t} only under a published grant, with {@code t <= fence} and the
 *       monotonic clock before the grant's deadline.
 *   <li>It stamps only {@code tickStart(t) > floor}, the previous holders' fence.
 *   <li>Within one holder timestamps never go back: a backwards step of at most {@code
 *       maxBackwardWait} is waited out, a larger one refused.
 * </ol>
 *
 * <h2>One clock read per id</h2>
 *
 * A step that reads the wall clock checks every rule and, when it issues, opens a window in which
 * later ids are stamped at the same timestamp after one {@link LeaseTime#nanoTime()} reading
 * each, while the grant is the same object (one volatile load). The window ends 1 ms after the
 * monotonic reading taken before the wall reading, and never later than the grant's deadline on
 * the same monotonic clock; it also ends when the tick's sequence is used up. A stamp it admits
 * stays above the floor and at or below the fence; the deadline is checked on every id.
 *
 * <h2>Locking</h2>
 *
 * A shared slot ({@link Spread}) is used under {@code synchronized (slot)}. A slot pinned to a
 * {@link Worker} is used by its one thread without the lock on the window path; its
 * wall-clock steps take the lock. Drain takes the lock after the grant was withdrawn: from then
 * on, a shared slot stamps nothing; a pinned one at most finishes its open window, at the
 * timestamp drain reported (so the next holder, whose floor is at or above it, never stamps it),
 * and only if its worker read the grant before it was withdrawn.
 */
final class Slot extends SlotPadding {
  /** {@link #take}: the tick's sequence is used up; wait {@link #waitNanos}. */
  static final long WAIT = -1;

  /** A grant never published: the window's grant while it is closed. */
  private static final Grant CLOSED = new Grant(-1, 0, 0, 0);
  /** How long one wall-clock reading is stamped from, on the monotonic clock. */
  private static final long WINDOW_NANOS = 1_000_000;

  final int index;
  private final LeaseTime time;
  private final long epoch;
  private final long unit;
  private final long perTick;
  private final long maxTs;
  private final long maxBackwardWaitMs;
  private final IdLayout layout;
  private final Supplier<RuntimeException> noGrant;

  /** The grant in force; null: do not issue. Written by the lease keeper only. */
  private volatile Grant grant;

  // Guarded by this, or owned by the pinning worker's thread (see the class comment).
  private Grant windowGrant = CLOSED;
  private long windowUntil;
  private long windowBase;
  private long nextSeq;
  /** The layout ms of the last wall reading. */
  private long readMs;
  private boolean hasCursor;
  private long last;
  /** How many ids the last {@link #take} returned. */
  long taken;
  /** After {@link #WAIT}: how long to wait before the next step, ns. */
  long waitNanos;
  /** True while a {@link Worker} owns the slot; guarded by this. */
  boolean pinned;

  Slot(int index, IdLayout layout, LeaseTime time, long maxBackwardWaitMs, Supplier<RuntimeException> noGrant) {
    this.index = index;
    this.layout = layout;
    this.time = time;
    this.epoch = layout.epochUnixMs();
    this.unit = layout.unitMs();
    this.perTick = layout.sequencesPerTick();
    this.maxTs = layout.maxTimestamp();
    this.maxBackwardWaitMs = maxBackwardWaitMs;
    this.noGrant = noGrant;
  }

  /** Publishes {@code g} (null withdraws the grant). */
  void publish(Grant g) {
    grant = g;
  }

  /** The grant in force, or null. */
  Grant grant() {
    return grant;
  }

  /**
   * Takes up to {@code want} consecutive ids at one timestamp: returns the first (the count is
   * then in {@link #taken}), or {@link #WAIT} (wait {@link #waitNanos} and call again). The caller
   * holds the lock or owns the slot.
   *
   * @throws IdGenerationException when a rule refuses the id now
   * @throws RuntimeException {@code noGrant}'s error when no grant is held
   */
  long take(long want) {
    long now = time.nanoTime();
    Grant g = grant;
    long seq = nextSeq;
    if (g == windowGrant && now - windowUntil < 0 && seq < perTick) {
      long count = Math.min(want, perTick - seq);
      nextSeq = seq + count;
      taken = count;
      return windowBase + seq;
    }
    return reading(want);
  }

  /**
   * {@link #take} with a wall-clock reading. The grant and the monotonic clock are read again
   * under the lock: a pinned worker reaches here without it, and a grant it read before drain
   * took the lock would otherwise admit a fresh timestamp after drain reported the last one.
   */
  private synchronized long reading(long want) {
    long now = time.nanoTime();
    Grant g = grant;
    windowGrant = CLOSED;
    if (g == null) {
      throw noGrant.get();
    }
    if (now - g.deadlineNanos() >= 0) {
      throw new IdGenerationException(IdGenerationException.Kind.LEASE_EXPIRED,
          "the machine-id lease passed its local deadline");
    }
    if (!(hasCursor && last > g.floorMs())) {
      // A fresh cursor past the floor: nothing stamped yet, or a floor at or above what we
      // stamped (someone, possibly an earlier us, may have stamped up to it).
      hasCursor = true;
      last = g.floorMs();
      nextSeq = perTick;
    }
    long stamp = admit(g, time.unixMs());
    if (stamp < 0) {
      return WAIT;
    }
    if (stamp > last) {
      last = stamp;
      nextSeq = nextSeq < perTick / 2 ? nextSeq : 0;
    } else if (nextSeq >= perTick) {
      // The wall clock reads whole ms: aim just before the next tick, then poll.
      waitNanos = Math.max(20_000, (stamp + unit - readMs - 1) * 1_000_000);
      return WAIT;
    }
    long end = now + WINDOW_NANOS;
    windowUntil = g.deadlineNanos() - end < 0 ? g.deadlineNanos() : end;
    windowBase = layout.encode(last, g.machineId(), 0);
    windowGrant = g;
    long count = Math.min(want, perTick - nextSeq);
    long first = windowBase + nextSeq;
    nextSeq += count;
    taken = count;
    return first;
  }

  /**
   * The rule for whether a holder may stamp at wall time {@code unixMs} (Rust's {@code admit},
   * after the deadline): returns the tick's first layout ms to stamp, or -1 after setting {@link
   * #waitNanos} for a small backwards step. In order: the clock at or after the epoch; the tick's
   * first ms above the floor; the clock at or below the fence, then the layout's last timestamp;
   * the tick not behind the last stamp by more than the step waited out.
   */
  private long admit(Grant g, long unixMs) {
    if (unixMs < epoch) {
      throw new IdGenerationException(IdGenerationException.Kind.CLOCK_BEFORE_EPOCH,
          "clock " + unixMs + " ms is before the layout epoch " + epoch + " ms");
    }
    long now = unixMs - epoch;
    readMs = now;
    long stamp = now - now % unit;
    if (stamp <= g.floorMs()) {
      long wait = layout.firstStampAfter(g.floorMs()) - now;
      throw new IdGenerationException(IdGenerationException.Kind.CLOCK_BEHIND_FLOOR,
          "clock is behind the machine id's floor (its previous holders' fences) by " + wait + " ms");
    }
    if (now > g.fenceMs()) {
      throw new IdGenerationException(IdGenerationException.Kind.FENCE_REACHED,
          "clock reached the persisted fence " + g.fenceMs() + " ms that has not been raised");
    }
    if (now > maxTs) {
      throw new IdGenerationException(IdGenerationException.Kind.LAYOUT_EXHAUSTED,
          "clock is past the layout's last timestamp " + maxTs + " ms");
    }
    if (stamp < last) {
      // The clock is back once a tick starts at or above the last stamp (or a kept floor).
      long back = (last + unit - 1) / unit * unit;
      long by = back - now;
      if (by <= maxBackwardWaitMs) {
        waitNanos = by * 1_000_000;
        return -1;
      }
      throw new IdGenerationException(IdGenerationException.Kind.CLOCK_STEPPED_BACK,
          "clock stepped back by " + by + " ms, more than the " + maxBackwardWaitMs + " ms waited out");
    }
    return stamp;
  }

  /** Whether the grant and the clocks admit a stamp now (the backwards-step rule aside). */
  boolean ready() {
    Grant g = grant;
    if (g == null || time.nanoTime() - g.deadlineNanos() >= 0) {
      return false;
    }
    long now = time.unixMs() - epoch;
    return now >= 0 && now - now % unit > g.floorMs() && now <= g.fenceMs() && now <= maxTs;
  }

  /**
   * Blocks issuance behind the lock and returns the last timestamp stamped (layout ms; the floor
   * when nothing was stamped since the grant), or -1 when no step ever ran. The grant must have
   * been withdrawn first (fence protocol rule 4: drain before release).
   */
  synchronized long drain() {
    return hasCursor ? last : -1;
  }
}
