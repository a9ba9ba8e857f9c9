package dev.snowkeep.client;

import static dev.snowkeep.client.FakeLeaseServer.EPOCH;
import static dev.snowkeep.client.FakeLeaseServer.TOKEN;
import static dev.snowkeep.client.FakeLeaseServer.grant;
import static dev.snowkeep.client.FakeLeaseServer.invalid;
import static dev.snowkeep.client.SlotTest.id;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.snowkeep.v1.CheckRequest;
import dev.snowkeep.v1.LeaseCheckReason;
import dev.snowkeep.v1.LeaseGrant;
import dev.snowkeep.v1.RenewRequest;
import io.grpc.Status;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/** After start: renewal timing, checks, every stop rule, and release after drain. */
class EmbeddedLeaseTest {
  static final long FENCE = 1_000_000_000L;
  static final long S = TimeUnit.SECONDS.toNanos(1);
  static final long DAY_MS = 86_400_000L;

  final ManualTime time = new ManualTime(EPOCH + 1000);
  final long t0 = time.nanoTime();
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

  EmbeddedGenerator start(LeaseGrant grant, Duration checkInterval, int... ids) throws Exception {
    server = new FakeLeaseServer(time, grant);
    gen = EmbeddedGenerator.builder().endpoint(server.url()).namespace("ns").machineIds(ids.length)
        .checkInterval(checkInterval).time(time).random(() -> 0.5).start();
    return gen;
  }

  EmbeddedGenerator start(int... ids) throws Exception {
    return start(grant(600_000, 0, FENCE, ids), Duration.ZERO, ids);
  }

  List<Long> renewsFromT0() {
    List<Long> out = new ArrayList<>();
    for (long t : server.renewTimes) {
      out.add(t - t0);
    }
    return out;
  }

  @Test
  void theFirstRenewalIsAtOnceThenAtHalfTheRemainingLease() throws Exception {
    start(3);
    assertEquals(List.of(0L), time.pending(), "the first renewal is due at once");
    server.renewScript.add(grant(2 * DAY_MS, 0, FENCE, 3));
    server.renewScript.add(grant(2 * DAY_MS, 0, FENCE, 3));
    time.runDue();
    assertEquals(List.of(0L), renewsFromT0());
    RenewRequest r = server.renews.get(0);
    assertEquals(TOKEN, r.getLeaseToken());
    assertEquals(77, r.getNamespaceIncarnation());
    assertEquals(EPOCH + 1000, r.getClientTimeUnixMs());
    assertEquals(server.acquires.get(0).getRequester(), r.getRequester());
    time.advance(Duration.ofHours(24).minusNanos(1));
    assertEquals(1, server.renews.size());
    time.advance(Duration.ofNanos(1));
    assertEquals(List.of(0L, 86_400 * S), renewsFromT0());
    time.advance(Duration.ofHours(24));
    assertEquals(List.of(0L, 86_400 * S, 172_800 * S), renewsFromT0());
    assertEquals(null, gen.stopReason());
  }

  @Test
  void whileBehindRenewalRetriesEveryQuarterOfTheRemainingAtLeast5sApartThenExpires() throws Exception {
    start(3);
    CompletableFuture<StopReason> stopped = gen.stopped();
    for (int i = 0; i < 100; i++) {
      server.renewScript.add(Status.UNAVAILABLE);
    }
    time.runDue();
    time.advance(Duration.ofSeconds(600).minusNanos(1));
    // The deadline: 600 s from when Acquire was sent. Expected: min(10 min, remaining/4), >= 5 s.
    List<Long> expected = new ArrayList<>();
    long deadline = 600 * S;
    for (long t = 0; t < deadline; ) {
      expected.add(t);
      t += Math.min(600 * S, Math.max(5 * S, (deadline - t) / 4));
    }
    assertEquals(expected, renewsFromT0());
    assertEquals(List.of(0L, 150 * S, 262_500_000_000L, 346_875_000_000L), expected.subList(0, 4));
    assertEquals(5 * S, expected.get(expected.size() - 1) - expected.get(expected.size() - 2));
    assertFalse(stopped.isDone());
    assertEquals(id(1000 + 599_999, 3, 0), gen.nextId(), "the last ns before the deadline still issues");
    time.advance(Duration.ofNanos(1));
    assertEquals(StopReason.EXPIRED, stopped.getNow(null));
    GeneratorStoppedException e = assertThrows(GeneratorStoppedException.class, gen::nextId);
    assertEquals(StopReason.EXPIRED, e.reason());
    assertEquals(Status.Code.FAILED_PRECONDITION, e.code());
    assertEquals(0, server.releases.size(), "an expired lease is not released");
  }

