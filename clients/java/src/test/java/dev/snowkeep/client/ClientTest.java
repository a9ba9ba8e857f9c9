package dev.snowkeep.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.snowkeep.v1.Layout;
import io.grpc.Status;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;
import org.junit.jupiter.params.provider.ValueSource;

class ClientTest {
  static SnowkeepClient client(FakeServer... servers) {
    SnowkeepClientBuilder b = SnowkeepClient.builder()
        .backoff(Duration.ofMillis(1)).maxBackoff(Duration.ofMillis(2));
    for (FakeServer s : servers) {
      b.endpoints(s.url());
    }
    return b.build();
  }

  @Test
  void nextIdsReturnsTheServersIdsInOrder() throws Exception {
    try (FakeServer s = new FakeServer(100); SnowkeepClient c = client(s)) {
      assertArrayEquals(new long[] {101, 102, 103}, c.nextIds(3));
      assertArrayEquals(new long[] {104, 105}, c.nextIdsAsync(2).get());
      assertEquals(2, s.nextIdsCalls.get());
    }
  }

  @Test
  void idsAboveTwoToThe62AreNotNegative() throws Exception {
    long base = (1L << 62) + 5;
    try (FakeServer s = new FakeServer(base); SnowkeepClient c = client(s)) {
      assertArrayEquals(new long[] {base + 1, base + 2}, c.nextIds(2));
    }
  }

  @ParameterizedTest
  @EnumSource(
      value = Status.Code.class,
      names = {"UNAVAILABLE", "DEADLINE_EXCEEDED", "UNKNOWN", "CANCELLED", "RESOURCE_EXHAUSTED",
          "ABORTED", "INTERNAL", "FAILED_PRECONDITION", "NOT_FOUND"})
  void aRetryableCodeIsRetriedOnTheNextServer(Status.Code code) throws Exception {
    try (FakeServer bad = new FakeServer(0); FakeServer ok = new FakeServer(10);
        SnowkeepClient c = client(bad, ok)) {
      bad.nextIdsScript.add(Status.fromCode(code).withDescription("busy"));
      assertArrayEquals(new long[] {11, 12, 13}, c.nextIds(3));
      assertEquals(1, bad.nextIdsCalls.get());
      assertEquals(1, ok.nextIdsCalls.get());
    }
  }

  @ParameterizedTest
  @EnumSource(
      value = Status.Code.class,
      names = {"INVALID_ARGUMENT", "UNAUTHENTICATED", "PERMISSION_DENIED", "OUT_OF_RANGE",
          "UNIMPLEMENTED", "ALREADY_EXISTS", "DATA_LOSS"})
  void anyOtherCodeSurfacesAfterOneAttempt(Status.Code code) throws Exception {
    try (FakeServer bad = new FakeServer(0); FakeServer ok = new FakeServer(10);
        SnowkeepClient c = client(bad, ok)) {
      bad.always = Status.fromCode(code).withDescription("refused: no");
      SnowkeepException e = assertThrows(SnowkeepException.class, () -> c.nextIds(3));
      assertEquals(code, e.code());
      assertEquals("refused: no", e.description());
      assertEquals(1, bad.nextIdsCalls.get());
      assertEquals(0, ok.nextIdsCalls.get());
    }
  }

