package dev.snowkeep.client;

import io.grpc.Status;

/**
 * One machine id pinned to one thread ({@link EmbeddedGenerator#pin()}): IdKeeper's 1:1 spread.
 * Its fast path (an id inside the open window of a wall-clock reading) takes no lock and writes
 * no shared memory: one {@link System#nanoTime()} and one volatile read of the grant per id.
 * Every rule of the generator still holds (floor, fence, deadline, stop).
 *
 * <p><b>Not thread-safe.</b> Only the thread that called {@code pin()} may use it; any other
 * thread gets {@link SnowkeepException} {@code FAILED_PRECONDITION}. Close it to give the
 * machine id back to the generator's shared pool; after the generator stops, calls throw {@link
 * GeneratorStoppedException}.
 */
public final class Worker implements AutoCloseable {
  private final EmbeddedGenerator owner;
  private final Slot slot;
  private final int machineId;
  private final Thread thread;
  private boolean closed;

  Worker(EmbeddedGenerator owner, Slot slot, int machineId, Thread thread) {
    this.owner = owner;
    this.slot = slot;
    this.machineId = machineId;
    this.thread = thread;
  }

  /**
   * One id from the pinned machine id, waiting (like {@link EmbeddedGenerator#nextId()}) for
   * the next tick when its sequence is used up.
   *
   * @return an id in [0, 2^63 − 1], above every id this machine id issued before
   * @throws GeneratorStoppedException once issuance stopped for good
   * @throws IdGenerationException when the machine id cannot issue now
   * @throws SnowkeepException {@code FAILED_PRECONDITION} from another thread or after close
   */
  public long nextId() {
    check();
    for (;;) {
      long id = slot.take(1);
      if (id >= 0) {
        return id;
      }
      EmbeddedGenerator.sleep(owner.time(), slot.waitNanos);
    }
  }

  /**
   * {@code count} strictly ascending ids from the pinned machine id.
   *
   * @param count how many, at least 1
   * @return the ids
   * @throws SnowkeepException {@code INVALID_ARGUMENT} naming {@code count} below 1; otherwise as
   *     {@link #nextId()}
   */
  public long[] nextIds(int count) {
    if (count < 1) {
      throw SnowkeepException.invalid("count", count + " is below 1");
    }
    check();
    long[] out = new long[count];
    int filled = 0;
    while (filled < count) {
      long first = slot.take(count - filled);
      if (first < 0) {
        EmbeddedGenerator.sleep(owner.time(), slot.waitNanos);
        continue;
      }
      for (long k = 0, n = slot.taken; k < n; k++) {
        out[filled++] = first + k;
      }
    }
    return out;
  }

  /**
   * The machine id this worker stamps.
   *
   * @return the machine id
   */
  public int machineId() {
    return machineId;
  }

  /** Gives the machine id back to the generator's shared pool; idempotent, from the owning thread. */
  @Override
  public void close() {
    if (Thread.currentThread() != thread) {
      throw wrongThread();
    }
    if (!closed) {
      closed = true;
      owner.unpin(slot);
    }
  }

  private void check() {
    if (Thread.currentThread() != thread) {
      throw wrongThread();
    }
    if (closed) {
      throw new SnowkeepException(Status.Code.FAILED_PRECONDITION, "worker closed");
    }
  }

  private SnowkeepException wrongThread() {
    return new SnowkeepException(Status.Code.FAILED_PRECONDITION,
        "a Worker is used only by the thread that pinned it (" + thread.getName() + ")");
  }
}
