package dev.snowkeep.client;

import static dev.snowkeep.client.FakeLeaseServer.EPOCH;
import static dev.snowkeep.client.FakeLeaseServer.TOKEN;
import static dev.snowkeep.client.FakeLeaseServer.grant;
import static dev.snowkeep.client.SlotTest.id;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.snowkeep.v1.AcquireRequest;
import dev.snowkeep.v1.LeaseGrant;
import dev.snowkeep.v1.LeasedMachineId;
import dev.snowkeep.v1.ReleaseRequest;
import io.grpc.Status;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.function.DoubleSupplier;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/** Start: the Acquire request, its retry schedule, and every fail-fast rule (with its release). */
class EmbeddedStartTest {
  static final long FENCE = 1_000_000_000L;
  static final long S = TimeUnit.SECONDS.toNanos(1);

  final ManualTime time = new ManualTime(EPOCH + 1000);
  FakeLeaseServer server;

  @AfterEach
  void stop() {
    if (server != null) {
      server.close();
    }
  }

  EmbeddedGeneratorBuilder builder(LeaseGrant grant) throws Exception {
    server = new FakeLeaseServer(time, grant);
    return EmbeddedGenerator.builder().endpoint(server.url()).namespace("ns").time(time).random(() -> 0.5);
  }

  @Test
  void acquireSendsTheRequesterCountClockAndShapeSupportAndTheFirstIdIsExact() throws Exception {
    try (EmbeddedGenerator gen = builder(grant(600_000, 0, FENCE, 3)).apiKey("k1").start()) {
      AcquireRequest a = server.acquires.get(0);
      assertEquals("ns", a.getNamespace());
      assertEquals(1, a.getCount());
      assertTrue(a.getSupportsLayoutShapes());
      assertEquals(EPOCH + 1000, a.getClientTimeUnixMs());
      assertEquals("", a.getLeaseToken());
      assertEquals(ProcessHandle.current().pid(), a.getRequester().getPid());
      assertTrue(a.getRequester().getNonce().matches("[0-9a-f]{32}"));
      assertFalse(a.getRequester().getHostId().isEmpty());
      assertEquals("Bearer k1", server.authorization.get(0));
      assertEquals(id(1000, 3, 0), gen.nextId());
      assertEquals(a.getRequester().getNonce(), gen.requester().nonce());
      assertEquals(List.of(), time.sleeps);
      time.runDue(); // the first renewal
    }
    // Acquire, Renew and Release all carried the API key.
    assertEquals(List.of("Bearer k1", "Bearer k1", "Bearer k1"), server.authorization);
    assertEquals(1, server.renews.size());
    assertEquals(1, server.releases.size());
  }

  @Test
  void withoutClientTimeTheSkewFieldIsAbsent() throws Exception {
    try (EmbeddedGenerator gen = builder(grant(600_000, 0, FENCE, 3)).sendClientTime(false).start()) {
      assertFalse(server.acquires.get(0).hasClientTimeUnixMs());
      assertEquals(id(1000, 3, 0), gen.nextId());
    }
  }

  @Test
  void acquireRetriesEvery3sDoublingTo60s() throws Exception {
    EmbeddedGeneratorBuilder b = builder(grant(600_000, 0, FENCE, 3));
    for (int i = 0; i < 7; i++) {
      server.acquireScript.add(Status.UNAVAILABLE.withDescription("etcd down"));
    }
    try (EmbeddedGenerator gen = b.start()) {
      assertEquals(List.of(3 * S, 6 * S, 12 * S, 24 * S, 48 * S, 60 * S, 60 * S), time.sleeps);
      assertEquals(8, server.acquires.size());
      assertEquals(null, gen.stopReason());
      // Retries keep the identity (and so stay idempotent).
      assertEquals(1, server.acquires.stream().map(r -> r.getRequester().getNonce()).distinct().count());
    }
  }

