/**
 * The resuming stream: exactly `total` ids in batches, from `StreamIds` on
 * one server and, when a server's part ends early with a retryable code, on
 * the next endpoint for the `total - received` ids left.
 */

import { status as Status, type ClientReadableStream } from "@grpc/grpc-js";

import { AbortError, SnowkeepError, throwIfAborted } from "./errors.js";
import { IdFormat, type IdBatch } from "./gen/snowkeep/v1/id.js";
import type { Settings } from "./options.js";
import { Attempts } from "./retry.js";
import type { Servers } from "./servers.js";

/** Batches buffered before the call is paused (HTTP/2 flow control then paces the server). */
const HIGH_WATER = 4;

/**
 * Reads one `StreamIds` call batch by batch, each wait bounded by the
 * time `next` is given (DEADLINE_EXCEEDED then) and by the caller's signal.
 */
class BatchReader {
  private readonly queue: IdBatch[] = [];
  private ended = false;
  private error: unknown = null;
  private wake: (() => void) | null = null;

  constructor(
    private readonly call: ClientReadableStream<IdBatch>,
    private readonly signal: AbortSignal | undefined,
  ) {
    call.on("data", (b: IdBatch) => {
      this.queue.push(b);
      if (this.queue.length >= HIGH_WATER) {
        call.pause();
      }
      this.poke();
    });
    call.on("error", (e: unknown) => {
      this.error = e;
      this.poke();
    });
    call.on("end", () => {
      this.ended = true;
      this.poke();
    });
  }

  private poke(): void {
    const w = this.wake;
    this.wake = null;
    w?.();
  }

  /**
   * The next batch, waiting at most `timeoutMs` for it; `null` when the
   * server ended the call with OK.
   */
  async next(timeoutMs: number): Promise<IdBatch | null> {
    for (;;) {
      const b = this.queue.shift();
      if (b !== undefined) {
        if (this.queue.length < HIGH_WATER) {
          this.call.resume();
        }
        return b;
      }
      if (this.error !== null) {
        throw this.error;
      }
      if (this.ended) {
        return null;
      }
      await this.waitForEvent(timeoutMs);
    }
  }

  private waitForEvent(timeoutMs: number): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      const onAbort = (): void => {
        cleanup();
        reject(new AbortError(undefined, this.signal?.reason));
      };
      const timer = setTimeout(() => {
        cleanup();
        reject(new SnowkeepError(Status.DEADLINE_EXCEEDED, `no batch within ${timeoutMs} ms`));
      }, timeoutMs);
      const cleanup = (): void => {
        clearTimeout(timer);
        this.signal?.removeEventListener("abort", onAbort);
        this.wake = null;
      };
      this.wake = () => {
        cleanup();
        resolve();
      };
      if (this.signal?.aborted) {
        onAbort();
        return;
      }
      this.signal?.addEventListener("abort", onAbort, { once: true });
    });
  }
}

/** The arguments of one resuming stream. */
export interface StreamPlan {
  readonly total: bigint;
  readonly batchSize: number;
  readonly signal: AbortSignal | undefined;
}

/**
 * Yields the batches of a resuming stream of exactly `plan.total` ids; ends
 * with the typed error after the batches delivered when a part ends with a
 * non-retryable code or the retry budget is spent.
 */
export async function* resumingStream(
  servers: Servers,
  settings: Settings,
  plan: StreamPlan,
): AsyncGenerator<bigint[], void, undefined> {
  const attempts = new Attempts(servers, settings, plan.signal);
  let received = 0n;
  while (received < plan.total) {
    const { server } = await attempts.next();
    const left = plan.total - received;
    const partStart = received;
    const call = server.ids.streamIds(
      { total: left, batchSize: plan.batchSize, format: IdFormat.ID_FORMAT_UNSPECIFIED },
      servers.callMetadata(),
    );
    call.on("error", () => undefined);
    const reader = new BatchReader(call, plan.signal);
    let first = true;
    try {
      for (;;) {
        throwIfAborted(plan.signal);
        let batch: IdBatch | null;
        // Each wait is an attempt's deadline: the smaller of requestTimeoutMs and the budget left.
        const wait = attempts.batchWait();
        try {
          batch = await reader.next(wait.timeoutMs);
        } catch (err) {
          attempts.failed(server, err, wait.cut);
          break;
        }
        if (batch === null) {
          const short = new SnowkeepError(
            Status.UNAVAILABLE,
            `the server ended the stream with OK after ${received - partStart} of the ${left} ids asked`,
          );
          attempts.failed(server, short);
          break;
        }
        if (first) {
          first = false;
          attempts.succeeded(server);
        }
        attempts.restart();
        let ids = batch.ids;
        const room = plan.total - received;
        if (BigInt(ids.length) > room) {
          ids = ids.slice(0, Number(room));
        }
        received += BigInt(ids.length);
        if (ids.length > 0) {
          yield ids;
        }
        if (received >= plan.total) {
          return;
        }
      }
    } finally {
      call.cancel();
    }
  }
}