  @Test
  void aSpentBudgetFailsWithTheLastRetryableError() throws Exception {
    try (FakeServer a = new FakeServer(0); FakeServer b = new FakeServer(0);
        SnowkeepClient c = SnowkeepClient.builder().endpoints(a.url(), b.url())
            .backoff(Duration.ofMillis(5)).maxBackoff(Duration.ofMillis(10))
            .retryBudget(Duration.ofMillis(300)).build()) {
      a.always = Status.UNAVAILABLE.withDescription("a is down");
      b.always = Status.UNAVAILABLE.withDescription("b is down");
      long start = System.nanoTime();
      SnowkeepException e = assertThrows(SnowkeepException.class, () -> c.nextIds(1));
      long ms = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start);
      assertEquals(Status.Code.UNAVAILABLE, e.code());
      assertTrue(e.description().endsWith(" is down"), e.description());
      assertTrue(ms < 2000, "took " + ms + " ms");
      assertTrue(a.nextIdsCalls.get() >= 2 && b.nextIdsCalls.get() >= 2);
      assertTrue(Math.abs(a.nextIdsCalls.get() - b.nextIdsCalls.get()) <= 1);
    }
  }

  @Test
  void aFailedEndpointIsEjectedAndSkippedByTheNextCall() throws Exception {
    try (FakeServer a = new FakeServer(0); FakeServer b = new FakeServer(50);
        SnowkeepClient c = SnowkeepClient.builder().endpoints(a.url(), b.url())
            .backoff(Duration.ofSeconds(30)).maxBackoff(Duration.ofSeconds(30)).build()) {
      a.nextIdsScript.add(Status.UNAVAILABLE.withDescription("restarting"));
      assertArrayEquals(new long[] {51}, c.nextIds(1));
      assertArrayEquals(new long[] {52}, c.nextIds(1));
      assertArrayEquals(new long[] {53}, c.nextIds(1));
      assertEquals(1, a.nextIdsCalls.get());
      assertEquals(3, b.nextIdsCalls.get());
    }
  }

  @Test
  void callsGoRoundRobin() throws Exception {
    try (FakeServer a = new FakeServer(0); FakeServer b = new FakeServer(100);
        SnowkeepClient c = client(a, b)) {
      assertArrayEquals(new long[] {1}, c.nextIds(1));
      assertArrayEquals(new long[] {101}, c.nextIds(1));
      assertArrayEquals(new long[] {2}, c.nextIds(1));
    }
  }

  @Test
  void theApiKeyIsSentAsABearerToken() throws Exception {
    try (FakeServer s = new FakeServer(0);
        SnowkeepClient c = SnowkeepClient.builder().endpoints(s.url()).apiKey("sk_test.123").build()) {
      c.nextIds(1);
      assertEquals(List.of("Bearer sk_test.123"), s.authorization);
    }
  }

  @Test
  void cancellingTheFutureCancelsTheCallWithoutRetry() throws Exception {
    try (FakeServer a = new FakeServer(0); FakeServer b = new FakeServer(0);
        SnowkeepClient c = client(a, b)) {
      a.hang = true;
      CompletableFuture<long[]> f = c.nextIdsAsync(5);
      while (a.nextIdsCalls.get() == 0) {
        Thread.onSpinWait();
      }
      assertTrue(f.cancel(true));
      assertTrue(a.cancelled.await(10, TimeUnit.SECONDS), "the server saw no cancellation");
      assertThrows(CancellationException.class, f::get);
      assertEquals(1, a.nextIdsCalls.get());
      assertEquals(0, b.nextIdsCalls.get());
    }
  }

  @Test
  void anInterruptedBlockingCallIsCancelled() throws Exception {
    try (FakeServer a = new FakeServer(0); SnowkeepClient c = client(a)) {
      a.hang = true;
      CompletableFuture<Throwable> thrown = new CompletableFuture<>();
      Thread t = new Thread(() -> {
        try {
          c.nextIds(1);
          thrown.complete(null);
        } catch (RuntimeException e) {
          thrown.complete(e);
        }
      });
      t.start();
      while (a.nextIdsCalls.get() == 0) {
        Thread.onSpinWait();
      }
      t.interrupt();
      assertTrue(thrown.get(10, TimeUnit.SECONDS) instanceof CancellationException);
      assertTrue(a.cancelled.await(10, TimeUnit.SECONDS));
    }
  }

  @ParameterizedTest
  @ValueSource(ints = {0, -1, 100_001})
  void aCountOutOfRangeIsRefusedBeforeAnyCall(int count) throws Exception {
    try (FakeServer s = new FakeServer(0); SnowkeepClient c = client(s)) {
      SnowkeepException e = assertThrows(SnowkeepException.class, () -> c.nextIds(count));
      assertEquals(Status.Code.INVALID_ARGUMENT, e.code());
      assertEquals("count: " + count + " is outside 1 to 100000", e.description());
      assertEquals(0, s.nextIdsCalls.get());
    }
  }

  @Test
  void theLargestCountIsServed() throws Exception {
    try (FakeServer s = new FakeServer(0); SnowkeepClient c = client(s)) {
      long[] ids = c.nextIds(100_000);
      assertEquals(100_000, ids.length);
      assertEquals(100_000L, ids[99_999]);
    }
  }

  @ParameterizedTest
  @ValueSource(strings = {"", "localhost", "localhost:", "host:0", "host:65536", "host:http",
      "ftp://host:1", ":50051", "http://host:1/path", "::1:50051", " 127.0.0.1:50051",
      "127.0.0.1:50051\n", "local host:50051"})
  void aMalformedEndpointIsRefused(String endpoint) {
    SnowkeepException e = assertThrows(SnowkeepException.class,
        () -> SnowkeepClient.builder().endpoints(endpoint).build());
    assertEquals(Status.Code.INVALID_ARGUMENT, e.code());
    assertTrue(e.description().startsWith("endpoints: invalid endpoint \"" + endpoint + "\""),
        e.description());
  }

  @Test
  void goodEndpointFormsAreAccepted() {
    SnowkeepClient.builder()
        .endpoints("127.0.0.1:1", "http://localhost:65535", "https://h.example:443", "[::1]:50051")
        .build().close();
  }

  @Test
  void noEndpointIsRefused() {
    SnowkeepException e = assertThrows(SnowkeepException.class, () -> SnowkeepClient.builder().build());
    assertEquals("endpoints: no endpoint given", e.description());
  }

  @ParameterizedTest
  @ValueSource(strings = {"a b", "key\t", "k\u00e9y", ""})
  void aBadApiKeyIsRefused(String key) {
    SnowkeepException e = assertThrows(SnowkeepException.class,
        () -> SnowkeepClient.builder().endpoints("127.0.0.1:1").apiKey(key).build());
    assertEquals(Status.Code.INVALID_ARGUMENT, e.code());
    assertTrue(e.description().startsWith("api_key: "), e.description());
  }

  @Test
  void unreadableTlsFilesAreRefusedByName(@TempDir Path dir) throws Exception {
    Path missing = dir.resolve("missing.pem");
    Path present = Files.writeString(dir.resolve("x.pem"), "not a pem");
    assertEquals("tls.ca", param(missing, null, null));
    assertEquals("tls.cert", param(null, missing, present));
    assertEquals("tls.key", param(null, present, missing));
    assertEquals("tls.key", param(null, present, null));
    assertEquals("tls.cert", param(null, null, present));
  }

  @Test
  void aCaFileWithNoCertificateIsRefusedByName(@TempDir Path dir) throws Exception {
    Path notPem = Files.writeString(dir.resolve("hostname"), "not a certificate\n");
    SnowkeepException e = assertThrows(SnowkeepException.class,
        () -> SnowkeepClient.builder().endpoints("https://127.0.0.1:1").tls(notPem, null, null).build());
    assertEquals(Status.Code.INVALID_ARGUMENT, e.code());
    assertTrue(e.description().startsWith("tls.ca: " + notPem), e.description());
  }

  @Test
  void anHttpsEndpointWithoutTlsSettingsNeverFallsBackToPlaintext() throws Exception {
    try (FakeServer s = new FakeServer(0)) {
      String https = s.url().replace("http://", "https://");
      try (SnowkeepClient c = SnowkeepClient.builder().endpoints(https)
          .retryBudget(Duration.ofMillis(300)).backoff(Duration.ofMillis(1)).build()) {
        SnowkeepException e = assertThrows(SnowkeepException.class, () -> c.nextIds(1));
        assertEquals(Status.Code.UNAVAILABLE, e.code());
      }
      assertEquals(0, s.nextIdsCalls.get());
    }
  }

  private static String param(Path ca, Path cert, Path key) {
    SnowkeepException e = assertThrows(SnowkeepException.class,
        () -> SnowkeepClient.builder().endpoints("https://127.0.0.1:1").tls(ca, cert, key).build());
    assertEquals(Status.Code.INVALID_ARGUMENT, e.code());
    return e.description().substring(0, e.description().indexOf(':'));
  }

  @Test
  void callsAfterCloseFail() throws Exception {
    try (FakeServer s = new FakeServer(0)) {
      SnowkeepClient c = client(s);
      c.close();
      SnowkeepException e = assertThrows(SnowkeepException.class, () -> c.nextIds(1));
      assertEquals(Status.Code.FAILED_PRECONDITION, e.code());
      assertEquals("client closed", e.description());
      ExecutionException ee = assertThrows(ExecutionException.class, () -> c.nextIdsAsync(1).get());
      assertEquals("client closed", ((SnowkeepException) ee.getCause()).description());
    }
  }

  @Test
  void decodeReadsTheLayoutOnceAndSplitsIds() throws Exception {
    try (FakeServer s = new FakeServer(0); SnowkeepClient c = client(s)) {
      long id = (1000L << 22) | (5L << 12) | 7;
      assertEquals(new DecodedId(1_700_000_001_000L, 5, 7), c.decode(id));
      assertEquals(new DecodedId(1_700_000_000_000L, 0, 0), c.decode(0));
      assertEquals(new DecodedId(1_700_000_000_000L + (1L << 41) - 1, 1023, 4095),
          c.decode(Long.MAX_VALUE));
      assertEquals(1, s.infoCalls.get());
    }
  }

  @Test
  void decodeHonoursTheTimeUnitAndRefusesIdsAboveTheLayout() throws Exception {
    try (FakeServer s = new FakeServer(0); SnowkeepClient c = client(s)) {
      s.layout = Layout.newBuilder().setTimestampBits(35).setMachineBits(8).setSequenceBits(10)
          .setEpochUnixMs(1_000).setTimeUnitMs(10).build();
      long id = (3L << 18) | (2L << 10) | 1;
      assertEquals(new DecodedId(1_030, 2, 1), c.decode(id));
      SnowkeepException e = assertThrows(SnowkeepException.class, () -> c.decode(1L << 53));
      assertEquals(Status.Code.INVALID_ARGUMENT, e.code());
      assertEquals("id: 9007199254740992 is above the layout's largest id 9007199254740991 (53 bits)",
          e.description());
      SnowkeepException neg = assertThrows(SnowkeepException.class, () -> c.decode(-1));
      assertTrue(neg.description().startsWith("id: 18446744073709551615 is above"));
    }
  }
}
