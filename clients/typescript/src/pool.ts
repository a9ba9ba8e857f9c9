/**
 * The prefetching pool: `next()` hands out one id from a local buffer that a
 * background refill keeps above its low-water mark.
 */

import { status as Status } from "@grpc/grpc-js";

import { AbortError, invalidArgument, SnowkeepError, throwIfAborted } from "./errors.js";
import { checkCount } from "./options.js";
import { now } from "./servers.js";

/** Settings of an {@link IdPool}. */
export interface PoolOptions {
  /** Ids fetched per refill, 1 to 100000 (default 100). */
  batch?: number;
  /** Refill when this many ids or fewer are buffered, 0 to `batch - 1` (default `floor(batch / 4)`). */
  lowWater?: number;
  /** Ids older than this (ms, counted from their fetch) are dropped, never handed out (default 600000, 10 minutes). */
  maxAgeMs?: number;
}

/** Fetches `count` ids (the client's `nextIds` with the pool's signal). */
export type Fetch = (count: number, signal: AbortSignal) => Promise<bigint[]>;

interface Batch {
  readonly ids: bigint[];
  readonly fetchedAt: number;
  pos: number;
}

/**
 * A prefetching pool of ids over one client. It fetches `batch` ids with
 * `nextIds` at its start and whenever `lowWater` ids or fewer are buffered,
 * at most one refill at a time. Ids come out ascending within each fetched
 * batch (batches may come from different servers). Build it with
 * `client.pool()`; call {@link IdPool.close} when done.
 */
export class IdPool {
  /** Ids fetched per refill. */
  readonly batch: number;
  /** The low-water mark: a refill starts at this many buffered ids or fewer. */
  readonly lowWater: number;
  /** The longest an id stays usable after its fetch, ms. */
  readonly maxAgeMs: number;
  private readonly batches: Batch[] = [];
  private size = 0;
  private refill: Promise<void> | null = null;
  private lastError: unknown = null;
  private closedFlag = false;
  private readonly stop = new AbortController();

  /** Use `client.pool(options)`. */
  constructor(
    private readonly fetch: Fetch,
    options: PoolOptions = {},
  ) {
    this.batch = checkCount("batch", options.batch ?? 100);
    const lowWater = options.lowWater ?? Math.floor(this.batch / 4);
    if (!Number.isInteger(lowWater) || lowWater < 0 || lowWater >= this.batch) {
      throw invalidArgument(`lowWater must be 0 to ${this.batch - 1} (batch - 1), got ${String(lowWater)}`);
    }
    this.lowWater = lowWater;
    const maxAgeMs = options.maxAgeMs ?? 600_000;
    if (typeof maxAgeMs !== "number" || !(maxAgeMs > 0)) {
      throw invalidArgument(`maxAgeMs must be a positive number of milliseconds, got ${String(maxAgeMs)}`);
    }
    this.maxAgeMs = maxAgeMs;
    this.startRefill();
  }

  /** True once {@link IdPool.close} ran. */
  get closed(): boolean {
    return this.closedFlag;
  }

  /** Ids buffered now (expired ones not yet dropped included). */
  get buffered(): number {
    return this.size;
  }

  /**
   * The next id. Waits for a refill when the buffer is empty; rejects with
   * the refill's last error (a {@link SnowkeepError}) when its retry budget
   * is spent, with FAILED_PRECONDITION "pool closed" after {@link IdPool.close},
   * and with an {@link AbortError} when `signal` aborts the wait.
   */
  next(options: { signal?: AbortSignal } = {}): Promise<bigint> {
    if (!this.closedFlag && options.signal?.aborted !== true) {
      const id = this.take();
      if (id !== undefined) {
        return Promise.resolve(id);
      }
    }
    return this.nextSlow(options);
  }

  private async nextSlow(options: { signal?: AbortSignal }): Promise<bigint> {
    for (;;) {
      throwIfAborted(options.signal);
      if (this.closedFlag) {
        throw poolClosed();
      }
      const id = this.take();
      if (id !== undefined) {
        return id;
      }
      this.lastError = null;
      this.startRefill();
      await this.waitRefill(options.signal);
      if (this.size === 0 && this.lastError !== null && !this.closedFlag) {
        throw this.lastError;
      }
    }
  }

  /** Stops the background refill; `next()` fails with "pool closed" from now on. */
  close(): void {
    if (!this.closedFlag) {
      this.closedFlag = true;
      this.batches.length = 0;
      this.size = 0;
      this.stop.abort(poolClosed());
    }
  }

  /** One id from the buffer (dropping expired batches), starting a refill at the low-water mark. */
  private take(): bigint | undefined {
    const t = now();
    while (this.batches.length > 0) {
      const b = this.batches[0]!;
      if (t - b.fetchedAt > this.maxAgeMs || b.pos >= b.ids.length) {
        this.size -= b.ids.length - b.pos;
        this.batches.shift();
        continue;
      }
      const id = b.ids[b.pos++]!;
      this.size -= 1;
      if (this.size <= this.lowWater) {
        this.startRefill();
      }
      return id;
    }
    return undefined;
  }

  private startRefill(): void {
    if (this.refill !== null || this.closedFlag) {
      return;
    }
    this.refill = this.fetch(this.batch, this.stop.signal).then(
      (ids) => {
        this.refill = null;
        if (!this.closedFlag) {
          this.batches.push({ ids, fetchedAt: now(), pos: 0 });
          this.size += ids.length;
          this.lastError = null;
        }
      },
      (err: unknown) => {
        this.refill = null;
        this.lastError = err;
      },
    );
  }

  private async waitRefill(signal: AbortSignal | undefined): Promise<void> {
    const refill = this.refill;
    if (refill === null) {
      return;
    }
    if (signal === undefined) {
      await refill;
      return;
    }
    await new Promise<void>((resolve, reject) => {
      const onAbort = (): void => reject(new AbortError(undefined, signal.reason));
      signal.addEventListener("abort", onAbort, { once: true });
      void refill.then(() => {
        signal.removeEventListener("abort", onAbort);
        resolve();
      });
    });
  }
}

/** The FAILED_PRECONDITION "pool closed" error. */
function poolClosed(): SnowkeepError {
  return new SnowkeepError(Status.FAILED_PRECONDITION, "pool closed", { retryable: false });
}