  @Test
  void theJitterIsPlusOrMinus20Percent() throws Exception {
    for (double r : new double[] {0.0, 0.999_999}) {
      ManualTime t = new ManualTime(EPOCH + 1000);
      try (FakeLeaseServer s = new FakeLeaseServer(t, grant(600_000, 0, FENCE, 3))) {
        s.acquireScript.add(Status.RESOURCE_EXHAUSTED);
        s.acquireScript.add(Status.RESOURCE_EXHAUSTED);
        DoubleSupplier random = () -> r;
        try (EmbeddedGenerator gen = EmbeddedGenerator.builder().endpoint(s.url()).namespace("ns")
            .time(t).random(random).start()) {
          assertEquals(List.of((long) (3 * S * (0.8 + 0.4 * r)), (long) (6 * S * (0.8 + 0.4 * r))), t.sleeps);
          assertEquals(3, gen.machineIds()[0]);
        }
      }
    }
    assertEquals(2_400_000_000L, (long) (3 * S * 0.8), "the low end is 0.8 times");
  }

  @Test
  void acquireAttemptsBoundTheRetries() throws Exception {
    EmbeddedGeneratorBuilder b = builder(grant(600_000, 0, FENCE, 3)).acquireAttempts(3);
    for (int i = 0; i < 5; i++) {
      server.acquireScript.add(Status.UNAVAILABLE.withDescription("down " + i));
    }
    SnowkeepException e = assertThrows(SnowkeepException.class, b::start);
    assertEquals(Status.Code.UNAVAILABLE, e.code());
    assertEquals("down 2", e.description());
    assertEquals(List.of(3 * S, 6 * S), time.sleeps);
  }

  @Test
  void aNonRetryableCodeFailsAtOnce() throws Exception {
    EmbeddedGeneratorBuilder b = builder(grant(600_000, 0, FENCE, 3));
    server.acquireScript.add(Status.INVALID_ARGUMENT.withDescription("bad namespace"));
    SnowkeepException e = assertThrows(SnowkeepException.class, b::start);
    assertEquals(Status.Code.INVALID_ARGUMENT, e.code());
    assertEquals(List.of(), time.sleeps);
    assertEquals(1, server.acquires.size());
  }

  @Test
  void permissionDeniedStartsOverOnceAtOnceUnderANewNonce() throws Exception {
    EmbeddedGeneratorBuilder b = builder(grant(600_000, 0, FENCE, 3));
    server.acquireScript.add(Status.PERMISSION_DENIED);
    try (EmbeddedGenerator gen = b.start()) {
      assertEquals(List.of(), time.sleeps);
      String first = server.acquires.get(0).getRequester().getNonce();
      String second = server.acquires.get(1).getRequester().getNonce();
      assertNotEquals(first, second);
      assertEquals(second, gen.requester().nonce());
    }
    server.acquireScript.add(Status.PERMISSION_DENIED);
    server.acquireScript.add(Status.PERMISSION_DENIED);
    assertEquals(Status.Code.PERMISSION_DENIED, assertThrows(SnowkeepException.class, b::start).code());
  }

  /** Starts with {@code grant}, expects {@code kind}, and checks the grant was released. */
  void refused(LeaseGrant grant, int count, GrantRejectedException.Kind kind) throws Exception {
    EmbeddedGeneratorBuilder b = builder(grant).machineIds(count);
    GrantRejectedException e = assertThrows(GrantRejectedException.class, b::start);
    assertEquals(kind, e.kind());
    assertEquals(Status.Code.FAILED_PRECONDITION, e.code());
    assertEquals(1, server.releases.size(), "the grant is released before the error");
    ReleaseRequest r = server.releases.get(0);
    assertEquals(TOKEN, r.getLeaseToken());
    assertEquals(0, r.getLastUsedMsCount());
    assertEquals(server.acquires.get(0).getRequester(), r.getRequester());
    assertEquals("ns", r.getNamespace());
    server.close();
  }

