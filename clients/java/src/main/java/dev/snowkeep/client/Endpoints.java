package dev.snowkeep.client;

import java.util.List;
import java.util.function.LongSupplier;

/**
 * The endpoints of a client with their ejection state: round-robin choice that skips an
 * ejected endpoint, and ejection for {@code backoff} doubling per consecutive retryable failure
 * up to {@code maxBackoff}. Thread-safe.
 */
final class Endpoints {
  private final List<Endpoint> all;
  private final long backoffNanos;
  private final long maxBackoffNanos;
  private final LongSupplier clock;
  private int cursor;

  Endpoints(List<Endpoint> all, long backoffNanos, long maxBackoffNanos, LongSupplier clock) {
    this.all = List.copyOf(all);
    this.backoffNanos = backoffNanos;
    this.maxBackoffNanos = maxBackoffNanos;
    this.clock = clock;
  }

  /** The endpoints in the order given. */
  List<Endpoint> all() {
    return all;
  }

  /** How many endpoints there are (at least 1). */
  int size() {
    return all.size();
  }

  /**
   * The next endpoint to try: in round-robin order from the shared cursor, the first one not in
   * {@code tried} and not ejected; when every untried one is ejected, the untried one whose
   * ejection ends first.
   *
   * @param tried per endpoint index, true when already tried in this round (not all true)
   * @return the index of the chosen endpoint
   */
  synchronized int pick(boolean[] tried) {
    long now = clock.getAsLong();
    int n = all.size();
    int best = -1;
    for (int k = 0; k < n; k++) {
      int i = (cursor + k) % n;
      if (tried[i]) {
        continue;
      }
      Endpoint e = all.get(i);
      if (e.failures == 0 || e.ejectedUntil - now <= 0) {
        cursor = (i + 1) % n;
        return i;
      }
      if (best < 0 || e.ejectedUntil - all.get(best).ejectedUntil < 0) {
        best = i;
      }
    }
    cursor = (best + 1) % n;
    return best;
  }

  /** Whether endpoint {@code i} has failed since its last success (its channel may back off). */
  synchronized boolean hasFailed(int i) {
    return all.get(i).failures > 0;
  }

  /** Clears the ejection of endpoint {@code i} after a success. */
  synchronized void succeeded(int i) {
    all.get(i).failures = 0;
  }

  /** Ejects endpoint {@code i} after a retryable failure: backoff × 2^(failures − 1), capped. */
  synchronized void failed(int i) {
    Endpoint e = all.get(i);
    e.failures++;
    long d = backoffNanos;
    for (int k = 1; k < e.failures && d < maxBackoffNanos; k++) {
      d *= 2;
    }
    e.ejectedUntil = clock.getAsLong() + Math.min(d, maxBackoffNanos);
  }
}
