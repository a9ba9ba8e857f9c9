package dev.snowkeep.bench;

import dev.snowkeep.client.EmbeddedGenerator;
import dev.snowkeep.client.Spread;
import dev.snowkeep.client.Worker;
import java.util.concurrent.TimeUnit;
import me.ahoo.cosid.snowflake.MillisecondSnowflakeId;
import org.openjdk.jmh.annotations.Benchmark;
import org.openjdk.jmh.annotations.BenchmarkMode;
import org.openjdk.jmh.annotations.Fork;
import org.openjdk.jmh.annotations.Level;
import org.openjdk.jmh.annotations.Measurement;
import org.openjdk.jmh.annotations.Mode;
import org.openjdk.jmh.annotations.OutputTimeUnit;
import org.openjdk.jmh.annotations.Param;
import org.openjdk.jmh.annotations.Scope;
import org.openjdk.jmh.annotations.Setup;
import org.openjdk.jmh.annotations.State;
import org.openjdk.jmh.annotations.TearDown;
import org.openjdk.jmh.annotations.Warmup;

/**
 * {@code nextId()} of the embedded generator under each spread, beside a plain synchronized
 * snowflake and CosId's {@code MillisecondSnowflakeId}, all on the same 41/2/20 layout (see
 * {@link LeaseDouble#LAYOUT}). Average time per id; run with {@code -t 2} for two threads.
 */
@BenchmarkMode(Mode.AverageTime)
@OutputTimeUnit(TimeUnit.NANOSECONDS)
@Warmup(iterations = 3, time = 1)
@Measurement(iterations = 5, time = 1)
@Fork(1)
public class GeneratorBench {
  /** A started embedded generator on the loopback lease double. */
  @State(Scope.Benchmark)
  public static class Embedded {
    /** Machine ids held (the layout has 4). */
    @Param("2")
    public int machineIds;

    LeaseDouble lease;
    EmbeddedGenerator roundRobin;
    EmbeddedGenerator byThread;
    EmbeddedGenerator pinned;

    @Setup(Level.Trial)
    public void start() throws Exception {
      lease = new LeaseDouble();
      roundRobin = start(Spread.ROUND_ROBIN);
      byThread = start(Spread.BY_THREAD);
      pinned = start(Spread.ROUND_ROBIN);
    }

    private EmbeddedGenerator start(Spread spread) {
      return EmbeddedGenerator.builder().endpoint(lease.url()).namespace("bench")
          .machineIds(machineIds).spread(spread).start();
    }

    @TearDown(Level.Trial)
    public void stop() throws Exception {
      roundRobin.close();
      byThread.close();
      pinned.close();
      lease.close();
    }
  }

  /** A worker pinned by the benchmark thread itself (JMH runs this setup on that thread). */
  @State(Scope.Thread)
  public static class Pinned {
    Worker worker;

    @Setup(Level.Trial)
    public void pin(Embedded e) {
      worker = e.pinned.pin();
    }

    @TearDown(Level.Trial)
    public void unpin() {
      worker.close();
    }
  }

  /** The textbook snowflake: one lock, one wall-clock read per id, spin to the next ms. */
  @State(Scope.Benchmark)
  public static class Plain {
    private static final int SEQUENCE_BITS = 20;
    private static final long MAX_SEQUENCE = (1L << SEQUENCE_BITS) - 1;
    private final long machine = 1L << SEQUENCE_BITS;
    private long lastMs = -1;
    private long sequence;

    /** The next id: timestamp, machine id 1, sequence, 41/2/20. */
    public synchronized long nextId() {
      long now = System.currentTimeMillis() - LeaseDouble.EPOCH;
      if (now < lastMs) {
        throw new IllegalStateException("clock moved back");
      }
      if (now == lastMs) {
        sequence = (sequence + 1) & MAX_SEQUENCE;
        if (sequence == 0) {
          while (now <= lastMs) {
            now = System.currentTimeMillis() - LeaseDouble.EPOCH;
          }
        }
      } else {
        sequence = 0;
      }
      lastMs = now;
      return (now << 22) | machine | sequence;
    }
  }

  /** CosId's millisecond snowflake on the same bits, machine id 1. */
  @State(Scope.Benchmark)
  public static class Cosid {
    final MillisecondSnowflakeId id = new MillisecondSnowflakeId(LeaseDouble.EPOCH, 41, 2, 20, 1);
  }

  @Benchmark
  public long embeddedRoundRobin(Embedded e) {
    return e.roundRobin.nextId();
  }

  @Benchmark
  public long embeddedByThread(Embedded e) {
    return e.byThread.nextId();
  }

  @Benchmark
  public long embeddedPinned(Pinned p) {
    return p.worker.nextId();
  }

  @Benchmark
  public long synchronizedSnowflake(Plain p) {
    return p.nextId();
  }

  @Benchmark
  public long cosid(Cosid c) {
    return c.id.generate();
  }
}
