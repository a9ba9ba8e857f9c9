/**
 * Client settings and their checks: everything here runs when a client is
 * built, before any call, and refuses a bad setting with an INVALID_ARGUMENT
 * {@link SnowkeepError} that names the parameter and the value.
 */

import { readFileSync } from "node:fs";

import { invalidArgument } from "./errors.js";

/** TLS settings: PEM files read once, when the client is built. */
export interface TlsOptions {
  /** CA certificates (PEM file path) to trust instead of the system roots. */
  ca?: string | null;
  /** Client certificate chain (PEM file path) for mTLS; needs `key`. */
  cert?: string | null;
  /** The client certificate's private key (PEM file path); needs `cert`. */
  key?: string | null;
}

/** Settings of a {@link SnowkeepClient}. Durations are in milliseconds. */
export interface ClientOptions {
  /**
   * The API key (`<id>.<secret>`), sent as `authorization: Bearer <key>` on
   * every call. Whitespace or non-ASCII characters are refused (`api_key`).
   */
  apiKey?: string | null;
  /**
   * TLS for `https://` endpoints (and for bare `host:port` ones when given).
   * Without it, `https://` endpoints trust the system roots.
   */
  tls?: TlsOptions | null;
  /** Deadline of one attempt, ms (default 5000). */
  requestTimeoutMs?: number;
  /** Bound on a whole call, its retries and sleeps included, ms (default 10000). */
  retryBudgetMs?: number;
  /** First sleep after a round where every endpoint failed, ms (default 20). */
  backoffMs?: number;
  /** Largest sleep between rounds, and longest ejection, ms (default 1000). */
  maxBackoffMs?: number;
}

/** One endpoint as parsed: the gRPC target and whether it speaks TLS. */
export interface Endpoint {
  /** The endpoint as given. */
  readonly given: string;
  /** `host:port` for grpc-js. */
  readonly target: string;
  /** True for `https://`, and for a bare `host:port` when TLS options are set. */
  readonly tls: boolean;
}

/** The checked settings a client runs with. */
export interface Settings {
  readonly endpoints: readonly Endpoint[];
  readonly apiKey: string | null;
  readonly tls: { ca: Buffer | null; cert: Buffer | null; key: Buffer | null } | null;
  readonly requestTimeoutMs: number;
  readonly retryBudgetMs: number;
  readonly backoffMs: number;
  readonly maxBackoffMs: number;
}

const ENDPOINT = /^(?:(https?):\/\/)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):([0-9]{1,5})\/?$/;

/** Parses `host:port`, `http://host:port` or `https://host:port`. */
export function parseEndpoint(given: unknown, tlsSet: boolean): Endpoint {
  const text = typeof given === "string" ? given : "";
  const m = ENDPOINT.exec(text);
  const port = m ? Number(m[3]) : 0;
  if (!m || port < 1 || port > 65535) {
    throw invalidArgument(
      `endpoints: invalid endpoint ${JSON.stringify(given)}: use host:port, ` +
        "http://host:port or https://host:port with a port from 1 to 65535",
    );
  }
  const scheme = m[1];
  return {
    given: text,
    target: `${m[2]}:${port}`,
    tls: scheme === "https" || (scheme === undefined && tlsSet),
  };
}

function readPem(parameter: string, path: string | null | undefined): Buffer | null {
  if (path === null || path === undefined) {
    return null;
  }
  try {
    return readFileSync(path);
  } catch (err) {
    const why = (err as NodeJS.ErrnoException).code ?? String(err);
    throw invalidArgument(`${parameter}: cannot read ${JSON.stringify(path)} (${why})`);
  }
}

function checkTls(tls: TlsOptions | null | undefined): Settings["tls"] {
  if (tls === null || tls === undefined) {
    return null;
  }
  const hasCert = tls.cert !== null && tls.cert !== undefined;
  const hasKey = tls.key !== null && tls.key !== undefined;
  if (hasCert && !hasKey) {
    throw invalidArgument("tls.key: a client certificate (tls.cert) needs its key");
  }
  if (hasKey && !hasCert) {
    throw invalidArgument("tls.cert: a client key (tls.key) needs its certificate");
  }
  return {
    ca: readPem("tls.ca", tls.ca),
    cert: readPem("tls.cert", tls.cert),
    key: readPem("tls.key", tls.key),
  };
}

function checkApiKey(key: string | null | undefined): string | null {
  if (key === null || key === undefined) {
    return null;
  }
  if (typeof key !== "string" || !/^[\x21-\x7e]+$/.test(key)) {
    throw invalidArgument(
      "api_key: an API key is <id>.<secret> in printable ASCII, without whitespace",
    );
  }
  return key;
}

function checkMs(parameter: string, value: number | undefined, fallback: number, min: number): number {
  if (value === undefined) {
    return fallback;
  }
  if (typeof value !== "number" || !Number.isFinite(value) || value < min) {
    throw invalidArgument(`${parameter}: must be a number of milliseconds >= ${min}, got ${String(value)}`);
  }
  return value;
}

/** Checks `endpoints` and `options`, reading the TLS files. */
export function checkSettings(endpoints: unknown, options: ClientOptions = {}): Settings {
  const list: unknown[] = typeof endpoints === "string" ? [endpoints] : Array.isArray(endpoints) ? endpoints : [];
  if (list.length === 0) {
    throw invalidArgument("endpoints: give at least one endpoint (host:port, http://host:port or https://host:port)");
  }
  const tls = checkTls(options.tls);
  return {
    endpoints: list.map((e) => parseEndpoint(e, tls !== null)),
    apiKey: checkApiKey(options.apiKey),
    tls,
    requestTimeoutMs: checkMs("requestTimeoutMs", options.requestTimeoutMs, 5000, 1),
    retryBudgetMs: checkMs("retryBudgetMs", options.retryBudgetMs, 10_000, 0),
    backoffMs: checkMs("backoffMs", options.backoffMs, 20, 0),
    maxBackoffMs: checkMs("maxBackoffMs", options.maxBackoffMs, 1000, 0),
  };
}

/** The largest count of one `nextIds` call. */
export const MAX_COUNT = 100_000;

/** Checks an id count of 1 to 100000 (`parameter` names it in the error). */
export function checkCount(parameter: string, count: unknown): number {
  if (typeof count !== "number") {
    throw invalidArgument(
      `${parameter} must be a number (an integer of 1 to ${MAX_COUNT}), got the ${typeof count} ${String(count)}`,
    );
  }
  if (!Number.isInteger(count) || count < 1 || count > MAX_COUNT) {
    throw invalidArgument(`${parameter} must be 1 to ${MAX_COUNT}, got ${String(count)}`);
  }
  return count;
}
