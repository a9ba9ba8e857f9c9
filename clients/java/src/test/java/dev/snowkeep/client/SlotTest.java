package dev.snowkeep.client;

import static dev.snowkeep.client.FakeLeaseServer.EPOCH;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import io.grpc.Status;
import java.time.Duration;
import org.junit.jupiter.api.Test;

/** The per-machine-id generator: exact ids for a known clock and layout, and every rule. */
class SlotTest {
  static final IdLayout DEFAULT = new IdLayout(41, 12, 10, EPOCH, 1);
  static final IdLayout JS53 = new IdLayout(39, 6, 8, EPOCH, 10);
  static final long FAR = 1_000_000_000L;

  final ManualTime time = new ManualTime(EPOCH + 1000);

  Slot slot(IdLayout layout, int machineId, long floor, long fence, long deadlineIn) {
    Slot s = new Slot(0, layout, time, 100,
        () -> new IdGenerationException(IdGenerationException.Kind.NO_GRANT, "none"));
    s.publish(new Grant(machineId, floor, fence, time.nanoTime() + deadlineIn));
    return s;
  }

  Slot slot(int machineId) {
    return slot(DEFAULT, machineId, 0, FAR, Duration.ofMinutes(10).toNanos());
  }

  static long id(long ts, long machine, long seq) {
    return (ts << 22) | (machine << 10) | seq;
  }

  static IdGenerationException.Kind refused(Slot s) {
    return assertThrows(IdGenerationException.class, () -> s.take(1)).kind();
  }

  @Test
  void idsAtAKnownClockAndLayoutAreExact() {
    Slot s = slot(3);
    // 1000 ms after the epoch, machine id 3, sequence 0: (1000 << 22) | (3 << 10).
    assertEquals(4_194_307_072L, s.take(1));
    assertEquals(4_194_307_073L, s.take(1));
    assertEquals(id(1000, 3, 2), s.take(5));
    assertEquals(5, s.taken);
    assertEquals(id(1000, 3, 7), s.take(1));
  }

  @Test
  void aUsedUpTickWaitsForTheNextAndStartsItAtZeroPastHalfTheRange() {
    Slot s = slot(3);
    assertEquals(id(1000, 3, 0), s.take(2000));
    assertEquals(1024, s.taken);
    assertEquals(Slot.WAIT, s.take(1));
    assertEquals(20_000, s.waitNanos);
    time.advance(Duration.ofMillis(1));
    assertEquals(id(1001, 3, 0), s.take(1));
  }

  @Test
  void aTickBelowHalfTheRangeGoesOnFromWhereTheLastLeftOff() {
    Slot s = slot(3);
    s.take(5);
    time.advance(Duration.ofMillis(1));
    assertEquals(id(1001, 3, 5), s.take(1));
    s.take(600);
    time.advance(Duration.ofMillis(1));
    assertEquals(id(1002, 3, 0), s.take(1));
  }

  @Test
  void tenMillisecondTicksStampTheTickAndItsFirstMs() {
    time.setUnixMs(EPOCH + 1234);
    Slot s = slot(JS53, 5, 0, FAR, FAR);
    // Tick 123 (1230 ms), machine id 5 of 6 bits, sequence 0 of 8 bits.
    assertEquals((123L << 14) | (5 << 8), s.take(1));
    assertEquals(2_016_512L, (123L << 14) | (5 << 8));
    time.advance(Duration.ofMillis(5)); // 1239: the same tick, the sequence goes on
    assertEquals((123L << 14) | (5 << 8) | 1, s.take(1));
    time.advance(Duration.ofMillis(1)); // 1240: tick 124 goes on from 2
    assertEquals((124L << 14) | (5 << 8) | 2, s.take(1));
    assertEquals(1240, JS53.decode(s.take(1)).unixMs() - EPOCH);
  }

  @Test
  void oneSecondTicksAndSixteenMachineBits() {
    IdLayout l = new IdLayout(31, 16, 16, EPOCH, 1000);
    time.setUnixMs(EPOCH + 12_345);
    Slot s = slot(l, 65_535, 0, FAR, FAR);
    assertEquals((12L << 32) | (65_535L << 16), s.take(1));
  }

  @Test
  void theFloorIsExclusiveAndCountsWholeTicks() {
    Slot s = slot(DEFAULT, 3, 1000, FAR, FAR);
    assertEquals(IdGenerationException.Kind.CLOCK_BEHIND_FLOOR, refused(s));
    time.advance(Duration.ofMillis(1));
    assertEquals(id(1001, 3, 0), s.take(1));

    time.setUnixMs(EPOCH + 1239);
    Slot t = slot(JS53, 1, 1235, FAR, FAR);
    // 1239 is in tick 1230, whose first ms is not above the floor 1235.
    assertEquals(IdGenerationException.Kind.CLOCK_BEHIND_FLOOR, refused(t));
    time.advance(Duration.ofMillis(1));
    assertEquals((124L << 14) | (1 << 8), t.take(1));
  }

