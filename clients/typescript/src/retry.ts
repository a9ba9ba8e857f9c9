/**
 * The retry rule every snowkeep client follows: attempts go to the endpoints
 * in round-robin order (ejected ones skipped); after a retryable failure the
 * next attempt goes to the next endpoint at once, and after a round in which
 * every endpoint failed the client sleeps `backoff` (doubling per round up to
 * `maxBackoff`, each sleep scaled by a random factor in [0.8, 1.2]). The
 * retry budget bounds the whole call: no attempt starts and no sleep ends
 * after it, and then the call fails with the last retryable error.
 */

import { status as Status, type ServiceError } from "@grpc/grpc-js";

import { AbortError, fromGrpcError, SnowkeepError, throwIfAborted } from "./errors.js";
import type { Settings } from "./options.js";
import { now, type Server, type Servers } from "./servers.js";

/** The "client closed" error of a call on a closed client. */
export function clientClosed(): SnowkeepError {
  return new SnowkeepError(Status.FAILED_PRECONDITION, "client closed", { retryable: false });
}

/** Resolves after `ms`, or rejects with an {@link AbortError} when `signal` aborts first. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(new AbortError(undefined, signal.reason));
      return;
    }
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(new AbortError(undefined, signal?.reason));
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** `ms` scaled by a random factor in [0.8, 1.2] (±20 % jitter); `random` returns [0, 1). */
export function jittered(ms: number, random: () => number = Math.random): number {
  return ms * (0.8 + random() * 0.4);
}

/**
 * One attempt to make: its server, its deadline in ms, and whether that
 * deadline is the budget left rather than `requestTimeoutMs` (cut short).
 */
export interface Attempt {
  readonly server: Server;
  readonly timeoutMs: number;
  readonly cut: boolean;
}

/** The attempts of one call under the retry rule. */
export class Attempts {
  private budgetEnd = 0;
  private delay = 0;
  private triedInRound = 0;
  private last: SnowkeepError | null = null;

  constructor(
    private readonly servers: Servers,
    private readonly settings: Settings,
    private readonly signal: AbortSignal | undefined,
  ) {
    this.restart();
  }

  /**
   * Starts the budget, the backoff and the round over (a stream's batch
   * arrived), and forgets the failures before: the batch shows they healed,
   * so a spent budget later reports only what failed after it.
   */
  restart(): void {
    this.budgetEnd = now() + this.settings.retryBudgetMs;
    this.delay = this.settings.backoffMs;
    this.triedInRound = 0;
    this.last = null;
  }

  /**
   * The longest the next wait for a stream's batch may last: the smaller of
   * `requestTimeoutMs` and the budget left, and whether the budget is the
   * smaller (the wait is then cut short by it).
   */
  batchWait(): { timeoutMs: number; cut: boolean } {
    const left = this.budgetEnd - now();
    const cut = left < this.settings.requestTimeoutMs;
    return { timeoutMs: Math.max(1, Math.ceil(cut ? left : this.settings.requestTimeoutMs)), cut };
  }

  /**
   * The next attempt, after the backoff sleep when a whole round failed.
   * Rejects with the last retryable error once the budget is spent, with
   * an {@link AbortError} when the caller aborts, and with "client closed".
   */
  async next(): Promise<Attempt> {
    this.check();
    if (this.triedInRound >= this.servers.list.length) {
      const pause = jittered(this.delay);
      this.delay = Math.min(this.delay * 2, this.settings.maxBackoffMs);
      this.triedInRound = 0;
      if (now() + pause >= this.budgetEnd) {
        throw this.spent();
      }
      await sleep(pause, this.signal);
      this.check();
    }
    const left = this.budgetEnd - now();
    if (this.last !== null && left <= 0) {
      throw this.spent();
    }
    const cut = left > 0 && left < this.settings.requestTimeoutMs;
    const timeoutMs = cut ? left : this.settings.requestTimeoutMs;
    return { server: this.servers.pick(), timeoutMs: Math.max(1, Math.ceil(timeoutMs)), cut };
  }

  /**
   * Records a failed attempt: rethrows an abort or a non-retryable error,
   * ejects the server after a retryable one. `cut` says the attempt's
   * deadline was the budget's end: its DEADLINE_EXCEEDED then ran out of
   * budget, not of server time, and the failure before it stays the one a
   * spent budget reports.
   */
  failed(server: Server, err: unknown, cut = false): void {
    if (err instanceof AbortError) {
      throw err;
    }
    throwIfAborted(this.signal);
    if (this.servers.closed) {
      throw clientClosed();
    }
    const e = fromGrpcError(err);
    if (!e.retryable) {
      throw e;
    }
    this.servers.eject(server);
    if (!(cut && e.code === Status.DEADLINE_EXCEEDED && this.last !== null)) {
      this.last = e;
    }
    this.triedInRound += 1;
  }

  /** Records a successful attempt: clears the server's ejection. */
  succeeded(server: Server): void {
    this.servers.clear(server);
  }

  private check(): void {
    throwIfAborted(this.signal);
    if (this.servers.closed) {
      throw clientClosed();
    }
  }

  private spent(): SnowkeepError {
    return this.last ?? new SnowkeepError(Status.DEADLINE_EXCEEDED, "the retry budget was spent before any attempt");
  }
}

/** A grpc-js unary call: starts with its metadata, deadline and callback; returns the call. */
export type UnaryStart<T> = (
  options: { deadline: Date },
  callback: (err: ServiceError | null, value?: T) => void,
) => { cancel(): void };

/** Runs one unary attempt, cancelling it when `signal` aborts. */
export function unaryAttempt<T>(start: UnaryStart<T>, timeoutMs: number, signal?: AbortSignal): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    let done = false;
    const onAbort = (): void => {
      if (!done) {
        done = true;
        call.cancel();
        reject(new AbortError(undefined, signal?.reason));
      }
    };
    const call = start({ deadline: new Date(Date.now() + timeoutMs) }, (err, value) => {
      signal?.removeEventListener("abort", onAbort);
      if (done) {
        return;
      }
      done = true;
      if (err) {
        reject(err);
      } else {
        resolve(value as T);
      }
    });
    signal?.addEventListener("abort", onAbort, { once: true });
    if (signal?.aborted) {
      onAbort();
    }
  });
}

/** Runs `attempt` under the retry rule until it succeeds or fails for good. */
export async function withRetries<T>(
  servers: Servers,
  settings: Settings,
  signal: AbortSignal | undefined,
  attempt: (a: Attempt) => Promise<T>,
): Promise<T> {
  const attempts = new Attempts(servers, settings, signal);
  for (;;) {
    const a = await attempts.next();
    let value: T;
    try {
      value = await attempt(a);
    } catch (err) {
      attempts.failed(a.server, err, a.cut);
      continue;
    }
    attempts.succeeded(a.server);
    return value;
  }
}