  @Test
  void anInvalidLayoutIsRefusedAndReleased() throws Exception {
    LeaseGrant g = grant(600_000, 0, FENCE, 3);
    refused(g.toBuilder().setLayout(FakeLeaseServer.layout(42, 12, 10, 1)).build(), 1,
        GrantRejectedException.Kind.INVALID_LAYOUT);
    refused(g.toBuilder().setLayout(FakeLeaseServer.layout(41, 12, 10, 7)).build(), 1,
        GrantRejectedException.Kind.INVALID_LAYOUT);
    refused(g.toBuilder().clearLayout().build(), 1, GrantRejectedException.Kind.INVALID_LAYOUT);
  }

  @Test
  void aMachineIdOutsideTheMachineBitsIsRefusedAndReleased() throws Exception {
    refused(grant(600_000, 0, FENCE, 4096), 1, GrantRejectedException.Kind.MACHINE_ID_OUT_OF_RANGE);
  }

  @Test
  void anotherCountIsRefusedAndReleased() throws Exception {
    refused(grant(600_000, 0, FENCE, 3), 2, GrantRejectedException.Kind.GRANT_COUNT);
  }

  @Test
  void aMachineIdGrantedTwiceIsRefusedAndReleased() throws Exception {
    refused(grant(600_000, 0, FENCE, 3, 3), 2, GrantRejectedException.Kind.GRANT_COUNT);
  }

  @Test
  void anExpiredGrantIsRefusedAndReleased() throws Exception {
    refused(grant(0, 0, FENCE, 3), 1, GrantRejectedException.Kind.GRANT_EXPIRED);
  }

  @Test
  void aGrantExpiredByTheLocalClockOnArrivalIsRefusedAndReleased() throws Exception {
    // A 1 s lease whose answer takes 2 s to arrive: as in Rust and Go, refused and released.
    LeaseGrant g = grant(1_000, 0, FENCE, 3);
    EmbeddedGeneratorBuilder b = builder(g);
    server.acquireScript.add((Runnable) () -> time.advance(Duration.ofSeconds(2)));
    server.acquireScript.add(g);
    GrantRejectedException e = assertThrows(GrantRejectedException.class, b::start);
    assertEquals(GrantRejectedException.Kind.GRANT_EXPIRED, e.kind());
    assertEquals(1, server.releases.size(), "the grant is released before the error");
    assertEquals(TOKEN, server.releases.get(0).getLeaseToken());
  }

  @Test
  void aClockPastAGrantedFenceIsRefusedAndReleased() throws Exception {
    LeaseGrant g = grant(600_000, 0, FENCE, 3, 4).toBuilder()
        .setMachineIds(1, LeasedMachineId.newBuilder().setMachineId(4).setFenceMs(999)).build();
    refused(g, 2, GrantRejectedException.Kind.CLOCK_PAST_FENCE);
  }

  @Test
  void aClockBehindTheFloorByMoreThanMaxFloorWaitIsRefusedAndReleased() throws Exception {
    // The floor 31,000 is stampable from 31,001: 30,001 ms ahead of the clock at 1,000.
    refused(grant(600_000, 31_000, FENCE, 3), 1, GrantRejectedException.Kind.CLOCK_BEHIND_FLOOR);
    // A lease shorter than the wait is refused too.
    refused(grant(10_000, 20_000, FENCE, 3), 1, GrantRejectedException.Kind.CLOCK_BEHIND_FLOOR);
  }

  @Test
  void aFloorFarAheadOrPastTheInt64RangeIsRefusedAndReleased() throws Exception {
    // 10^13 ms (about 317 years) ahead: the wait in ns overflows a long and passed for none.
    refused(grant(600_000, 10_000_000_000_000L, FENCE, 3), 1, GrantRejectedException.Kind.CLOCK_BEHIND_FLOOR);
    // The uint64 floor 2^64 - 1 reads as -1 in Java, and every stamp passed it.
    refused(grant(600_000, -1L, FENCE, 3), 1, GrantRejectedException.Kind.CLOCK_BEHIND_FLOOR);
  }

