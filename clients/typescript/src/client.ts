/**
 * `SnowkeepClient`: the official TypeScript client of snowkeep's
 * `snowkeep.v1.IdService` and `InfoService` over several servers.
 */

import type { GetInfoResponse } from "./gen/snowkeep/v1/info.js";
import { IdFormat, type NextIdsResponse } from "./gen/snowkeep/v1/id.js";
import { invalidArgument, throwIfAborted } from "./errors.js";
import { decodeId, type DecodedId, type Layout, layoutFromWire } from "./layout.js";
import { checkCount, checkSettings, type ClientOptions, MAX_COUNT, type Settings } from "./options.js";
import { IdPool, type PoolOptions } from "./pool.js";
import { clientClosed, unaryAttempt, withRetries } from "./retry.js";
import { Servers } from "./servers.js";
import { resumingStream } from "./stream.js";

/** Options every call takes. */
export interface CallOptions {
  /**
   * Aborts the call: it rejects at once with an {@link AbortError} (the
   * signal's reason as `cause`) and is never retried. `AbortSignal.timeout(ms)`
   * gives a call a deadline of its own.
   */
  signal?: AbortSignal;
}

/** Options of {@link SnowkeepClient.stream}. */
export interface StreamOptions extends CallOptions {
  /** Ids per batch, 1 to 100000; 0 (the default) lets the server choose (1000). */
  batchSize?: number;
}

/** The server's identity and its namespace's layout, from `InfoService.GetInfo`. */
export interface ServerInfo {
  /** The server's version. */
  readonly version: string;
  /** The namespace it issues ids of. */
  readonly namespace: string;
  /** The namespace's id layout. */
  readonly layout: Layout;
  /** The server's clock at the answer, Unix ms. */
  readonly serverTimeUnixMs: bigint;
}

/** The largest stream total: 2^63 - 1. */
const MAX_TOTAL = (1n << 63n) - 1n;

/**
 * A client of one or more snowkeep servers. Building it makes no call:
 * connections open lazily. Calls go round-robin over the endpoints, skip
 * ejected ones and retry retryable failures under the retry budget (see the
 * README's "Retry rule"). Every call returns a promise (the stream an async
 * iterator) and takes `{ signal }`.
 *
 * ```ts
 * const client = new SnowkeepClient(["127.0.0.1:50051"]);
 * const ids = await client.nextIds(5); // bigint[]
 * client.close();
 * ```
 */
export class SnowkeepClient {
  private readonly settings: Settings;
  private readonly servers: Servers;
  private info: Promise<ServerInfo> | null = null;

  /**
   * A client of `endpoints` (`host:port`, `http://host:port` or
   * `https://host:port`; a string is one endpoint). Throws an
   * INVALID_ARGUMENT {@link SnowkeepError} naming the parameter
   * (`endpoints`, `api_key`, `tls.ca`, `tls.cert`, `tls.key`, ...) for a bad
   * setting or an unreadable file.
   */
  constructor(endpoints: string | readonly string[], options: ClientOptions = {}) {
    this.settings = checkSettings(endpoints, options);
    this.servers = new Servers(this.settings);
  }

  /**
   * `count` (1 to 100000) strictly ascending ids from one server, as
   * `bigint`s. Rejects with an INVALID_ARGUMENT {@link SnowkeepError} naming
   * `count` before any call for a count outside that range; with the
   * server's {@link SnowkeepError} after one attempt for a non-retryable
   * code; with the last retryable error once the retry budget is spent;
   * with an {@link AbortError} when aborted; with FAILED_PRECONDITION
   * "client closed" after {@link SnowkeepClient.close}.
   */
  async nextIds(count: number, options: CallOptions = {}): Promise<bigint[]> {
    checkCount("count", count);
    this.checkOpen(options.signal);
    const response = await withRetries(this.servers, this.settings, options.signal, ({ server, timeoutMs }) =>
      unaryAttempt<NextIdsResponse>(
        (opts, cb) =>
          server.ids.nextIds(
            { count, clientTimeUnixMs: 0n, format: IdFormat.ID_FORMAT_UNSPECIFIED },
            this.servers.callMetadata(),
            opts,
            cb,
          ),
        timeoutMs,
        options.signal,
      ),
    );
    return response.ids;
  }

