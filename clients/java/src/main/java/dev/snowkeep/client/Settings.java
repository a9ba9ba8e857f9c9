package dev.snowkeep.client;

/** The client's timing settings, in nanoseconds; immutable. */
final class Settings {
  final long requestTimeoutNanos;
  final long retryBudgetNanos;
  final long backoffNanos;
  final long maxBackoffNanos;

  Settings(long requestTimeoutNanos, long retryBudgetNanos, long backoffNanos, long maxBackoffNanos) {
    this.requestTimeoutNanos = requestTimeoutNanos;
    this.retryBudgetNanos = retryBudgetNanos;
    this.backoffNanos = backoffNanos;
    this.maxBackoffNanos = maxBackoffNanos;
  }
}