  @Test
  void aWallClockAnHourAheadIsPastTheFenceAndRefused() throws Exception {
    long now = System.currentTimeMillis() - EPOCH;
    server = new FakeLeaseServer(LeaseTime.SYSTEM, grant(600_000, 0, now + 600_000, 3));
    EmbeddedGeneratorBuilder b = EmbeddedGenerator.builder().endpoint(server.url()).namespace("ns")
        .wallClock(java.time.Clock.offset(java.time.Clock.systemUTC(), Duration.ofHours(1)));
    GrantRejectedException e = assertThrows(GrantRejectedException.class, b::start);
    assertEquals(GrantRejectedException.Kind.CLOCK_PAST_FENCE, e.kind());
    assertEquals(1, server.releases.size());
    // The skew field carried the offset clock.
    long sent = server.acquires.get(0).getClientTimeUnixMs();
    assertTrue(sent - System.currentTimeMillis() > 3_500_000, "client time " + sent);
  }

  @Test
  void startWaitsForTheClockToPassTheFloorThenIssuesAboveIt() throws Exception {
    // Exactly max_floor_wait (30 s) is still waited.
    try (EmbeddedGenerator gen = builder(grant(600_000, 30_999, FENCE, 3)).start()) {
      assertEquals(List.of(30_000_000_000L), time.sleeps);
      assertEquals(id(31_000, 3, 0), gen.nextId());
    }
  }

  @Test
  void aFloorWaitCountsWholeTicks() throws Exception {
    LeaseGrant g = grant(600_000, 1235, FENCE, 3).toBuilder()
        .setLayout(FakeLeaseServer.layout(39, 6, 8, 10)).build();
    try (EmbeddedGenerator gen = builder(g).start()) {
      assertEquals(List.of(Duration.ofMillis(240).toNanos()), time.sleeps);
      assertEquals((124L << 14) | (3 << 8), gen.nextId());
    }
  }

  @Test
  void settingsAreCheckedBeforeAnyCall() {
    EmbeddedGeneratorBuilder b = EmbeddedGenerator.builder().endpoint("http://127.0.0.1:1").namespace("ns");
    assertEquals("INVALID_ARGUMENT: machine_ids: 0 is outside 1 to 63",
        assertThrows(SnowkeepException.class, () -> b.machineIds(0).start()).getMessage());
    b.machineIds(1);
    assertEquals(Status.Code.INVALID_ARGUMENT,
        assertThrows(SnowkeepException.class, () -> b.apiKey("a b").start()).code());
    b.apiKey(null);
    assertEquals(Status.Code.INVALID_ARGUMENT,
        assertThrows(SnowkeepException.class, () -> b.endpoint("nope").start()).code());
    assertEquals(Status.Code.INVALID_ARGUMENT,
        assertThrows(SnowkeepException.class, () -> EmbeddedGenerator.builder().endpoint("127.0.0.1:1").start()).code());
    b.endpoint("https://127.0.0.1:1").tls(java.nio.file.Path.of("/nonexistent/ca.pem"), null, null);
    SnowkeepException tls = assertThrows(SnowkeepException.class, b::start);
    assertEquals(Status.Code.INVALID_ARGUMENT, tls.code());
    assertTrue(tls.description().startsWith("tls.ca: cannot read /nonexistent/ca.pem"), tls.description());
  }

  @Test
  void theRequesterTagIsTwelveHexDigitsOfTheIdentityHash() {
    // The first 12 hex digits of SHA-256("h:1:2:00"), as the Rust client and the server compute it.
    assertEquals("4ed3c3420511", new Requester("h", 1, 2, "00").tag());
    Requester r = Requester.current();
    assertEquals(ProcessHandle.current().pid(), r.pid());
    assertTrue(r.startUnixMs() > 1_577_836_800_000L && r.startUnixMs() <= System.currentTimeMillis());
    assertNotEquals(r.nonce(), r.withNewNonce().nonce());
    assertEquals(r.hostId(), Requester.current().hostId());
  }
}