  @Test
  void aRenewalThatHangsDoesNotHoldTheExpiredStopPastTheDeadline() throws Exception {
    long fence = System.currentTimeMillis() - EPOCH + 600_000;
    server = new FakeLeaseServer(LeaseTime.SYSTEM, grant(1500, 0, fence, 3));
    server.hangRenew = true;
    long began = System.nanoTime();
    gen = EmbeddedGenerator.builder().endpoint(server.url()).namespace("ns")
        .checkInterval(Duration.ZERO).start();
    gen.nextId();
    // The Renew sent at once never answers; the request timeout (10 s) is longer than the lease.
    assertEquals(StopReason.EXPIRED, gen.stopped().get(5, TimeUnit.SECONDS));
    long took = System.nanoTime() - began;
    assertTrue(took >= 1_500_000_000L && took < 4_000_000_000L, "stopped after " + took + " ns");
    assertEquals(StopReason.EXPIRED, assertThrows(GeneratorStoppedException.class, gen::nextId).reason());
  }

  @Test
  void onALongLeaseRetriesAreAtMostTenMinutesApart() throws Exception {
    start(grant(2 * DAY_MS, 0, FENCE, 3), Duration.ZERO, 3);
    server.renewScript.add(Status.INTERNAL);
    server.renewScript.add(Status.DEADLINE_EXCEEDED);
    time.runDue();
    time.advance(Duration.ofMinutes(10));
    time.advance(Duration.ofMinutes(10));
    assertEquals(List.of(0L, 600 * S, 1200 * S), renewsFromT0());
  }

  @Test
  void theDeadlineCountsFromWhenTheRenewalWasSentAndStopsIssuanceExactlyThere() throws Exception {
    start(3);
    server.renewScript.add(grant(1000, 0, FENCE, 3));
    server.renewScript.add(Status.UNAVAILABLE);
    time.runDue();
    time.advance(Duration.ofMillis(500));
    assertEquals(List.of(0L, 500_000_000L), renewsFromT0());
    time.advance(Duration.ofMillis(500).minusNanos(1));
    assertEquals(id(1999, 3, 0), gen.nextId());
    time.advance(Duration.ofNanos(1));
    assertEquals(StopReason.EXPIRED, gen.stopReason());
    assertEquals(StopReason.EXPIRED, assertThrows(GeneratorStoppedException.class, gen::nextId).reason());
  }

  @Test
  void aRaisedFenceIsPublishedAndIssuanceGoesOnPastTheOldOne() throws Exception {
    start(grant(600_000, 0, 1001, 3), Duration.ZERO, 3);
    time.runDue(); // the first renewal: the same fence
    assertEquals(id(1000, 3, 0), gen.nextId());
    time.advance(Duration.ofMillis(2)); // 1002: past the fence
    assertEquals(IdGenerationException.Kind.FENCE_REACHED,
        assertThrows(IdGenerationException.class, gen::nextId).kind());
    server.renewScript.add(grant(600_000, 0, 400_000, 3));
    time.advance(Duration.ofSeconds(300).minusMillis(2)); // the second renewal, at half the lease
    assertEquals(List.of(0L, 300 * S), renewsFromT0());
    assertEquals(id(301_000, 3, 1), gen.nextId()); // the tick goes on from sequence 1
  }

  @Test
  void aRenewedFloorPastTheInt64RangeStampsNothingUnderIt() throws Exception {
    start(3);
    // The uint64 floor 2^64 - 1 reads as -1 in Java: every stamp would pass it.
    server.renewScript.add(grant(600_000, -1L, FENCE, 3));
    time.runDue();
    time.advance(Duration.ofMillis(2));
    assertEquals(IdGenerationException.Kind.CLOCK_BEHIND_FLOOR,
        assertThrows(IdGenerationException.class, gen::nextId).kind());
  }

