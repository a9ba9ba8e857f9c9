package dev.snowkeep.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import io.grpc.Status;
import java.time.Duration;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.junit.jupiter.api.Test;

class PoolTest {
  @Test
  void nextHandsOutTheFetchedIdsInOrder() throws Exception {
    try (FakeServer f = new FakeServer(0); SnowkeepClient c = ClientTest.client(f);
        IdPool p = c.pool(10, 2, Duration.ofMinutes(10))) {
      for (long want = 1; want <= 25; want++) {
        assertEquals(want, p.next());
      }
      assertEquals(3, f.nextIdsCalls.get());
    }
  }

  @Test
  void idsPastMaxAgeAreDropped() throws Exception {
    AtomicLong now = new AtomicLong();
    try (FakeServer f = new FakeServer(0); SnowkeepClient c = ClientTest.client(f);
        IdPool p = new IdPool(c, 10, 2, Duration.ofSeconds(1), now::get)) {
      assertEquals(1, p.next());
      assertEquals(9, p.buffered());
      now.addAndGet(TimeUnit.SECONDS.toNanos(2));
      assertEquals(0, p.buffered());
      assertEquals(11, p.next());
      assertEquals(1, p.next(1, TimeUnit.SECONDS) - 11);
    }
  }

  @Test
  void aFailedRefillIsThrownByNext() throws Exception {
    try (FakeServer f = new FakeServer(0); SnowkeepClient c = ClientTest.client(f)) {
      f.always = Status.PERMISSION_DENIED.withDescription("no ids permission");
      try (IdPool p = c.pool(10, 2, Duration.ofMinutes(1))) {
        SnowkeepException e = assertThrows(SnowkeepException.class, p::next);
        assertEquals(Status.Code.PERMISSION_DENIED, e.code());
        assertEquals("no ids permission", e.description());
        f.always = null;
        assertEquals(1, p.next());
      }
    }
  }

  @Test
  void nextAfterCloseFails() throws Exception {
    try (FakeServer f = new FakeServer(0); SnowkeepClient c = ClientTest.client(f)) {
      IdPool p = c.pool();
      assertEquals(1, p.next());
      p.close();
      SnowkeepException e = assertThrows(SnowkeepException.class, p::next);
      assertEquals(Status.Code.FAILED_PRECONDITION, e.code());
      assertEquals("pool closed", e.description());
    }
  }

  @Test
  void badSettingsAreRefused() throws Exception {
    try (FakeServer f = new FakeServer(0); SnowkeepClient c = ClientTest.client(f)) {
      assertEquals("batch: 0 is outside 1 to 100000", assertThrows(SnowkeepException.class,
          () -> c.pool(0, 0, Duration.ofSeconds(1))).description());
      assertEquals("low_water: 10 is outside 0 to batch - 1 (9)", assertThrows(SnowkeepException.class,
          () -> c.pool(10, 10, Duration.ofSeconds(1))).description());
      assertEquals("max_age: PT0S is not a positive duration", assertThrows(SnowkeepException.class,
          () -> c.pool(10, 1, Duration.ZERO)).description());
      assertEquals(0, f.nextIdsCalls.get());
    }
  }
}
