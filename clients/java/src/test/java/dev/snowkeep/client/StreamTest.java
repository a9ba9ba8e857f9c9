package dev.snowkeep.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;

import io.grpc.Status;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CancellationException;
import java.util.stream.LongStream;
import org.junit.jupiter.api.Test;

class StreamTest {
  private static List<long[]> drain(IdStream s) {
    List<long[]> out = new ArrayList<>();
    s.forEachRemaining(out::add);
    return out;
  }

  @Test
  void aWholeStreamDeliversExactlyTotalIds() throws Exception {
    try (FakeServer f = new FakeServer(0); SnowkeepClient c = ClientTest.client(f);
        IdStream s = c.stream(10, 3)) {
      List<long[]> batches = drain(s);
      assertEquals(4, batches.size());
      assertArrayEquals(new long[] {1, 2, 3}, batches.get(0));
      assertArrayEquals(new long[] {10}, batches.get(3));
      assertEquals(10, s.received());
      assertFalse(s.hasNext());
      assertEquals(List.of(10L), f.streamTotals);
    }
  }

  @Test
  void aRetryableEndResumesOnTheNextServerForTheRest() throws Exception {
    try (FakeServer a = new FakeServer(0); FakeServer b = new FakeServer(1000);
        SnowkeepClient c = ClientTest.client(a, b); IdStream s = c.stream(10, 3)) {
      a.streamScript.add(new FakeServer.StreamPlan(2, Status.UNAVAILABLE.withDescription(
          "stream ended early: 6 of 10 ids sent; this server is shutting down")));
      long[] ids = s.ids().toArray();
      assertArrayEquals(new long[] {1, 2, 3, 4, 5, 6, 1001, 1002, 1003, 1004}, ids);
      assertEquals(List.of(10L), a.streamTotals);
      assertEquals(List.of(4L), b.streamTotals);
    }
  }

  @Test
  void anOkEndBeforeTotalIsResumedToo() throws Exception {
    try (FakeServer a = new FakeServer(0); SnowkeepClient c = ClientTest.client(a);
        IdStream s = c.stream(5, 2)) {
      a.streamScript.add(new FakeServer.StreamPlan(1, Status.OK));
      assertArrayEquals(new long[] {1, 2, 3, 4, 5}, s.ids().toArray());
      assertEquals(List.of(5L, 3L), a.streamTotals);
    }
  }

  @Test
  void aFailureToOpenFollowsTheRetryRule() throws Exception {
    try (FakeServer a = new FakeServer(0); FakeServer b = new FakeServer(200);
        SnowkeepClient c = ClientTest.client(a, b); IdStream s = c.stream(3, 0)) {
      a.streamScript.add(new FakeServer.StreamPlan(0, Status.RESOURCE_EXHAUSTED));
      assertArrayEquals(new long[] {201, 202, 203}, s.ids().toArray());
      assertEquals(1, a.streamCalls.get());
    }
  }

  @Test
  void aNonRetryableEndSurfacesAfterTheBatchesDelivered() throws Exception {
    try (FakeServer a = new FakeServer(0); FakeServer b = new FakeServer(0);
        SnowkeepClient c = ClientTest.client(a, b); IdStream s = c.stream(10, 2)) {
      a.streamScript.add(new FakeServer.StreamPlan(2,
          Status.PERMISSION_DENIED.withDescription("key revoked")));
      assertArrayEquals(new long[] {1, 2}, s.next());
      assertArrayEquals(new long[] {3, 4}, s.next());
      SnowkeepException e = assertThrows(SnowkeepException.class, s::hasNext);
      assertEquals(Status.Code.PERMISSION_DENIED, e.code());
      assertEquals("key revoked", e.description());
      assertEquals(4, s.received());
      assertThrows(SnowkeepException.class, s::next);
      assertEquals(0, b.streamCalls.get());
    }
  }

  @Test
  void closingTheStreamCancelsIt() throws Exception {
    try (FakeServer a = new FakeServer(0); SnowkeepClient c = ClientTest.client(a)) {
      IdStream s = c.stream(1_000_000, 10);
      assertArrayEquals(LongStream.rangeClosed(1, 10).toArray(), s.next());
      s.close();
      assertThrows(CancellationException.class, s::hasNext);
    }
  }

  @Test
  void badArgumentsAreRefusedBeforeAnyCall() throws Exception {
    try (FakeServer a = new FakeServer(0); SnowkeepClient c = ClientTest.client(a)) {
      assertEquals("total: 0 is outside 1 to 2^63 - 1",
          assertThrows(SnowkeepException.class, () -> c.stream(0, 1)).description());
      assertEquals("batch_size: 100001 is outside 0 to 100000",
          assertThrows(SnowkeepException.class, () -> c.stream(1, 100_001)).description());
      assertEquals(0, a.streamCalls.get());
    }
  }
}
