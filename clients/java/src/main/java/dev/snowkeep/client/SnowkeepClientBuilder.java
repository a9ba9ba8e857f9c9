package dev.snowkeep.client;

import io.grpc.ChannelCredentials;
import io.grpc.TlsChannelCredentials;
import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.cert.CertificateException;
import java.security.cert.CertificateFactory;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/**
 * Builds a {@link SnowkeepClient}. Every setting is checked by {@link #build()}, before any
 * call: a bad value fails with {@link SnowkeepException} INVALID_ARGUMENT naming the parameter.
 *
 * <pre>{@code
 * try (SnowkeepClient client = SnowkeepClient.builder()
 *     .endpoints("http://10.0.0.1:50051", "http://10.0.0.2:50051")
 *     .apiKey(System.getenv("SNOWKEEP_API_KEY"))
 *     .build()) {
 *   long[] ids = client.nextIds(10);
 * }
 * }</pre>
 */
public final class SnowkeepClientBuilder {
  private final List<String> endpoints = new ArrayList<>();
  private String apiKey;
  private Path caFile;
  private Path certFile;
  private Path keyFile;
  private boolean tls;
  private Duration requestTimeout = Duration.ofSeconds(5);
  private Duration retryBudget = Duration.ofSeconds(10);
  private Duration backoff = Duration.ofMillis(20);
  private Duration maxBackoff = Duration.ofSeconds(1);

  SnowkeepClientBuilder() {}

  /**
   * Adds endpoints: {@code host:port}, {@code http://host:port} or {@code https://host:port}
   * ({@code https} means TLS; a bare {@code host:port} uses TLS when {@link #tls} was called).
   *
   * @param endpoints one or more endpoints
   * @return this builder
   */
  public SnowkeepClientBuilder endpoints(String... endpoints) {
    return endpoints(Arrays.asList(endpoints));
  }

  /**
   * Adds endpoints, as {@link #endpoints(String...)}.
   *
   * @param endpoints one or more endpoints
   * @return this builder
   */
  public SnowkeepClientBuilder endpoints(List<String> endpoints) {
    this.endpoints.addAll(endpoints);
    return this;
  }

  /**
   * The API key sent as {@code authorization: Bearer <key>} on every call; null sends none.
   *
   * @param apiKey printable ASCII without whitespace, or null
   * @return this builder
   */
  public SnowkeepClientBuilder apiKey(String apiKey) {
    this.apiKey = apiKey;
    return this;
  }

  /**
   * TLS settings for {@code https://} endpoints (and bare {@code host:port} ones).
   *
   * @param caFile PEM file of the CA certificates to trust instead of the system roots, or null
   *     for the system roots
   * @param certFile PEM client certificate (chain) for mTLS, or null; needs {@code keyFile}
   * @param keyFile PEM PKCS#8 private key of {@code certFile}, or null; needs {@code certFile}
   * @return this builder
   */
  public SnowkeepClientBuilder tls(Path caFile, Path certFile, Path keyFile) {
    this.tls = true;
    this.caFile = caFile;
    this.certFile = certFile;
    this.keyFile = keyFile;
    return this;
  }

  /**
   * The deadline of each attempt (default 5 s); an attempt's deadline is the smaller of this
   * and the retry budget left.
   *
   * @param requestTimeout a positive duration
   * @return this builder
   */
  public SnowkeepClientBuilder requestTimeout(Duration requestTimeout) {
    this.requestTimeout = requestTimeout;
    return this;
  }

  /**
   * The bound of a whole call with its retries (default 10 s): no attempt starts and no sleep
   * ends after it.
   *
   * @param retryBudget a positive duration
   * @return this builder
   */
  public SnowkeepClientBuilder retryBudget(Duration retryBudget) {
    this.retryBudget = retryBudget;
    return this;
  }

  /**
   * The first backoff sleep after a full round of failures, and the first ejection of a failed
   * endpoint (default 20 ms); both double up to {@link #maxBackoff}.
   *
   * @param backoff a positive duration
   * @return this builder
   */
  public SnowkeepClientBuilder backoff(Duration backoff) {
    this.backoff = backoff;
    return this;
  }

  /**
   * The largest backoff sleep and ejection (default 1 s).
   *
   * @param maxBackoff a duration at least {@link #backoff}
   * @return this builder
   */
  public SnowkeepClientBuilder maxBackoff(Duration maxBackoff) {
    this.maxBackoff = maxBackoff;
    return this;
  }