  /** Starts, takes an id, lets the first renewal answer {@code answer}; returns the stop. */
  StopReason renewalStops(Object answer, int... ids) throws Exception {
    start(ids);
    gen.nextId();
    server.renewScript.add(answer);
    CompletableFuture<StopReason> stopped = gen.stopped();
    time.runDue();
    StopReason r = stopped.getNow(null);
    assertEquals(r, gen.stopReason());
    if (r != null) {
      assertEquals(r, assertThrows(GeneratorStoppedException.class, gen::nextId).reason());
    }
    return r;
  }

  @Test
  void anEmptyRenewalStopsWithItsGoneReason() throws Exception {
    LeaseGrant empty = grant(600_000, 0, FENCE);
    assertEquals(StopReason.LEASE_GONE, renewalStops(empty, 3));
    assertEquals(0, server.releases.size(), "a gone lease is not released");
  }

  @Test
  void anEmptyRenewalSayingNamespaceGoneStopsSo() throws Exception {
    LeaseGrant empty = grant(600_000, 0, FENCE).toBuilder()
        .setGoneReason(LeaseCheckReason.LEASE_CHECK_REASON_NAMESPACE_GONE).build();
    assertEquals(StopReason.NAMESPACE_GONE, renewalStops(empty, 3));
  }

  @Test
  void anEmptyRenewalSayingRolledBackStopsSo() throws Exception {
    LeaseGrant empty = grant(600_000, 0, FENCE).toBuilder()
        .setGoneReason(LeaseCheckReason.LEASE_CHECK_REASON_ROLLED_BACK).build();
    assertEquals(StopReason.NAMESPACE_ROLLED_BACK, renewalStops(empty, 3));
  }

  @Test
  void aRenewalWithOtherMachineIdsStops() throws Exception {
    assertEquals(StopReason.MACHINE_IDS_CHANGED, renewalStops(grant(600_000, 0, FENCE, 4), 3));
  }

  @Test
  void aRenewalWithAnotherCountStops() throws Exception {
    assertEquals(StopReason.MACHINE_IDS_CHANGED, renewalStops(grant(600_000, 0, FENCE, 3), 3, 9));
  }

  @Test
  void aRefusedTokenStops() throws Exception {
    assertEquals(StopReason.TOKEN_REFUSED, renewalStops(Status.PERMISSION_DENIED, 3));
  }

  @Test
  void aRenewalGrantingNoTimeStops() throws Exception {
    assertEquals(StopReason.EXPIRED, renewalStops(grant(0, 0, FENCE, 3), 3));
  }

  @Test
  void aClockPastTheRenewedFenceStopsAndReleasesWithTheLastStamp() throws Exception {
    assertEquals(StopReason.CLOCK_PAST_FENCE, renewalStops(grant(600_000, 0, 999, 3), 3));
    assertEquals(1, server.releases.size());
    assertEquals(Map.of(3, 1000L), server.releases.get(0).getLastUsedMsMap());
    assertEquals(TOKEN, server.releases.get(0).getLeaseToken());
  }

  @Test
  void aTransientRenewalErrorDoesNotStop() throws Exception {
    assertEquals(null, renewalStops(Status.UNAVAILABLE, 3));
    assertEquals(id(1000, 3, 1), gen.nextId());
  }

