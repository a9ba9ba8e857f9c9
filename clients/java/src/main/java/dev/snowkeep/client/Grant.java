package dev.snowkeep.client;

/**
 * The right to stamp ids under one machine id, as a renewal published it: stamp only layout
 * timestamps in (floorMs, fenceMs], and only while the monotonic clock is before {@code
 * deadlineNanos}. Immutable; each publication is a new object, so "the same grant" is one
 * reference comparison.
 *
 * @param machineId the machine id
 * @param floorMs the previous holders' fence, layout ms (exclusive lower bound)
 * @param fenceMs the persisted fence, layout ms (inclusive upper bound)
 * @param deadlineNanos the local lease deadline on {@link LeaseTime#nanoTime()}
 */
record Grant(int machineId, long floorMs, long fenceMs, long deadlineNanos) {}