  /**
   * Exactly `total` ids (1 to 2^63 - 1) in batches of `batchSize`, as an
   * async iterator of `bigint[]`:
   *
   * ```ts
   * for await (const batch of client.stream(50_000n, { batchSize: 1000 })) { ... }
   * ```
   *
   * Opening follows the retry rule. When a server's part ends early with a
   * retryable code, the rest (`total - received`) is asked of the next
   * endpoint; the retry budget restarts at every batch. Every id is unique,
   * ids ascend within each server's part (a resumed part may start below the
   * last id), and exactly `total` ids arrive on success. A non-retryable end
   * or a spent budget rejects the iteration with the {@link SnowkeepError}
   * after the batches already delivered. Leaving the loop early cancels the
   * stream. A bad `total` or `batchSize` throws INVALID_ARGUMENT at once.
   */
  stream(total: bigint | number, options: StreamOptions = {}): AsyncGenerator<bigint[], void, undefined> {
    const t = typeof total === "number" && Number.isSafeInteger(total) ? BigInt(total) : total;
    if (typeof t !== "bigint" || t < 1n || t > MAX_TOTAL) {
      throw invalidArgument(`total must be 1 to ${MAX_TOTAL}, got ${String(total)}`);
    }
    const batchSize = options.batchSize ?? 0;
    if (!Number.isInteger(batchSize) || batchSize < 0 || batchSize > MAX_COUNT) {
      throw invalidArgument(`batchSize (the contract's batch_size) must be 0 to ${MAX_COUNT} (0: the server's default), got ${String(batchSize)}`);
    }
    return resumingStream(this.servers, this.settings, { total: t, batchSize, signal: options.signal });
  }

  /**
   * A prefetching {@link IdPool} over this client: `await pool.next()` for
   * one id, `pool.close()` when done. Throws INVALID_ARGUMENT for a bad
   * `batch`, `lowWater` or `maxAgeMs`, FAILED_PRECONDITION when closed.
   */
  pool(options: PoolOptions = {}): IdPool {
    this.checkOpen(undefined);
    return new IdPool((count, signal) => this.nextIds(count, { signal }), options);
  }

  /**
   * The server's info and layout (`InfoService.GetInfo` under the retry
   * rule), read once and cached; a failed read is tried again next time.
   */
  async serverInfo(options: CallOptions = {}): Promise<ServerInfo> {
    this.checkOpen(options.signal);
    if (this.info === null) {
      const pending = this.fetchInfo(options.signal);
      this.info = pending;
      pending.catch(() => {
        if (this.info === pending) {
          this.info = null;
        }
      });
    }
    return this.info;
  }

  /**
   * The parts of `id` under the layout the server reports (read once, see
   * {@link SnowkeepClient.serverInfo}): Unix ms (`epoch + ticks × unit`),
   * machine id and sequence. Rejects with INVALID_ARGUMENT naming `id` for
   * an id above the layout's largest id, and as `serverInfo` otherwise.
   */
  async decode(id: bigint, options: CallOptions = {}): Promise<DecodedId> {
    if (typeof id !== "bigint") {
      throw invalidArgument(`id must be a bigint, got ${typeof id}`);
    }
    const info = await this.serverInfo(options);
    return decodeId(info.layout, id);
  }

  /**
   * Closes the connections. Calls after it reject with FAILED_PRECONDITION
   * "client closed"; calls in flight end. Idempotent.
   */
  close(): void {
    if (!this.servers.closed) {
      this.servers.close();
    }
  }

  private async fetchInfo(signal: AbortSignal | undefined): Promise<ServerInfo> {
    const r: GetInfoResponse = await withRetries(this.servers, this.settings, signal, ({ server, timeoutMs }) =>
      unaryAttempt<GetInfoResponse>(
        (opts, cb) => server.info.getInfo({}, this.servers.callMetadata(), opts, cb),
        timeoutMs,
        signal,
      ),
    );
    return {
      version: r.version,
      namespace: r.namespace,
      layout: layoutFromWire(r.layout),
      serverTimeUnixMs: r.serverTimeUnixMs,
    };
  }

  private checkOpen(signal: AbortSignal | undefined): void {
    throwIfAborted(signal);
    if (this.servers.closed) {
      throw clientClosed();
    }
  }
}