  @Test
  void checksEveryIntervalWithTheLeaseAndStopsWhenTheLeaseIsGone() throws Exception {
    start(grant(600_000, 0, FENCE, 3, 9), Duration.ofSeconds(30), 3, 9);
    time.runDue();
    time.advance(Duration.ofSeconds(30));
    assertEquals(1, server.checks.size());
    assertEquals(t0 + 30 * S, server.checkTimes.get(0));
    CheckRequest c = server.checks.get(0);
    assertEquals(List.of(3, 9), c.getMachineIdsList());
    assertEquals(TOKEN, c.getLeaseToken());
    assertEquals(77, c.getNamespaceIncarnation());
    assertEquals("ns", c.getNamespace());
    server.checkScript.add(Status.UNAVAILABLE);
    server.checkScript.add(invalid(LeaseCheckReason.LEASE_CHECK_REASON_UNSPECIFIED));
    server.checkScript.add(invalid(LeaseCheckReason.LEASE_CHECK_REASON_LEASE_GONE));
    time.advance(Duration.ofSeconds(60));
    assertEquals(null, gen.stopReason(), "no answer and an unknown reason change nothing");
    time.advance(Duration.ofSeconds(30));
    assertEquals(List.of(t0 + 30 * S, t0 + 60 * S, t0 + 90 * S, t0 + 120 * S), server.checkTimes);
    assertEquals(StopReason.LEASE_GONE, gen.stopReason());
    time.advance(Duration.ofSeconds(300));
    assertEquals(4, server.checks.size(), "no check after the stop");
  }

  StopReason checkStops(Object answer) throws Exception {
    start(grant(600_000, 0, FENCE, 3), Duration.ofSeconds(30), 3);
    server.checkScript.add(answer);
    time.runDue();
    time.advance(Duration.ofSeconds(30));
    return gen.stopReason();
  }

  @Test
  void aCheckSayingNamespaceGoneStops() throws Exception {
    assertEquals(StopReason.NAMESPACE_GONE, checkStops(invalid(LeaseCheckReason.LEASE_CHECK_REASON_NAMESPACE_GONE)));
  }

  @Test
  void aCheckSayingRolledBackStops() throws Exception {
    assertEquals(StopReason.NAMESPACE_ROLLED_BACK, checkStops(invalid(LeaseCheckReason.LEASE_CHECK_REASON_ROLLED_BACK)));
  }

  @Test
  void aCheckRefusingTheTokenStops() throws Exception {
    assertEquals(StopReason.TOKEN_REFUSED, checkStops(Status.PERMISSION_DENIED));
  }

  @Test
  void closeDrainsThenReleasesWithTheLastTimestampPerMachineId() throws Exception {
    start(3, 9, 12, 20);
    assertEquals(id(1000, 3, 0), gen.nextId());
    assertEquals(id(1000, 9, 0), gen.nextId());
    time.advance(Duration.ofMillis(5));
    assertEquals(id(1005, 12, 0), gen.nextId());
    assertEquals(id(1005, 20, 0), gen.nextId());
    assertEquals(id(1005, 3, 1), gen.nextId());
    assertEquals(id(1005, 9, 1), gen.nextId());
    assertEquals(id(1005, 12, 1), gen.nextId());
    CompletableFuture<StopReason> stopped = gen.stopped();
    assertEquals(4, gen.shutdown());
    assertEquals(1, server.releases.size());
    assertEquals(Map.of(3, 1005L, 9, 1005L, 12, 1005L, 20, 1005L), server.releases.get(0).getLastUsedMsMap());
    assertEquals(TOKEN, server.releases.get(0).getLeaseToken());
    assertEquals(server.acquires.get(0).getRequester(), server.releases.get(0).getRequester());
    assertEquals(StopReason.SHUT_DOWN, stopped.getNow(null));
    assertEquals(StopReason.SHUT_DOWN, assertThrows(GeneratorStoppedException.class, gen::nextId).reason());
    assertEquals(0, gen.shutdown(), "a second close releases nothing");
    time.advance(Duration.ofHours(1));
    assertEquals(1, server.renews.size(), "no renewal after close (the one due at once ran)");
  }

  @Test
  void aMachineIdNeverUsedIsLeftOutOfTheRelease() throws Exception {
    start(3, 9);
    gen.pin().close(); // pins 3 and gives it back unused: the pool is 3, 9 again
    gen.nextIds(2);
    assertEquals(2, gen.shutdown());
    assertEquals(Map.of(3, 1000L), server.releases.get(0).getLastUsedMsMap());
  }

  @Test
  void closeAfterTheLeaseIsGoneReleasesNothing() throws Exception {
    renewalStops(grant(600_000, 0, FENCE), 3);
    assertEquals(0, gen.shutdown());
    assertEquals(0, server.releases.size());
    assertEquals(StopReason.LEASE_GONE, gen.stopReason());
    assertTrue(gen.stopped().isDone());
  }
}
