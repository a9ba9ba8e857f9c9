package dev.snowkeep.client;

import static dev.snowkeep.client.FakeLeaseServer.EPOCH;
import static dev.snowkeep.client.FakeLeaseServer.grant;
import static dev.snowkeep.client.SlotTest.DEFAULT;
import static dev.snowkeep.client.SlotTest.id;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.snowkeep.v1.LeaseGrant;
import io.grpc.Status;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Callable;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/** IdKeeper's three spreads (round robin, by thread, pinned) and batches over machine ids. */
class SpreadTest {
  static final long FENCE = 1_000_000_000L;

  final ManualTime time = new ManualTime(EPOCH + 1000);
  FakeLeaseServer server;
  EmbeddedGenerator gen;

  @AfterEach
  void stop() {
    if (gen != null) {
      gen.close();
    }
    if (server != null) {
      server.close();
    }
  }

  EmbeddedGenerator start(Spread spread, LeaseTime t, LeaseGrant grant) throws Exception {
    server = new FakeLeaseServer(t, grant);
    gen = EmbeddedGenerator.builder().endpoint(server.url()).namespace("ns")
        .machineIds(grant.getMachineIdsCount()).spread(spread).checkInterval(Duration.ZERO)
        .time(t).start();
    return gen;
  }

  EmbeddedGenerator start(Spread spread, int... ids) throws Exception {
    return start(spread, time, grant(600_000, 0, FENCE, ids));
  }

  static long machine(long id) {
    return DEFAULT.decode(id).machineId();
  }

  @Test
  void roundRobinTakesTheMachineIdsInTurn() throws Exception {
    start(Spread.ROUND_ROBIN, 3, 9);
    long[] got = new long[4];
    for (int i = 0; i < 4; i++) {
      got[i] = gen.nextId();
    }
    assertEquals(List.of(id(1000, 3, 0), id(1000, 9, 0), id(1000, 3, 1), id(1000, 9, 1)),
        Arrays.stream(got).boxed().toList());
  }

  @Test
  void roundRobinSkipsAMachineIdThatCannotIssue() throws Exception {
    LeaseGrant g = grant(600_000, 0, FENCE, 3, 9).toBuilder()
        .setMachineIds(0, grant(600_000, 5000, FENCE, 3).getMachineIds(0)).build();
    // Start waits for the highest floor; step the wall clock back under machine 3's floor after.
    start(Spread.ROUND_ROBIN, time, g);
    time.setUnixMs(EPOCH + 4000);
    time.advance(Duration.ofMillis(2));
    assertEquals(9, machine(gen.nextId()));
    assertEquals(9, machine(gen.nextId()));
  }

  @Test
  void aSmallBatchSkipsAMachineIdThatCannotIssueAndByKeyPicksKeyModN() throws Exception {
    LeaseGrant g = grant(600_000, 0, FENCE, 3, 9).toBuilder()
        .setMachineIds(0, grant(600_000, 5000, FENCE, 3).getMachineIds(0)).build();
    start(Spread.ROUND_ROBIN, time, g);
    time.setUnixMs(EPOCH + 4000); // below machine id 3's floor, and nothing stamped on 9 yet
    time.advance(Duration.ofMillis(2));
    for (int i = 0; i < 3; i++) {
      assertEquals(9, machine(gen.nextIds(10)[0]));
    }
    assertEquals(9, machine(gen.nextIdFor(-2)), "key -2 is machine id 3, which cannot issue now");
    assertEquals(9, machine(gen.nextIdFor(7)));
    time.setUnixMs(EPOCH + 5002);
    time.advance(Duration.ofMillis(1));
    assertEquals(3, machine(gen.nextIdFor(-2)));
    assertEquals(9, machine(gen.nextIdFor(7)));
    assertTrue(gen.isReady());
  }

  @Test
  void byThreadGoesToThreadIdModN() throws Exception {
    start(Spread.BY_THREAD, 3, 9);
    int[] ids = {3, 9};
    long mine = ids[(int) (Thread.currentThread().getId() % 2)];
    for (int i = 0; i < 3; i++) {
      assertEquals(mine, machine(gen.nextId()));
    }
    assertEquals(mine, machine(gen.nextIds(10)[9]));
    Thread other = null;
    AtomicReference<Long> seen = new AtomicReference<>();
    for (int i = 0; i < 4 && other == null; i++) {
      Thread t = new Thread(() -> seen.set(machine(gen.nextId())));
      if (t.getId() % 2 != Thread.currentThread().getId() % 2) {
        other = t;
      }
    }
    other.start();
    other.join();
    assertEquals(ids[(int) (other.getId() % 2)], seen.get());
    assertTrue(seen.get() != mine);
  }

