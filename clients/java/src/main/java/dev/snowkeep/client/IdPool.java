package dev.snowkeep.client;

import io.grpc.Status;
import java.time.Duration;
import java.util.ArrayDeque;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.ReentrantLock;
import java.util.function.LongSupplier;

/**
 * A prefetching pool of ids: {@link #next()} hands out one id from a local buffer, and the pool
 * fetches {@code batch} ids with {@link SnowkeepClient#nextIdsAsync} in the background at its
 * start and whenever the buffer holds {@code lowWater} ids or fewer. At most one refill is in
 * flight. Ids older than {@code maxAge} (counted from their fetch) are dropped, never handed out.
 * Ids ascend within each fetched batch, not across batches (batches may come from different
 * servers). Thread-safe.
 *
 * <p>When the buffer is empty, {@link #next()} waits for the refill; when that refill fails
 * (its retry budget spent, or a non-retryable refusal), every waiter gets its {@link
 * SnowkeepException}, and the next {@code next()} starts a new refill. {@link #close()} stops
 * the refill; {@code next()} after it fails with FAILED_PRECONDITION "pool closed".
 */
public final class IdPool implements AutoCloseable {
  private final SnowkeepClient client;
  private final int batch;
  private final int lowWater;
  private final long maxAgeNanos;
  private final LongSupplier clock;
  private final ReentrantLock lock = new ReentrantLock();
  private final Condition changed = lock.newCondition();
  private final ArrayDeque<Batch> batches = new ArrayDeque<>();
  private int buffered;
  private CompletableFuture<long[]> refill;
  private long failures;
  private SnowkeepException lastError;
  private boolean closed;

  IdPool(SnowkeepClient client, int batch, int lowWater, Duration maxAge) {
    this(client, batch, lowWater, maxAge, System::nanoTime);
  }

  IdPool(SnowkeepClient client, int batch, int lowWater, Duration maxAge, LongSupplier clock) {
    if (batch < 1 || batch > SnowkeepClient.MAX_COUNT) {
      throw SnowkeepException.invalid("batch", batch + " is outside 1 to 100000");
    }
    if (lowWater < 0 || lowWater >= batch) {
      throw SnowkeepException.invalid("low_water", lowWater + " is outside 0 to batch - 1 (" + (batch - 1) + ")");
    }
    if (maxAge == null || maxAge.isNegative() || maxAge.isZero()) {
      throw SnowkeepException.invalid("max_age", maxAge + " is not a positive duration");
    }
    this.client = client;
    this.batch = batch;
    this.lowWater = lowWater;
    this.maxAgeNanos = maxAge.toNanos();
    this.clock = clock;
    lock.lock();
    try {
      maybeRefill();
    } finally {
      lock.unlock();
    }
  }

  /**
   * One id, waiting for a refill when the buffer is empty.
   *
   * @return an id in [0, 2^63 − 1], fetched less than {@code maxAge} ago
   * @throws SnowkeepException the refill's error (its retry budget spent), or
   *     FAILED_PRECONDITION "pool closed"
   * @throws CancellationException when the thread is interrupted while waiting
   */
  public long next() {
    return take(-1);
  }

  /**
   * One id, waiting at most {@code timeout} for a refill.
   *
   * @param timeout the longest wait
   * @param unit the unit of {@code timeout}
   * @return an id, as {@link #next()}
   * @throws SnowkeepException DEADLINE_EXCEEDED when no id came within the timeout, or as
   *     {@link #next()}
   */
  public long next(long timeout, TimeUnit unit) {
    return take(Math.max(unit.toNanos(timeout), 0));
  }

  /**
   * Ids buffered now (after dropping those past {@code maxAge}).
   *
   * @return the count
   */
  public int buffered() {
    lock.lock();
    try {
      dropStale();
      return buffered;
    } finally {
      lock.unlock();
    }
  }

  /** Stops the background refill and wakes every waiter with "pool closed"; idempotent. */
  @Override
  public void close() {
    CompletableFuture<long[]> inFlight;
    lock.lock();
    try {
      closed = true;
      batches.clear();
      buffered = 0;
      inFlight = refill;
      refill = null;
      changed.signalAll();
    } finally {
      lock.unlock();
    }
    if (inFlight != null) {
      inFlight.cancel(true);
    }
  }

  private long take(long timeoutNanos) {
    long deadline = clock.getAsLong() + timeoutNanos;
    lock.lock();
    try {
      long seenFailures = failures;
      while (true) {
        if (closed) {
          throw new SnowkeepException(Status.Code.FAILED_PRECONDITION, "pool closed");
        }
        dropStale();
        Batch b = batches.peekFirst();
        if (b != null) {
          long id = b.ids[b.next++];
          buffered--;
          if (b.next == b.ids.length) {
            batches.removeFirst();
          }
          maybeRefill();
          return id;
        }
        if (failures != seenFailures) {
          throw lastError;
        }
        maybeRefill();
        await(timeoutNanos < 0 ? -1 : deadline - clock.getAsLong());
      }
    } finally {
      lock.unlock();
    }
  }

  private void await(long nanos) {
    try {
      if (nanos < 0) {
        changed.await();
      } else if (nanos == 0 || changed.awaitNanos(nanos) <= 0) {
        throw new SnowkeepException(Status.Code.DEADLINE_EXCEEDED, "no id within the timeout");
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new CancellationException("interrupted while waiting for an id");
    }
  }

  private void dropStale() {
    long now = clock.getAsLong();
    while (!batches.isEmpty() && now - batches.peekFirst().fetched >= maxAgeNanos) {
      Batch old = batches.removeFirst();
      buffered -= old.ids.length - old.next;
    }
  }

  /** Starts a refill when none is in flight and the buffer is at the low-water mark. */
  private void maybeRefill() {
    if (closed || refill != null || buffered > lowWater) {
      return;
    }
    CompletableFuture<long[]> f = start();
    refill = f;
    f.whenComplete((ids, err) -> refilled(f, ids, err));
  }

  private CompletableFuture<long[]> start() {
    try {
      return client.nextIdsAsync(batch);
    } catch (SnowkeepException e) {
      return CompletableFuture.failedFuture(e);
    }
  }

  private void refilled(CompletableFuture<long[]> f, long[] ids, Throwable err) {
    lock.lock();
    try {
      if (refill != f) {
        return;
      }
      refill = null;
      if (err == null) {
        batches.addLast(new Batch(ids, clock.getAsLong()));
        buffered += ids.length;
      } else {
        Throwable cause = err instanceof java.util.concurrent.CompletionException ? err.getCause() : err;
        lastError = cause instanceof SnowkeepException
            ? (SnowkeepException) cause
            : new SnowkeepException(Status.Code.UNKNOWN, String.valueOf(cause));
        failures++;
      }
      changed.signalAll();
    } finally {
      lock.unlock();
    }
  }

  /** One fetched batch: its ids, the next one to hand out, and when it was fetched. */
  private static final class Batch {
    final long[] ids;
    final long fetched;
    int next;

    Batch(long[] ids, long fetched) {
      this.ids = ids;
      this.fetched = fetched;
    }
  }
}
