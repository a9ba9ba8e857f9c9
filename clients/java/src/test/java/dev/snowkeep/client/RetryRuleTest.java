package dev.snowkeep.client;

import static org.junit.jupiter.api.Assertions.assertEquals;

import io.grpc.Status;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.junit.jupiter.api.Test;

class RetryRuleTest {
  private static final long MS = TimeUnit.MILLISECONDS.toNanos(1);
  private final AtomicLong now = new AtomicLong(1_000_000 * MS);

  private Endpoints endpoints(int n) {
    List<Endpoint> list = new java.util.ArrayList<>();
    for (int i = 0; i < n; i++) {
      list.add(Endpoint.parse("127.0.0.1:" + (1000 + i), false));
    }
    return new Endpoints(list, 20 * MS, 1000 * MS, now::get);
  }

  private RetryState state(Endpoints e, double random, long budgetMs) {
    return new RetryState(e, new Settings(5000 * MS, budgetMs * MS, 20 * MS, 1000 * MS), now::get,
        () -> random);
  }

  @Test
  void backoffDoublesAfterEachFullRoundUpToMax() {
    Endpoints e = endpoints(2);
    RetryState r = state(e, 0.5, 1_000_000);
    long[] want = {20, 40, 80, 160, 320, 640, 1000, 1000};
    for (long w : want) {
      assertEquals(0, r.failed(r.pick(), Status.UNAVAILABLE));
      assertEquals(w * MS, r.failed(r.pick(), Status.UNAVAILABLE));
    }
  }

  @Test
  void jitterScalesEachSleepBetween80And120Percent() {
    RetryState low = state(endpoints(1), 0.0, 10_000);
    assertEquals(16 * MS, low.failed(low.pick(), Status.UNAVAILABLE));
    RetryState high = state(endpoints(1), 1.0, 10_000);
    assertEquals(24 * MS, high.failed(high.pick(), Status.UNAVAILABLE));
  }

  @Test
  void noSleepEndsAfterTheBudget() {
    RetryState r = state(endpoints(1), 0.5, 30);
    assertEquals(20 * MS, r.failed(r.pick(), Status.UNAVAILABLE));
    now.addAndGet(20 * MS);
    assertEquals(10 * MS, r.attemptTimeout());
    assertEquals(-1, r.failed(r.pick(), Status.UNAVAILABLE.withDescription("last")));
    assertEquals("last", r.lastError().description());
  }

  @Test
  void aDeadlineCutShortByTheBudgetKeepsTheErrorBeforeIt() {
    RetryState r = state(endpoints(1), 0.5, 30);
    assertEquals(20 * MS, r.failed(r.pick(), Status.UNAVAILABLE.withDescription("down")));
    now.addAndGet(20 * MS);
    assertEquals(10 * MS, r.attemptTimeout());
    now.addAndGet(10 * MS);
    assertEquals(-1, r.failed(r.pick(), Status.DEADLINE_EXCEEDED));
    assertEquals(Status.Code.UNAVAILABLE, r.lastError().code());
    assertEquals("down", r.lastError().description());
  }

  @Test
  void aBatchForgetsTheFailuresBeforeIt() {
    RetryState r = state(endpoints(1), 0.5, 30);
    assertEquals(20 * MS, r.failed(r.pick(), Status.UNAVAILABLE.withDescription("down")));
    now.addAndGet(20 * MS);
    r.pick();
    r.restart(); // a batch arrived
    now.addAndGet(20 * MS);
    assertEquals(10 * MS, r.attemptTimeout());
    now.addAndGet(10 * MS);
    assertEquals(-1, r.failed(r.pick(), Status.DEADLINE_EXCEEDED.withDescription("stalled")));
    assertEquals(Status.Code.DEADLINE_EXCEEDED, r.lastError().code());
    assertEquals("stalled", r.lastError().description());
  }

  @Test
  void ejectionDoublesPerConsecutiveFailureAndASuccessClearsIt() {
    Endpoints e = endpoints(2);
    boolean[] none = new boolean[2];
    e.failed(0);
    assertEquals(1, e.pick(none));
    assertEquals(1, e.pick(none));
    now.addAndGet(20 * MS);
    assertEquals(0, e.pick(none));
    e.failed(0);
    now.addAndGet(39 * MS);
    assertEquals(1, e.pick(none));
    assertEquals(1, e.pick(none));
    now.addAndGet(1 * MS);
    assertEquals(0, e.pick(none));
    for (int k = 0; k < 10; k++) {
      e.failed(0);
    }
    now.addAndGet(999 * MS);
    assertEquals(1, e.pick(none));
    now.addAndGet(1 * MS);
    assertEquals(0, e.pick(none));
    e.failed(0);
    e.succeeded(0);
    assertEquals(1, e.pick(none));
    assertEquals(0, e.pick(none));
  }

  @Test
  void whenEveryEndpointIsEjectedTheOneEndingFirstIsTried() {
    Endpoints e = endpoints(3);
    e.failed(1);
    now.addAndGet(5 * MS);
    e.failed(2);
    e.failed(0);
    e.failed(0);
    assertEquals(1, e.pick(new boolean[3]));
    assertEquals(2, e.pick(new boolean[] {false, true, false}));
  }

  @Test
  void aRoundTriesEachEndpointOnceBeforeSleeping() {
    Endpoints e = endpoints(3);
    RetryState r = state(e, 0.5, 10_000);
    int a = r.pick();
    assertEquals(0, r.failed(a, Status.UNAVAILABLE));
    int b = r.pick();
    assertEquals(0, r.failed(b, Status.UNAVAILABLE));
    int c = r.pick();
    assertEquals(20 * MS, r.failed(c, Status.UNAVAILABLE));
    assertEquals(3, java.util.Set.of(a, b, c).size());
  }
}