  @Test
  void aPinnedWorkerOwnsItsMachineIdUntilClosed() throws Exception {
    start(Spread.ROUND_ROBIN, 3, 9);
    Worker w = gen.pin();
    assertEquals(3, w.machineId());
    assertEquals(id(1000, 3, 0), w.nextId());
    assertEquals(id(1000, 3, 1), w.nextId());
    assertEquals(List.of(id(1000, 3, 2), id(1000, 3, 3)), Arrays.stream(w.nextIds(2)).boxed().toList());
    // The shared pool is 9 alone now.
    assertEquals(9, machine(gen.nextId()));
    assertEquals(9, machine(gen.nextId()));
    Worker w2 = gen.pin();
    assertEquals(9, w2.machineId());
    SnowkeepException e = assertThrows(SnowkeepException.class, gen::nextId);
    assertEquals(Status.Code.FAILED_PRECONDITION, e.code());
    assertEquals(Status.Code.FAILED_PRECONDITION, assertThrows(SnowkeepException.class, gen::pin).code());
    // Only the pinning thread may use a worker.
    AtomicReference<Throwable> other = new AtomicReference<>();
    Thread t = new Thread(() -> other.set(assertThrows(SnowkeepException.class, w::nextId)));
    t.start();
    t.join();
    assertEquals(Status.Code.FAILED_PRECONDITION, ((SnowkeepException) other.get()).code());
    w.close();
    assertEquals(Status.Code.FAILED_PRECONDITION, assertThrows(SnowkeepException.class, w::nextId).code());
    assertEquals(id(1000, 3, 4), gen.nextId(), "back in the pool, the machine id goes on where the worker left it");
    w2.close();
  }

  @Test
  void aPinnedWorkerStopsWithTheGenerator() throws Exception {
    start(Spread.ROUND_ROBIN, 3);
    Worker w = gen.pin();
    w.nextId();
    server.renewScript.add(grant(600_000, 0, FENCE));
    time.runDue();
    // Its window is still open, but the grant it was opened under is withdrawn.
    assertEquals(StopReason.LEASE_GONE, assertThrows(GeneratorStoppedException.class, w::nextId).reason());
  }

  /** The slot a worker stamps from (its lock is the one drain takes). */
  static Slot slotOf(Worker w) throws ReflectiveOperationException {
    java.lang.reflect.Field f = Worker.class.getDeclaredField("slot");
    f.setAccessible(true);
    return (Slot) f.get(w);
  }

  /** Waits until {@code t} is blocked entering the monitor of {@code lock}. */
  static void awaitBlockedOn(Thread t, Object lock) throws InterruptedException {
    long end = System.nanoTime() + 10_000_000_000L;
    for (;;) {
      java.lang.management.ThreadInfo info =
          java.lang.management.ManagementFactory.getThreadMXBean().getThreadInfo(t.getId());
      if (info != null && info.getThreadState() == Thread.State.BLOCKED && info.getLockInfo() != null
          && info.getLockInfo().getIdentityHashCode() == System.identityHashCode(lock)) {
        return;
      }
      assertTrue(System.nanoTime() < end, "the worker never reached the slot's lock");
      Thread.sleep(1);
    }
  }

  @Test
  void aPinnedWorkerThatReadTheGrantBeforeCloseStampsNothingAfterTheRelease() throws Exception {
    start(Spread.ROUND_ROBIN, 3);
    AtomicReference<Worker> worker = new AtomicReference<>();
    AtomicReference<Object> after = new AtomicReference<>();
    java.util.concurrent.CountDownLatch first = new java.util.concurrent.CountDownLatch(1);
    java.util.concurrent.CountDownLatch go = new java.util.concurrent.CountDownLatch(1);
    Thread t = new Thread(() -> {
      Worker w = gen.pin();
      w.nextId(); // stamps 1000
      worker.set(w);
      first.countDown();
      try {
        go.await();
        after.set(w.nextId());
      } catch (RuntimeException | InterruptedException e) {
        after.set(e);
      }
    });
    t.start();
    first.await();
    time.advance(Duration.ofMillis(2)); // wall 1002: the window of 1000 is over
    Slot slot = slotOf(worker.get());
    synchronized (slot) {
      // The worker reads the grant (still published), then waits for the lock its reading takes.
      go.countDown();
      awaitBlockedOn(t, slot);
      assertEquals(1, gen.shutdown());
    }
    t.join();
    assertEquals(Map.of(3, 1000L), server.releases.get(0).getLastUsedMsMap());
    Object got = after.get();
    if (got instanceof Long id) {
      throw new AssertionError("stamped " + (DEFAULT.decode(id).unixMs() - EPOCH)
          + " ms after close released machine id 3 with last_used 1000 ms: its next holder may stamp it too");
    }
    assertEquals(StopReason.SHUT_DOWN, ((GeneratorStoppedException) got).reason());
  }

  @Test
  void aBatchLargerThanATickIsSpreadOverTheMachineIdsAndStrictlyAscending() throws Exception {
    start(Spread.ROUND_ROBIN, 3, 9);
    long[] ids = gen.nextIds(3000);
    for (int i = 1; i < ids.length; i++) {
      assertTrue(ids[i - 1] < ids[i], "strictly ascending at " + i);
    }
    assertEquals(id(1000, 3, 0), ids[0]);
    assertEquals(id(1000, 9, 0), ids[1024]);
    assertEquals(id(1001, 3, 0), ids[2048]);
    assertEquals(id(1001, 9, 475), ids[2999]);
    assertEquals(1500, Arrays.stream(ids).filter(x -> machine(x) == 3).count());
  }

