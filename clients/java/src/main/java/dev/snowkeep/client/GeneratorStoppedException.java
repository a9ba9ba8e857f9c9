package dev.snowkeep.client;

import io.grpc.Status;

/**
 * Thrown by every {@code nextId}/{@code nextIds} of an {@link EmbeddedGenerator} (and its
 * {@link Worker}s) once issuance stopped for good; {@link #reason()} says why. Its code is
 * {@code FAILED_PRECONDITION}: no retry of the same generator can succeed. Start a new generator
 * (a new requester) to go on.
 */
public final class GeneratorStoppedException extends SnowkeepException {
  private static final long serialVersionUID = 1L;

  /** Why issuance stopped. */
  private final StopReason reason;

  /**
   * An error for a generator stopped for {@code reason}.
   *
   * @param reason why issuance stopped; never null
   * @param detail more about it (the server's words, a duration), or null
   */
  public GeneratorStoppedException(StopReason reason, String detail) {
    super(Status.Code.FAILED_PRECONDITION,
        "embedded generator stopped (" + reason + "): " + reason.description()
            + (detail == null || detail.isEmpty() ? "" : " (" + detail + ")"));
    this.reason = reason;
  }

  /**
   * Why issuance stopped.
   *
   * @return the reason, never null
   */
  public StopReason reason() {
    return reason;
  }
}
