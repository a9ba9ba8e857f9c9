package dev.snowkeep.client;

import io.grpc.ManagedChannel;
import java.util.Locale;

/**
 * One server of a client: its address, its channel and its ejection state. Package-private;
 * the ejection state is guarded by the {@link Endpoints} that owns it.
 */
final class Endpoint {
  /** Host name or IP literal (without the brackets of an IPv6 literal). */
  final String host;

  /** TCP port, 1 to 65535. */
  final int port;

  /** True when the endpoint was given as {@code https://}. */
  final boolean tls;

  /** The endpoint as the caller wrote it, for messages. */
  final String text;

  /** The channel to it, opened lazily by gRPC; set once by the client. */
  ManagedChannel channel;

  /** Consecutive retryable failures; 0 when the last attempt succeeded. */
  int failures;

  /** {@link System#nanoTime()} at which the ejection ends; meaningful while failures > 0. */
  long ejectedUntil;

  private Endpoint(String host, int port, boolean tls, String text) {
    this.host = host;
    this.port = port;
    this.tls = tls;
    this.text = text;
  }

  /**
   * Parses {@code host:port}, {@code http://host:port} or {@code https://host:port}.
   *
   * @param text the endpoint
   * @param tlsDefault whether a bare {@code host:port} uses TLS (it does when TLS settings
   *     were given)
   * @return the endpoint
   * @throws SnowkeepException INVALID_ARGUMENT naming {@code endpoints} and the value
   */
  static Endpoint parse(String text, boolean tlsDefault) {
    if (text == null) {
      throw SnowkeepException.invalid("endpoints", "null endpoint");
    }
    for (int i = 0; i < text.length(); i++) {
      if (Character.isWhitespace(text.charAt(i)) || Character.isISOControl(text.charAt(i))) {
        throw bad(text, "whitespace or a control character at position " + (i + 1));
      }
    }
    String rest = text;
    boolean tls = tlsDefault;
    String lower = rest.toLowerCase(Locale.ROOT);
    if (lower.startsWith("http://")) {
      tls = false;
      rest = rest.substring(7);
    } else if (lower.startsWith("https://")) {
      tls = true;
      rest = rest.substring(8);
    } else if (rest.contains("://")) {
      throw bad(text, "the scheme must be http or https");
    }
    if (rest.endsWith("/")) {
      rest = rest.substring(0, rest.length() - 1);
    }
    if (rest.isEmpty() || rest.contains("/") || rest.contains("@") || rest.contains("?")) {
      throw bad(text, "expected host:port, http://host:port or https://host:port");
    }
    int colon = rest.lastIndexOf(':');
    if (colon < 0) {
      throw bad(text, "no port");
    }
    String host = rest.substring(0, colon);
    String portText = rest.substring(colon + 1);
    if (host.startsWith("[") && host.endsWith("]")) {
      host = host.substring(1, host.length() - 1);
    } else if (host.contains(":")) {
      throw bad(text, "an IPv6 address must be in brackets, e.g. [::1]:50051");
    }
    if (host.isEmpty() || host.contains("[") || host.contains("]") || host.contains(" ")) {
      throw bad(text, "no host");
    }
    return new Endpoint(host, parsePort(text, portText), tls, text);
  }

  private static int parsePort(String text, String portText) {
    if (portText.isEmpty() || portText.length() > 5 || !portText.chars().allMatch(Character::isDigit)) {
      throw bad(text, "the port must be a number from 1 to 65535");
    }
    int port = Integer.parseInt(portText);
    if (port < 1 || port > 65535) {
      throw bad(text, "the port must be a number from 1 to 65535");
    }
    return port;
  }

  private static SnowkeepException bad(String text, String why) {
    return SnowkeepException.invalid("endpoints", "invalid endpoint \"" + text + "\": " + why);
  }

  @Override
  public String toString() {
    return text;
  }
}
