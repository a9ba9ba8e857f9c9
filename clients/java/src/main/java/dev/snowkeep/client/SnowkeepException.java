package dev.snowkeep.client;

import io.grpc.Status;

/**
 * The one error type of the snowkeep client: a gRPC status code and a message.
 *
 * <p>It is thrown for a server's refusal (the code and message the server sent), for a
 * retryable failure once the retry budget is spent (the last attempt's code and message), and
 * for errors the client raises itself before any call: {@link Status.Code#INVALID_ARGUMENT}
 * for a bad count, endpoint, API key or TLS file (the message names the parameter), and
 * {@link Status.Code#FAILED_PRECONDITION} for a closed client or pool.
 *
 * <p>A cancellation of the caller's own is not reported with this type: it is the standard
 * {@link java.util.concurrent.CancellationException}.
 *
 * <p>The embedded generator throws three subclasses, each with the code it stands for: {@link
 * GrantRejectedException} (a grant refused at start), {@link IdGenerationException} (no id
 * now) and {@link GeneratorStoppedException} (issuance stopped for good).
 */
public class SnowkeepException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  /** The code; never null. */
  private final Status.Code code;

  /** The message as the server (or the client) wrote it, without the code. */
  private final String description;

  /**
   * An error with {@code code} and {@code description}.
   *
   * @param code the gRPC status code
   * @param description the server's message, or the client's own
   */
  public SnowkeepException(Status.Code code, String description) {
    super(code.name() + ": " + description);
    this.code = code;
    this.description = description;
  }

  /**
   * An error carrying a gRPC {@link Status}'s code and description.
   *
   * @param status the status a call ended with
   * @return the error
   */
  static SnowkeepException of(Status status) {
    String d = status.getDescription();
    if (d == null) {
      d = status.getCause() != null ? String.valueOf(status.getCause()) : "";
    }
    return new SnowkeepException(status.getCode(), d);
  }

  /**
   * An {@code INVALID_ARGUMENT} error for a parameter the client refuses before any call.
   *
   * @param parameter the parameter's name, e.g. {@code count} or {@code endpoints}
   * @param why what is wrong, naming the value
   * @return the error
   */
  static SnowkeepException invalid(String parameter, String why) {
    return new SnowkeepException(Status.Code.INVALID_ARGUMENT, parameter + ": " + why);
  }

  /**
   * The gRPC status code, e.g. {@code UNAVAILABLE} or {@code INVALID_ARGUMENT}.
   *
   * @return the code, never null
   */
  public Status.Code code() {
    return code;
  }

  /**
   * The message without the code: the server's own text for a server's status.
   *
   * @return the message, never null
   */
  public String description() {
    return description;
  }

  /**
   * Whether the client retries this code on another endpoint: {@code UNAVAILABLE},
   * {@code DEADLINE_EXCEEDED}, {@code UNKNOWN}, {@code CANCELLED}, {@code RESOURCE_EXHAUSTED},
   * {@code ABORTED}, {@code INTERNAL}, {@code FAILED_PRECONDITION} and {@code NOT_FOUND}.
   *
   * @param code a gRPC status code
   * @return true for the retryable codes listed above
   */
  public static boolean isRetryable(Status.Code code) {
    switch (code) {
      case UNAVAILABLE:
      case DEADLINE_EXCEEDED:
      case UNKNOWN:
      case CANCELLED:
      case RESOURCE_EXHAUSTED:
      case ABORTED:
      case INTERNAL:
      case FAILED_PRECONDITION:
      case NOT_FOUND:
        return true;
      default:
        return false;
    }
  }
}
