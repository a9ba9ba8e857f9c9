package dev.snowkeep.client;

import io.grpc.Status;

/**
 * Why an embedded generator issued no id now, though it has not stopped for good (that is
 * {@link GeneratorStoppedException}). These are the generator's rules (docs/design.md, the
 * safety invariant and the fence protocol), the same as the Rust generator's {@code
 * GenerateError}. Every kind but {@link Kind#LAYOUT_EXHAUSTED} is transient: its code is {@code
 * UNAVAILABLE}, and a later call may succeed.
 */
public final class IdGenerationException extends SnowkeepException {
  private static final long serialVersionUID = 1L;

  /** Which rule refused the id. */
  public enum Kind {
    /** No grant is held for the machine id (the lease is not, or no longer, held). */
    NO_GRANT,
    /** The grant's local deadline passed (monotonic clock) before a renewal arrived. */
    LEASE_EXPIRED,
    /**
     * The clock has not passed the floor (the machine id's previous holders' fences; fence
     * protocol rule 3), for instance after a backwards step.
     */
    CLOCK_BEHIND_FLOOR,
    /** The clock reached the persisted fence and no renewal raised it (fence protocol rule 1). */
    FENCE_REACHED,
    /**
     * The wall clock stepped back by more than {@link EmbeddedGeneratorBuilder#maxBackwardWait}
     * (a smaller step is waited out).
     */
    CLOCK_STEPPED_BACK,
    /** The wall clock reads earlier than the layout's epoch. */
    CLOCK_BEFORE_EPOCH,
    /** The clock is past the last timestamp the layout can carry; permanent. */
    LAYOUT_EXHAUSTED
  }

  /** Which rule refused. */
  private final Kind kind;

  IdGenerationException(Kind kind, String detail) {
    super(kind == Kind.LAYOUT_EXHAUSTED ? Status.Code.FAILED_PRECONDITION : Status.Code.UNAVAILABLE,
        "no id (" + kind + "): " + detail);
    this.kind = kind;
  }

  /**
   * Which rule refused the id.
   *
   * @return the rule, never null
   */
  public Kind kind() {
    return kind;
  }

  /**
   * Whether a later call may succeed: true for every kind but {@link Kind#LAYOUT_EXHAUSTED}.
   *
   * @return whether to retry later
   */
  public boolean retryable() {
    return kind != Kind.LAYOUT_EXHAUSTED;
  }
}
