/**
 * @snowkeep/client: the official TypeScript client of snowkeep, the gRPC
 * distributed id service. Ids are `bigint`s (63-bit snowflake ids).
 *
 * - {@link SnowkeepClient}: `nextIds`, the resuming `stream`, `pool`,
 *   `decode`, `serverInfo`, `close`.
 * - {@link IdPool}: `await pool.next()`, `pool.close()`.
 * - {@link SnowkeepError} (`code`, `codeName`, `details`) and
 *   {@link AbortError}.
 *
 * @packageDocumentation
 */

export { SnowkeepClient, type CallOptions, type StreamOptions, type ServerInfo } from "./client.js";
export { IdPool, type PoolOptions } from "./pool.js";
export { AbortError, SnowkeepError, codeName, isRetryableCode, RETRYABLE_CODES } from "./errors.js";
export type { ClientOptions, TlsOptions } from "./options.js";
export { decodeId, maxId, type DecodedId, type Layout } from "./layout.js";
