package dev.snowkeep.client;

import java.nio.file.Path;
import java.time.Duration;
import java.util.concurrent.ThreadLocalRandom;
import java.util.function.DoubleSupplier;

/**
 * Builds and starts an {@link EmbeddedGenerator}. Every setting is checked by {@link #start()}
 * before any call: a bad value fails with {@link SnowkeepException} {@code INVALID_ARGUMENT}
 * naming the parameter. The defaults are the Rust {@code EmbeddedConfig}'s.
 *
 * <pre>{@code
 * try (EmbeddedGenerator gen = EmbeddedGenerator.builder()
 *     .endpoint("http://127.0.0.1:50051")
 *     .namespace("default")
 *     .machineIds(2)
 *     .start()) {
 *   long id = gen.nextId();
 * }
 * }</pre>
 */
public final class EmbeddedGeneratorBuilder {
  String endpoint;
  String namespace;
  int machineIds = 1;
  Requester requester;
  Spread spread = Spread.ROUND_ROBIN;
  Duration maxBackwardWait = Duration.ofMillis(100);
  Duration acquireBackoff = Duration.ofSeconds(3);
  Duration acquireMaxBackoff = Duration.ofSeconds(60);
  int acquireAttempts;
  Duration requestTimeout = Duration.ofSeconds(10);
  boolean sendClientTime = true;
  Duration maxFloorWait = Duration.ofSeconds(30);
  Duration checkInterval = Duration.ofSeconds(30);
  String apiKey;
  boolean tls;
  Path caFile;
  Path certFile;
  Path keyFile;
  LeaseTime time = LeaseTime.SYSTEM;
  DoubleSupplier random = () -> ThreadLocalRandom.current().nextDouble();

  EmbeddedGeneratorBuilder() {}

  /**
   * The snowkeep server (running on etcd) whose {@code LeaseService} leases the machine ids:
   * {@code host:port}, {@code http://host:port} or {@code https://host:port} (TLS), as {@link
   * SnowkeepClientBuilder#endpoints(String...)} takes them. Required.
   *
   * @param endpoint one endpoint
   * @return this builder
   */
  public EmbeddedGeneratorBuilder endpoint(String endpoint) {
    this.endpoint = endpoint;
    return this;
  }

  /**
   * The namespace; it must exist (created with {@code snowkeep-server --create-namespace}).
   * Required. Ids are unique within one namespace only.
   *
   * @param namespace 1-64 characters of A-Z a-z 0-9 . _ -, starting with a letter or a digit
   * @return this builder
   */
  public EmbeddedGeneratorBuilder namespace(String namespace) {
    this.namespace = namespace;
    return this;
  }

  /**
   * Machine ids to hold (default 1); each adds {@code 2^sequence_bits} ids per tick. Each costs
   * a lease: prefer one generator with several machine ids to several generators.
   *
   * @param machineIds 1 to 63
   * @return this builder
   */
  public EmbeddedGeneratorBuilder machineIds(int machineIds) {
    this.machineIds = machineIds;
    return this;
  }

  /**
   * The identity to hold the lease under (default {@link Requester#current()}: this process
   * with a fresh nonce). Two generators must never share one.
   *
   * @param requester the identity; null for the default
   * @return this builder
   */
  public EmbeddedGeneratorBuilder requester(Requester requester) {
    this.requester = requester;
    return this;
  }

  /**
   * How {@code nextId} and {@code nextIds} spread calls over the machine ids (default {@link
   * Spread#ROUND_ROBIN}); {@link EmbeddedGenerator#pin()} is the third spread.
   *
   * @param spread the spread
   * @return this builder
   */
  public EmbeddedGeneratorBuilder spread(Spread spread) {
    this.spread = spread;
    return this;
  }

