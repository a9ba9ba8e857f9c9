package dev.snowkeep.client;

/**
 * Why an {@link EmbeddedGenerator} stopped issuing for good. Once stopped, every {@code nextId}
 * throws {@link GeneratorStoppedException} with this reason, and {@link
 * EmbeddedGenerator#stopped()} completes with it. The rules are the Lease API contract's
 * (docs/api.md, "EmbeddedGenerator follows the Lease API contract"), the same as the Rust
 * client's {@code StopReason}.
 */
public enum StopReason {
  /**
   * A Renew answered with no machine ids, or a Check answered {@code LEASE_GONE}: the server
   * holds no lease for this requester any more.
   */
  LEASE_GONE("the server holds no lease for this requester any more"),
  /**
   * A Renew or a Check was refused with {@code PERMISSION_DENIED}: the server holds this
   * requester's machine ids under another lease token, so they are not this generator's.
   */
  TOKEN_REFUSED("the server refused this generator's lease token: its machine ids are no longer its own"),
  /** A Renew answered with other machine ids (or another count of them) than the ones held. */
  MACHINE_IDS_CHANGED("the server renewed other machine ids than the ones held"),
  /**
   * The lease passed its local deadline (counted on the monotonic clock from when the request
   * that granted it was sent) before a renewal succeeded, or a Renew granted no time.
   */
  EXPIRED("the lease expired by the local clock before a renewal succeeded"),
  /** {@link EmbeddedGenerator#close()} (or {@code shutdown()}) was called. */
  SHUT_DOWN("the generator was shut down"),
  /**
   * After a renewal the local clock was already past a renewed fence: this host's clock runs
   * ahead of the server's by more than the lease covers. The machine ids were released.
   */
  CLOCK_PAST_FENCE("the local clock is past the renewed fence (ahead of the server's by more than the lease covers); the machine ids were released: sync this host with NTP"),
  /**
   * A Check or Renew said the namespace no longer exists as granted (deleted, or created again:
   * etcd lost the state behind the lease).
   */
  NAMESPACE_GONE("the namespace no longer exists as granted (etcd lost its state)"),
  /**
   * A Check or Renew said etcd was restored from an older snapshot: the namespace is rolled back
   * until an operator confirms a floor.
   */
  NAMESPACE_ROLLED_BACK("etcd was restored from an older snapshot; the namespace is rolled back");

  private final String description;

  StopReason(String description) {
    this.description = description;
  }

  /**
   * A sentence for a log.
   *
   * @return what happened, never null
   */
  public String description() {
    return description;
  }
}