  /**
   * Checks the settings and builds the client. No connection opens until the first call.
   *
   * @return the client
   * @throws SnowkeepException INVALID_ARGUMENT naming the parameter ({@code endpoints},
   *     {@code api_key}, {@code tls.ca}, {@code tls.cert}, {@code tls.key}, {@code
   *     request_timeout}, {@code retry_budget}, {@code backoff}, {@code max_backoff}) and the
   *     value
   */
  public SnowkeepClient build() {
    List<Endpoint> parsed = SnowkeepClient.parseAll(endpoints, tls);
    checkApiKey(apiKey);
    long timeout = positive("request_timeout", requestTimeout);
    long budget = positive("retry_budget", retryBudget);
    long first = positive("backoff", backoff);
    long max = positive("max_backoff", maxBackoff);
    if (max < first) {
      throw SnowkeepException.invalid("max_backoff", maxBackoff + " is below backoff " + backoff);
    }
    ChannelCredentials creds = credentials(tls, caFile, certFile, keyFile);
    return new SnowkeepClient(new Core(parsed, new Settings(timeout, budget, first, max), creds, apiKey));
  }

  /** Refuses an API key that is empty or not printable ASCII without whitespace. */
  static void checkApiKey(String key) {
    if (key == null) {
      return;
    }
    if (key.isEmpty()) {
      throw SnowkeepException.invalid("api_key", "empty key");
    }
    for (int i = 0; i < key.length(); i++) {
      char c = key.charAt(i);
      if (c <= ' ' || c >= 0x7f) {
        throw SnowkeepException.invalid(
            "api_key", "the key has whitespace or a non-ASCII character at position " + (i + 1));
      }
    }
  }

  private static long positive(String name, Duration d) {
    if (d == null || d.isNegative() || d.isZero()) {
      throw SnowkeepException.invalid(name, d + " is not a positive duration");
    }
    return d.toNanos();
  }

  /**
   * The credentials of the endpoints that use TLS ({@code https://}, or all after {@code tls});
   * the embedded generator's builder shares this rule.
   */
  static ChannelCredentials credentials(boolean tls, Path caFile, Path certFile, Path keyFile) {
    if (!tls) {
      // https:// endpoints without tls(...): TLS with the system's roots, never plaintext.
      return TlsChannelCredentials.create();
    }
    if (certFile != null && keyFile == null) {
      throw SnowkeepException.invalid("tls.key", "a client certificate (" + certFile + ") needs its key");
    }
    if (keyFile != null && certFile == null) {
      throw SnowkeepException.invalid("tls.cert", "a client key (" + keyFile + ") needs its certificate");
    }
    TlsChannelCredentials.Builder b = TlsChannelCredentials.newBuilder();
    if (caFile != null) {
      byte[] ca = read("tls.ca", caFile);
      checkCertificates(caFile, ca);
      try {
        b.trustManager(new ByteArrayInputStream(ca));
      } catch (IOException | RuntimeException e) {
        throw SnowkeepException.invalid("tls.ca", "cannot use " + caFile + ": " + e.getMessage());
      }
    }
    if (certFile != null) {
      byte[] cert = read("tls.cert", certFile);
      byte[] key = read("tls.key", keyFile);
      try {
        b.keyManager(new ByteArrayInputStream(cert), new ByteArrayInputStream(key));
      } catch (IOException | RuntimeException e) {
        throw SnowkeepException.invalid(
            "tls.cert", "cannot use " + certFile + " with " + keyFile + ": " + e.getMessage());
      }
    }
    return b.build();
  }

  /** Refuses a CA file with no X.509 certificate in it, naming {@code tls.ca}. */
  private static void checkCertificates(Path path, byte[] pem) {
    try {
      if (!CertificateFactory.getInstance("X.509")
          .generateCertificates(new ByteArrayInputStream(pem)).isEmpty()) {
        return;
      }
    } catch (CertificateException e) {
      throw SnowkeepException.invalid("tls.ca", path + " is not a PEM certificate: " + e.getMessage());
    }
    throw SnowkeepException.invalid("tls.ca", path + " holds no PEM certificate");
  }

  private static byte[] read(String name, Path path) {
    try {
      return Files.readAllBytes(path);
    } catch (IOException | RuntimeException e) {
      throw SnowkeepException.invalid(name, "cannot read " + path + ": " + e);
    }
  }
}