  @Test
  void theFenceIsInclusive() {
    Slot s = slot(DEFAULT, 3, 0, 1000, FAR);
    assertEquals(id(1000, 3, 0), s.take(1));
    time.advance(Duration.ofMillis(1));
    assertEquals(IdGenerationException.Kind.FENCE_REACHED, refused(s));
  }

  @Test
  void noIdAtOrAfterTheDeadlineEvenInsideAWindow() {
    Slot s = slot(DEFAULT, 3, 0, FAR, 500_000);
    assertEquals(id(1000, 3, 0), s.take(1));
    time.advanceNanos(499_999);
    assertEquals(id(1000, 3, 1), s.take(1));
    time.advanceNanos(1);
    assertEquals(IdGenerationException.Kind.LEASE_EXPIRED, refused(s));
    assertEquals(Status.Code.UNAVAILABLE,
        assertThrows(IdGenerationException.class, () -> s.take(1)).code());
  }

  @Test
  void oneWallReadingServesOneMillisecondOfMonotonicTime() {
    Slot s = slot(3);
    assertEquals(id(1000, 3, 0), s.take(1));
    time.setUnixMs(EPOCH + 5000);
    // Inside the window: the stamp the reading admitted, the wall clock not read.
    assertEquals(id(1000, 3, 1), s.take(1));
    time.advance(Duration.ofMillis(1));
    assertEquals(id(5001, 3, 2), s.take(1));
  }

  @Test
  void aSmallBackwardStepIsWaitedOutAndALargeOneRefused() {
    Slot s = slot(3);
    time.advance(Duration.ofMillis(1));
    assertEquals(id(1001, 3, 0), s.take(1));
    time.setUnixMs(EPOCH + 950);
    time.advance(Duration.ofMillis(1)); // wall 951, 50 ms behind the last stamp
    assertEquals(Slot.WAIT, s.take(1));
    assertEquals(50_000_000, s.waitNanos);
    time.setUnixMs(EPOCH + 500);
    assertEquals(IdGenerationException.Kind.CLOCK_STEPPED_BACK, refused(s));
    time.setUnixMs(EPOCH + 1001);
    assertEquals(id(1001, 3, 1), s.take(1));
  }

  @Test
  void aWithdrawnGrantStopsIssuanceAtOnceAndDrainReportsTheLastStamp() {
    Slot s = slot(3);
    assertEquals(-1, slot(4).drain(), "nothing stamped: no timestamp to report");
    s.take(1);
    time.advance(Duration.ofMillis(1));
    s.take(1);
    s.publish(null);
    assertEquals(IdGenerationException.Kind.NO_GRANT, refused(s));
    assertEquals(1001, s.drain());
  }

  @Test
  void aNewGrantWithAHigherFloorStartsPastIt() {
    Slot s = slot(3);
    s.take(3);
    time.setUnixMs(EPOCH + 2001);
    s.publish(new Grant(3, 2000, FAR, time.nanoTime() + FAR));
    assertEquals(id(2001, 3, 0), s.take(1));
  }

  @Test
  void theClockBeforeTheEpochOrPastTheLayoutIsRefused() {
    time.setUnixMs(EPOCH - 1);
    assertEquals(IdGenerationException.Kind.CLOCK_BEFORE_EPOCH, refused(slot(3)));
    IdLayout small = new IdLayout(20, 6, 6, EPOCH, 1);
    assertEquals((1L << 20) - 1, small.maxTimestamp());
    time.setUnixMs(EPOCH + (1L << 20));
    Slot s = slot(small, 1, 0, Long.MAX_VALUE, FAR);
    IdGenerationException e = assertThrows(IdGenerationException.class, () -> s.take(1));
    assertEquals(IdGenerationException.Kind.LAYOUT_EXHAUSTED, e.kind());
    assertEquals(Status.Code.FAILED_PRECONDITION, e.code());
  }

  @Test
  void layoutChecksFollowTheServersRules() {
    assertEquals(null, DEFAULT.problem());
    assertEquals(null, JS53.problem());
    assertEquals(null, new IdLayout(41, 12, 10, EPOCH, 0).problem());
    assertEquals(1, new IdLayout(41, 12, 10, EPOCH, 0).unitMs());
    assertEquals("layout bits must each be positive and sum to 32..63, got timestamp 42 + machine 12 + sequence 10",
        new IdLayout(42, 12, 10, EPOCH, 1).problem());
    assertEquals("machine_bits is 17, at most 16 are supported", new IdLayout(30, 17, 10, EPOCH, 1).problem());
    assertEquals("time unit 5 ms is not supported: use 1, 10, 100 or 1000 ms",
        new IdLayout(41, 12, 10, EPOCH, 5).problem());
    assertEquals(1240, JS53.firstStampAfter(1235));
    assertEquals(1236, DEFAULT.firstStampAfter(1235));
  }
}
