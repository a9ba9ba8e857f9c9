package dev.snowkeep.client;

import io.grpc.Status;
import java.util.Arrays;
import java.util.function.DoubleSupplier;
import java.util.function.LongSupplier;

/**
 * The retry rule of one call (not thread-safe; one call drives it at a time): rounds over the
 * endpoints, a backoff sleep of {@code backoff} doubling to {@code maxBackoff} with ±20 %
 * jitter after each full round, and a retry budget that bounds the whole call.
 */
final class RetryState {
  private final Endpoints endpoints;
  private final Settings settings;
  private final LongSupplier clock;
  private final DoubleSupplier random;
  private final boolean[] tried;
  private int triedCount;
  private long nextBackoff;
  private long budgetEnd;
  private Status last = Status.UNAVAILABLE.withDescription("no attempt made");
  private boolean failedBefore;
  private boolean clipped;

  RetryState(Endpoints endpoints, Settings settings, LongSupplier clock, DoubleSupplier random) {
    this.endpoints = endpoints;
    this.settings = settings;
    this.clock = clock;
    this.random = random;
    this.tried = new boolean[endpoints.size()];
    restart();
  }

  /**
   * Restarts the budget, the round and the backoff (a stream does this on each batch), and
   * forgets the failures before: the batch shows they healed, so a spent budget later reports
   * only what failed after it.
   */
  void restart() {
    Arrays.fill(tried, false);
    triedCount = 0;
    nextBackoff = settings.backoffNanos;
    budgetEnd = clock.getAsLong() + settings.retryBudgetNanos;
    failedBefore = false;
    clipped = false;
  }

  /**
   * The deadline of the next attempt, in nanoseconds from now: the smaller of the request
   * timeout and the budget left; 0 or less when the budget is spent.
   */
  long attemptTimeout() {
    long left = budgetEnd - clock.getAsLong();
    clipped = left < settings.requestTimeoutNanos;
    return Math.min(settings.requestTimeoutNanos, left);
  }

  /** Chooses the endpoint of the next attempt and marks it tried in this round. */
  int pick() {
    int i = endpoints.pick(tried);
    tried[i] = true;
    triedCount++;
    return i;
  }

  /**
   * Records a retryable failure of an attempt on endpoint {@code i}.
   *
   * @return the nanoseconds to wait before the next attempt (0: at once), or -1 when the
   *     budget does not allow one more attempt
   */
  long failed(int i, Status status) {
    // An attempt whose deadline the budget cut short ran out of budget, not of server time:
    // the error worth reporting is the one before it.
    if (!(clipped && failedBefore && status.getCode() == Status.Code.DEADLINE_EXCEEDED)) {
      last = status;
    }
    failedBefore = true;
    endpoints.failed(i);
    long now = clock.getAsLong();
    if (triedCount < tried.length) {
      return budgetEnd - now > 0 ? 0 : -1;
    }
    Arrays.fill(tried, false);
    triedCount = 0;
    double factor = 0.8 + 0.4 * random.getAsDouble();
    long sleep = (long) (nextBackoff * factor);
    nextBackoff = Math.min(nextBackoff * 2, settings.maxBackoffNanos);
    return now + sleep - budgetEnd < 0 ? sleep : -1;
  }

  /** The error to surface once the budget is spent: the last retryable status. */
  SnowkeepException lastError() {
    return SnowkeepException.of(last);
  }
}