  /**
   * The largest backwards wall-clock step a call waits out (default 100 ms); a larger one fails
   * with {@link IdGenerationException.Kind#CLOCK_STEPPED_BACK}.
   *
   * @param maxBackwardWait zero or more, whole milliseconds
   * @return this builder
   */
  public EmbeddedGeneratorBuilder maxBackwardWait(Duration maxBackwardWait) {
    this.maxBackwardWait = maxBackwardWait;
    return this;
  }

  /**
   * The first and the largest sleep between Acquire attempts (default 3 s doubling to 60 s);
   * each sleep is scaled by a random factor in [0.8, 1.2].
   *
   * @param first a positive duration
   * @param max a duration at least {@code first}
   * @return this builder
   */
  public EmbeddedGeneratorBuilder acquireBackoff(Duration first, Duration max) {
    this.acquireBackoff = first;
    this.acquireMaxBackoff = max;
    return this;
  }

  /**
   * Acquire attempts before {@link #start()} gives up with the last error (default 0: retry
   * until it succeeds, or a non-retryable code).
   *
   * @param attempts 0 (unbounded) or more
   * @return this builder
   */
  public EmbeddedGeneratorBuilder acquireAttempts(int attempts) {
    this.acquireAttempts = attempts;
    return this;
  }

  /**
   * The deadline of each Lease API call (default 10 s).
   *
   * @param requestTimeout a positive duration
   * @return this builder
   */
  public EmbeddedGeneratorBuilder requestTimeout(Duration requestTimeout) {
    this.requestTimeout = requestTimeout;
    return this;
  }

  /**
   * Whether Acquire and Renew send the local wall clock ({@code client_time_unix_ms}) so the
   * server checks the skew (default true): Acquire is refused with {@code FAILED_PRECONDITION}
   * when this host's clock is off the server's by more than its {@code
   * --client-skew-threshold}, either way; Renew only warns.
   *
   * @param send whether to send it
   * @return this builder
   */
  public EmbeddedGeneratorBuilder sendClientTime(boolean send) {
    this.sendClientTime = send;
    return this;
  }

  /**
   * The longest start waits for the local clock to pass the granted floor (default 30 s); a
   * clock further behind fails fast with {@link GrantRejectedException.Kind#CLOCK_BEHIND_FLOOR}
   * after releasing the grant.
   *
   * @param maxFloorWait zero or more
   * @return this builder
   */
  public EmbeddedGeneratorBuilder maxFloorWait(Duration maxFloorWait) {
    this.maxFloorWait = maxFloorWait;
    return this;
  }

  /**
   * How often to ask the server ({@code LeaseService.Check}) whether the lease still stands
   * (default 30 s): the longest the generator goes on issuing after etcd lost the state behind
   * it. Zero never checks. An unreachable server is no answer: issuing goes on below the fence.
   *
   * @param checkInterval zero or more
   * @return this builder
   */
  public EmbeddedGeneratorBuilder checkInterval(Duration checkInterval) {
    this.checkInterval = checkInterval;
    return this;
  }

  /**
   * The API key sent as {@code authorization: Bearer <key>} with every Lease API call (a
   * cluster that requires keys needs one with the {@code lease} permission); null sends none.
   * Checked as {@link SnowkeepClientBuilder#apiKey(String)} checks it.
   *
   * @param apiKey printable ASCII without whitespace, or null
   * @return this builder
   */
  public EmbeddedGeneratorBuilder apiKey(String apiKey) {
    this.apiKey = apiKey;
    return this;
  }

  /**
   * TLS settings, as {@link SnowkeepClientBuilder#tls(Path, Path, Path)} takes them: after this
   * the endpoint uses TLS even without {@code https://}.
   *
   * @param caFile PEM CA certificates to trust instead of the system roots, or null
   * @param certFile PEM client certificate for mTLS, or null; needs {@code keyFile}
   * @param keyFile PEM PKCS#8 key of {@code certFile}, or null; needs {@code certFile}
   * @return this builder
   */
  public EmbeddedGeneratorBuilder tls(Path caFile, Path certFile, Path keyFile) {
    this.tls = true;
    this.caFile = caFile;
    this.certFile = certFile;
    this.keyFile = keyFile;
    return this;
  }

