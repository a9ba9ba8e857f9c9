package dev.snowkeep.conformance;

import com.google.gson.JsonObject;
import dev.snowkeep.client.IdPool;
import dev.snowkeep.client.IdStream;
import dev.snowkeep.client.SnowkeepClient;
import dev.snowkeep.client.SnowkeepException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.CancellationException;

/** The driver's longer ops: the stream and the benchmarks. */
final class Ops {
  private Ops() {}

  /** {@code stream}: every id, with progress lines and a pause after each batch. */
  static JsonObject stream(Driver d, JsonObject req) {
    long total = Driver.num(req, "total", 1L);
    int batchSize = Driver.num(req, "batch_size", 0);
    long pace = Driver.num(req, "pace_ms", 0L);
    long every = Driver.num(req, "progress_every", 0L);
    List<Long> ids = new ArrayList<>();
    try (IdStream s = d.newStream(total, batchSize)) {
      long batches = 0;
      while (s.hasNext()) {
        long[] b = s.next();
        for (long id : b) {
          ids.add(id);
        }
        batches++;
        if (every > 0 && batches % every == 0) {
          JsonObject p = new JsonObject();
          p.addProperty("received", s.received());
          p.addProperty("last_id", Long.toUnsignedString(b[b.length - 1]));
          JsonObject line = new JsonObject();
          line.add("progress", p);
          d.emit(line);
        }
        if (pace > 0) {
          pause(pace);
        }
      }
    } catch (SnowkeepException e) {
      return Driver.withIds(Driver.error(e.code().name(), e.description()), ids);
    } catch (CancellationException e) {
      return Driver.withIds(Driver.error("CANCELLED", String.valueOf(e.getMessage())), ids);
    }
    return Driver.ids(ids);
  }

  private static void pause(long ms) {
    try {
      Thread.sleep(ms);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new CancellationException("interrupted");
    }
  }

  /** {@code bench_stream}: ids counted, not returned, and the seconds taken. */
  static JsonObject benchStream(SnowkeepClient c, JsonObject req) {
    long total = Driver.num(req, "total", 1L);
    int batchSize = Driver.num(req, "batch_size", 0);
    long start = System.nanoTime();
    long n = 0;
    try (IdStream s = c.stream(total, batchSize)) {
      while (s.hasNext()) {
        n += s.next().length;
      }
    }
    JsonObject o = Driver.ok();
    o.addProperty("ids", n);
    o.addProperty("seconds", (System.nanoTime() - start) / 1e9);
    return o;
  }

  /** {@code bench_unary}: nextIds(1) from {@code concurrency} threads for {@code seconds}. */
  static JsonObject benchUnary(SnowkeepClient c, JsonObject req) {
    int concurrency = Math.max(1, Driver.num(req, "concurrency", 1));
    long seconds = Driver.num(req, "seconds", 1L);
    long end = System.nanoTime() + seconds * 1_000_000_000L;
    List<long[]> perThread = new ArrayList<>();
    List<Thread> threads = new ArrayList<>();
    SnowkeepException[] failure = new SnowkeepException[1];
    for (int t = 0; t < concurrency; t++) {
      long[][] slot = {new long[1024]};
      int[] count = {0};
      Thread th = new Thread(() -> {
        while (System.nanoTime() < end) {
          long s = System.nanoTime();
          try {
            c.nextIds(1);
          } catch (SnowkeepException e) {
            synchronized (failure) {
              failure[0] = e;
            }
            break;
          }
          if (count[0] == slot[0].length) {
            slot[0] = Arrays.copyOf(slot[0], count[0] * 2);
          }
          slot[0][count[0]++] = System.nanoTime() - s;
        }
        synchronized (perThread) {
          perThread.add(Arrays.copyOf(slot[0], count[0]));
        }
      });
      threads.add(th);
      th.start();
    }
    for (Thread th : threads) {
      join(th);
    }
    if (failure[0] != null) {
      throw failure[0];
    }
    long[] all = perThread.stream().flatMapToLong(Arrays::stream).sorted().toArray();
    JsonObject o = Driver.ok();
    o.addProperty("calls", all.length);
    o.addProperty("p50_ms", quantile(all, 0.50) / 1e6);
    o.addProperty("p99_ms", quantile(all, 0.99) / 1e6);
    return o;
  }

  private static double quantile(long[] sorted, double q) {
    if (sorted.length == 0) {
      return 0;
    }
    int i = (int) Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1);
    return sorted[Math.max(i, 0)];
  }

  private static void join(Thread t) {
    try {
      t.join();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new CancellationException("interrupted");
    }
  }

  /**
   * {@code bench_pool}: {@code count} ids from a pool of its own (batches of 100,000, refilled at
   * half), so that it measures {@code next()} rather than the refill round trip.
   */
  static JsonObject benchPool(SnowkeepClient c, JsonObject req) {
    long count = Driver.num(req, "count", 1L);
    try (IdPool pool = c.pool(100_000, 50_000, Duration.ofMinutes(10))) {
      pool.next();
      long start = System.nanoTime();
      long sink = 0;
      for (long i = 0; i < count; i++) {
        sink += pool.next() & 1;
      }
      long ns = System.nanoTime() - start;
      JsonObject o = Driver.ok();
      o.addProperty("ids", count + sink * 0);
      o.addProperty("ns_per_id", count == 0 ? 0 : (double) ns / count);
      return o;
    }
  }
}
