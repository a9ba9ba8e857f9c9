package dev.snowkeep.client;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.PriorityQueue;

/**
 * A hand-moved {@link LeaseTime} for tests: wall time can be set anywhere (also backwards),
 * monotonic time only advances; sleeps advance both at once and are recorded; scheduled tasks
 * run on the thread that advances the clock, each at its due time, in order.
 */
final class ManualTime implements LeaseTime {
  private record Task(long due, long seq, Runnable run, Sched owner) {}

  private final class Sched implements Scheduler {
    volatile boolean shut;

    @Override
    public void schedule(Runnable task, long delayNanos) {
      synchronized (ManualTime.this) {
        if (!shut) {
          tasks.add(new Task(mono + Math.max(0, delayNanos), seq++, task, this));
        }
      }
    }

    @Override
    public void shutdown() {
      shut = true;
    }
  }

  private final PriorityQueue<Task> tasks =
      new PriorityQueue<>((a, b) -> a.due != b.due ? Long.compare(a.due, b.due) : Long.compare(a.seq, b.seq));
  /** Every sleep, in ns, in order. */
  final List<Long> sleeps = new ArrayList<>();
  private long wallNanos;
  private long mono = 1_000_000_000L;
  private long seq;

  ManualTime(long unixMs) {
    wallNanos = unixMs * 1_000_000;
  }

  @Override
  public synchronized long unixMs() {
    return Math.floorDiv(wallNanos, 1_000_000);
  }

  @Override
  public synchronized long nanoTime() {
    return mono;
  }

  /** Steps the wall clock (monotonic time is untouched). */
  synchronized void setUnixMs(long unixMs) {
    wallNanos = unixMs * 1_000_000;
  }

  @Override
  public void sleepNanos(long nanos) {
    synchronized (this) {
      sleeps.add(nanos);
    }
    advanceNanos(nanos);
  }

  @Override
  public Scheduler newScheduler() {
    return new Sched();
  }

  void advance(Duration d) {
    advanceNanos(d.toNanos());
  }

  /** Advances both clocks by {@code nanos}, running each task due on the way at its time. */
  void advanceNanos(long nanos) {
    long end;
    synchronized (this) {
      end = mono + nanos;
    }
    for (;;) {
      Task t;
      synchronized (this) {
        t = tasks.peek();
        if (t == null || t.due > end) {
          wallNanos += end - mono;
          mono = end;
          return;
        }
        tasks.poll();
        wallNanos += t.due - mono;
        mono = t.due;
      }
      if (!t.owner.shut) {
        t.run.run();
      }
    }
  }

  /** Runs the tasks due now. */
  void runDue() {
    advanceNanos(0);
  }

  /** The due times of pending tasks, ns from now. */
  synchronized List<Long> pending() {
    List<Long> out = new ArrayList<>();
    for (Task t : tasks) {
      if (!t.owner.shut) {
        out.add(t.due - mono);
      }
    }
    out.sort(Long::compare);
    return out;
  }
}