  /**
   * The wall clock ids are stamped by and Acquire/Renew report (default the system's, {@link
   * System#currentTimeMillis()}); lease deadlines stay on {@link System#nanoTime()} whatever this
   * is. For a host whose clock must be corrected, or to test the clock rules (the conformance
   * driver's {@code clock_offset_ms} is {@code Clock.offset(Clock.systemUTC(), offset)}).
   *
   * @param wall the wall clock (its {@code millis()} is read), or null for the system's
   * @return this builder
   */
  public EmbeddedGeneratorBuilder wallClock(java.time.Clock wall) {
    this.time = wall == null ? LeaseTime.SYSTEM : LeaseTime.withWallClock(wall);
    return this;
  }

  /** Tests: the clocks, sleeps and scheduler. */
  EmbeddedGeneratorBuilder time(LeaseTime time) {
    this.time = time;
    return this;
  }

  /** Tests: the jitter source, values in [0, 1). */
  EmbeddedGeneratorBuilder random(DoubleSupplier random) {
    this.random = random;
    return this;
  }

  /**
   * Checks the settings, acquires the machine ids (retrying per {@link #acquireBackoff}), waits
   * for the clock to pass the granted floor, starts renewing and checking in the background, and
   * returns the generator, ready to issue. Blocks until then.
   *
   * @return the started generator; close it to release the machine ids
   * @throws SnowkeepException {@code INVALID_ARGUMENT} naming a bad setting ({@code endpoint},
   *     {@code namespace}, {@code machine_ids}, {@code api_key}, {@code tls.*}, a duration); the
   *     Acquire status when it is not retryable ({@code INVALID_ARGUMENT}, {@code
   *     PERMISSION_DENIED} twice, {@code UNAUTHENTICATED}, ...) or when {@link
   *     #acquireAttempts} ran out (the last status)
   * @throws GrantRejectedException when the grant breaks a fail-fast rule (it was released)
   * @throws java.util.concurrent.CancellationException when the thread is interrupted (its flag
   *     is set again; a grant already received is released)
   */
  public EmbeddedGenerator start() {
    if (endpoint == null || endpoint.isBlank()) {
      throw SnowkeepException.invalid("endpoint", "no endpoint given");
    }
    if (namespace == null || namespace.isEmpty()) {
      throw SnowkeepException.invalid("namespace", "no namespace given");
    }
    if (machineIds < 1 || machineIds > 63) {
      throw SnowkeepException.invalid("machine_ids", machineIds + " is outside 1 to 63");
    }
    if (acquireAttempts < 0) {
      throw SnowkeepException.invalid("acquire_attempts", acquireAttempts + " is negative");
    }
    positive("request_timeout", requestTimeout);
    positive("acquire_backoff", acquireBackoff);
    positive("acquire_max_backoff", acquireMaxBackoff);
    if (acquireMaxBackoff.compareTo(acquireBackoff) < 0) {
      throw SnowkeepException.invalid("acquire_max_backoff", acquireMaxBackoff + " is below " + acquireBackoff);
    }
    notNegative("max_backward_wait", maxBackwardWait);
    notNegative("max_floor_wait", maxFloorWait);
    notNegative("check_interval", checkInterval);
    if (spread == null) {
      throw SnowkeepException.invalid("spread", "null");
    }
    return LeaseStart.start(this);
  }

  private static void positive(String name, Duration d) {
    if (d == null || d.isNegative() || d.isZero()) {
      throw SnowkeepException.invalid(name, d + " is not a positive duration");
    }
  }

  private static void notNegative(String name, Duration d) {
    if (d == null || d.isNegative()) {
      throw SnowkeepException.invalid(name, d + " is negative");
    }
  }
}
