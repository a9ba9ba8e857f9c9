package dev.snowkeep.client;

import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.LockSupport;

/**
 * Where the embedded generator reads time, sleeps, and schedules its lease work: the system's
 * clocks in production ({@link #SYSTEM}), a hand-moved clock in tests, so that no test sleeps
 * for a condition. Two clocks matter (docs/design.md, the safety invariant): the wall clock,
 * which ids stamp and which may jump, and the monotonic clock, which measures lease deadlines and
 * never does.
 */
interface LeaseTime {
  /** Wall time, ms since the Unix epoch (may step backwards). */
  long unixMs();

  /** Monotonic time in ns from an arbitrary origin; compare only differences. */
  long nanoTime();

  /** Sleeps {@code nanos} (a generator waiting for the next tick, Acquire's backoff). */
  void sleepNanos(long nanos) throws InterruptedException;

  /** A scheduler for one generator's renew and check tasks. */
  Scheduler newScheduler();

  /** Runs tasks later, one at a time. */
  interface Scheduler {
    /** Runs {@code task} after {@code delayNanos} (at once for 0 or less); ignored after shutdown. */
    void schedule(Runnable task, long delayNanos);

    /** Runs nothing more; a task running now finishes. */
    void shutdown();
  }

  /** The system's clocks with the wall time read from {@code wall} instead. */
  static LeaseTime withWallClock(java.time.Clock wall) {
    return new LeaseTime() {
      @Override
      public long unixMs() {
        return wall.millis();
      }

      @Override
      public long nanoTime() {
        return System.nanoTime();
      }

      @Override
      public void sleepNanos(long nanos) throws InterruptedException {
        SYSTEM.sleepNanos(nanos);
      }

      @Override
      public Scheduler newScheduler() {
        return SYSTEM.newScheduler();
      }
    };
  }

  /** The system's clocks: {@link System#currentTimeMillis()} and {@link System#nanoTime()}. */
  LeaseTime SYSTEM = new LeaseTime() {
    @Override
    public long unixMs() {
      return System.currentTimeMillis();
    }

    @Override
    public long nanoTime() {
      return System.nanoTime();
    }

    @Override
    public void sleepNanos(long nanos) throws InterruptedException {
      long end = System.nanoTime() + nanos;
      for (long left = nanos; left > 0; left = end - System.nanoTime()) {
        LockSupport.parkNanos(left);
        if (Thread.interrupted()) {
          throw new InterruptedException();
        }
      }
    }

    @Override
    public Scheduler newScheduler() {
      ScheduledThreadPoolExecutor ex =
          new ScheduledThreadPoolExecutor(
              1,
              r -> {
                Thread t = new Thread(r, "snowkeep-lease");
                t.setDaemon(true);
                return t;
              });
      ex.setExecuteExistingDelayedTasksAfterShutdownPolicy(false);
      return new Scheduler() {
        @Override
        public void schedule(Runnable task, long delayNanos) {
          try {
            ex.schedule(task, Math.max(0, delayNanos), TimeUnit.NANOSECONDS);
          } catch (java.util.concurrent.RejectedExecutionException e) {
            // Shut down: nothing more runs.
          }
        }

        @Override
        public void shutdown() {
          ex.shutdown();
        }
      };
    }
  };
}
