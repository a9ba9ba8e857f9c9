package dev.snowkeep.client;

import io.grpc.Status;

/**
 * Thrown by {@link EmbeddedGeneratorBuilder#start()} when Acquire granted machine ids the
 * generator cannot use: the fail-fast rules of the Lease API contract (docs/api.md, "Start").
 * The grant was released (Release with no timestamps) before this was thrown, so nothing stays
 * held. Its code is {@code FAILED_PRECONDITION}; retrying the same start is not expected to
 * help until the cause (a server misconfiguration, this host's clock) is fixed.
 */
public final class GrantRejectedException extends SnowkeepException {
  private static final long serialVersionUID = 1L;

  /** Which rule refused the grant. */
  public enum Kind {
    /** The grant has no layout, or one the layout rules refuse ({@link IdLayout#problem()}). */
    INVALID_LAYOUT,
    /** A granted machine id does not fit the layout's machine bits. */
    MACHINE_ID_OUT_OF_RANGE,
    /**
     * The grant holds another number of machine ids than asked for, or one machine id twice (a
     * check the Rust client does not make; two slots on one machine id would issue equal ids).
     */
    GRANT_COUNT,
    /** The grant is already expired ({@code expires_in_ms} is 0). */
    GRANT_EXPIRED,
    /**
     * The local clock is already past a granted fence: it runs ahead of the server's by more
     * than the lease covers, and could stamp nothing.
     */
    CLOCK_PAST_FENCE,
    /**
     * The local clock is further behind the granted floor (the previous holders' fences) than
     * {@link EmbeddedGeneratorBuilder#maxFloorWait} (30 s by default), or than the lease lasts.
     */
    CLOCK_BEHIND_FLOOR
  }

  /** Which rule refused. */
  private final Kind kind;

  GrantRejectedException(Kind kind, String detail) {
    super(Status.Code.FAILED_PRECONDITION, "grant refused (" + kind + "): " + detail);
    this.kind = kind;
  }

  /**
   * Which rule refused the grant.
   *
   * @return the rule, never null
   */
  public Kind kind() {
    return kind;
  }
}