  @Test
  void aBatchFromOneMachineIdWaitsForTheNextTick() throws Exception {
    start(Spread.ROUND_ROBIN, 3);
    long[] ids = gen.nextIds(1500);
    assertEquals(id(1000, 3, 1023), ids[1023]);
    assertEquals(id(1001, 3, 0), ids[1024]);
    assertEquals(id(1001, 3, 475), ids[1499]);
  }

  @Test
  void threadsOfEverySpreadOnTheRealClockNeverShareAnIdAndReleaseCoversThemAll() throws Exception {
    long now = System.currentTimeMillis() - EPOCH;
    start(Spread.ROUND_ROBIN, LeaseTime.SYSTEM, grant(600_000, 0, now + 600_000, 1, 2, 3, 4));
    ExecutorService pool = Executors.newFixedThreadPool(4);
    List<Callable<long[]>> jobs = new ArrayList<>();
    jobs.add(() -> {
      try (Worker w = gen.pin()) {
        long[] out = new long[40_000];
        for (int i = 0; i < out.length; i++) {
          out[i] = w.nextId();
        }
        return out;
      }
    });
    for (int k = 0; k < 2; k++) {
      jobs.add(() -> {
        long[] out = new long[40_000];
        for (int i = 0; i < out.length; i++) {
          out[i] = gen.nextId();
        }
        return out;
      });
    }
    jobs.add(() -> {
      long[] out = new long[40_000];
      for (int i = 0; i < out.length; i += 2000) {
        long[] batch = gen.nextIds(2000);
        for (int j = 1; j < batch.length; j++) {
          assertTrue(batch[j - 1] < batch[j]);
        }
        System.arraycopy(batch, 0, out, i, 2000);
      }
      return out;
    });
    List<long[]> results = new ArrayList<>();
    for (Future<long[]> f : pool.invokeAll(jobs)) {
      results.add(f.get());
    }
    pool.shutdown();
    long[] all = results.stream().flatMapToLong(Arrays::stream).sorted().toArray();
    assertEquals(160_000, all.length);
    Map<Long, Long> lastTs = new HashMap<>();
    for (int i = 0; i < all.length; i++) {
      assertTrue(all[i] >= 0);
      assertTrue(i == 0 || all[i - 1] < all[i], "a duplicate id: " + all[i]);
      DecodedId d = DEFAULT.decode(all[i]);
      lastTs.merge(d.machineId(), d.unixMs() - EPOCH, Math::max);
    }
    gen.shutdown();
    Map<Integer, Long> released = server.releases.get(0).getLastUsedMsMap();
    for (Map.Entry<Long, Long> e : lastTs.entrySet()) {
      assertEquals(e.getValue(), released.get((int) (long) e.getKey()),
          "the release reports the last timestamp stamped on machine id " + e.getKey());
    }
  }

  @Test
  void closeWhileThreadsIssueReportsATimestampAtOrAboveEveryIdIssued() throws Exception {
    long now = System.currentTimeMillis() - EPOCH;
    start(Spread.ROUND_ROBIN, LeaseTime.SYSTEM, grant(600_000, 0, now + 600_000, 1, 2, 3));
    java.util.concurrent.CountDownLatch running = new java.util.concurrent.CountDownLatch(3);
    List<Callable<List<Long>>> jobs = new ArrayList<>();
    for (int k = 0; k < 3; k++) {
      boolean pinned = k < 2;
      jobs.add(() -> {
        List<Long> out = new ArrayList<>();
        Worker w = pinned ? gen.pin() : null;
        running.countDown();
        try {
          for (;;) {
            out.add(pinned ? w.nextId() : gen.nextId());
          }
        } catch (GeneratorStoppedException e) {
          assertEquals(StopReason.SHUT_DOWN, e.reason());
          return out;
        }
      });
    }
    ExecutorService pool = Executors.newFixedThreadPool(3);
    List<Future<List<Long>>> futures = new ArrayList<>();
    for (Callable<List<Long>> j : jobs) {
      futures.add(pool.submit(j));
    }
    running.await();
    Thread.sleep(50);
    assertEquals(3, gen.shutdown());
    List<Long> all = new ArrayList<>();
    for (Future<List<Long>> f : futures) {
      all.addAll(f.get());
    }
    pool.shutdown();
    assertEquals(all.size(), all.stream().distinct().count(), "no id twice");
    Map<Integer, Long> released = server.releases.get(0).getLastUsedMsMap();
    for (long id : all) {
      DecodedId d = DEFAULT.decode(id);
      assertTrue(d.unixMs() - EPOCH <= released.get((int) d.machineId()),
          "an id stamped after the reported last timestamp: the next holder could stamp it");
    }
  }
}
