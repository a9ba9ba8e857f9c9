/**
 * Errors of the snowkeep client: {@link SnowkeepError} for every failure that
 * has a gRPC status code (the server's, or one the client raises itself),
 * {@link AbortError} for a call the caller aborted, and the one list of
 * retryable codes every snowkeep client shares.
 */

import { status as Status } from "@grpc/grpc-js";

/** The canonical upper snake case names of the gRPC status codes, by number. */
const CODE_NAMES: readonly string[] = [
  "OK",
  "CANCELLED",
  "UNKNOWN",
  "INVALID_ARGUMENT",
  "DEADLINE_EXCEEDED",
  "NOT_FOUND",
  "ALREADY_EXISTS",
  "PERMISSION_DENIED",
  "RESOURCE_EXHAUSTED",
  "FAILED_PRECONDITION",
  "ABORTED",
  "OUT_OF_RANGE",
  "UNIMPLEMENTED",
  "INTERNAL",
  "UNAVAILABLE",
  "DATA_LOSS",
  "UNAUTHENTICATED",
];

/**
 * The canonical name of a gRPC status code (`3` is `"INVALID_ARGUMENT"`), as
 * the gRPC specification writes it; `"UNKNOWN"` for a number outside 0 to 16.
 */
export function codeName(code: number): string {
  return CODE_NAMES[code] ?? "UNKNOWN";
}

/**
 * The codes after which the same call may succeed later or on another server:
 * UNAVAILABLE, DEADLINE_EXCEEDED, UNKNOWN, CANCELLED, RESOURCE_EXHAUSTED,
 * ABORTED, INTERNAL, FAILED_PRECONDITION and NOT_FOUND. Every other code means
 * the request itself is wrong or refused, so it surfaces after one attempt.
 */
export const RETRYABLE_CODES: ReadonlySet<number> = new Set([
  Status.UNAVAILABLE,
  Status.DEADLINE_EXCEEDED,
  Status.UNKNOWN,
  Status.CANCELLED,
  Status.RESOURCE_EXHAUSTED,
  Status.ABORTED,
  Status.INTERNAL,
  Status.FAILED_PRECONDITION,
  Status.NOT_FOUND,
]);

/** True when `code` (a grpc-js `status` number) is in {@link RETRYABLE_CODES}. */
export function isRetryableCode(code: number): boolean {
  return RETRYABLE_CODES.has(code);
}

/**
 * A snowkeep call failed with a gRPC status, or the client refused a call or
 * a setting before any call (then `code` is INVALID_ARGUMENT, or
 * FAILED_PRECONDITION for a closed client or pool).
 *
 * - `code`: the grpc-js `status` number (`status.UNAVAILABLE` is 14).
 * - `codeName`: its canonical name (`"UNAVAILABLE"`).
 * - `details`: the server's message (or the client's own text), also the
 *   error's `message`.
 */
export class SnowkeepError extends Error {
  /** The gRPC status code, as grpc-js's `status` enum numbers it. */
  readonly code: number;
  /** The canonical name of `code`, e.g. `"INVALID_ARGUMENT"`. */
  readonly codeName: string;
  /** The server's status message, or the client's own description. */
  readonly details: string;

  /** False whatever the code for what no retry heals (a closed client or pool). */
  readonly #retryable: boolean | undefined;

  /**
   * An error with gRPC code `code` and message `details`; `retryable: false`
   * marks one no retry heals although its code is on the list.
   */
  constructor(
    code: number,
    details: string,
    options?: { cause?: unknown; retryable?: boolean },
  ) {
    super(details, options?.cause === undefined ? undefined : { cause: options.cause });
    this.name = "SnowkeepError";
    this.code = code;
    this.codeName = codeName(code);
    this.details = details;
    this.#retryable = options?.retryable;
  }

  /**
   * True when the same call may succeed later or on another server: the code
   * is in {@link RETRYABLE_CODES}, except for a closed client or pool
   * (FAILED_PRECONDITION, never healed by a retry).
   */
  get retryable(): boolean {
    return this.#retryable ?? isRetryableCode(this.code);
  }
}

/**
 * The caller aborted the call through its `AbortSignal` (or the signal timed
 * out). Never retried. `name` is `"AbortError"` and `code` is `"ABORT_ERR"`,
 * as Node's own abortable APIs report it; `cause` is the signal's reason.
 */
export class AbortError extends Error {
  /** `"ABORT_ERR"`, like Node's built-in abort errors. */
  readonly code = "ABORT_ERR";

  /** An abort error whose `cause` is `reason` (the signal's reason). */
  constructor(message = "the operation was aborted", reason?: unknown) {
    super(message, reason === undefined ? undefined : { cause: reason });
    this.name = "AbortError";
  }
}

/** An INVALID_ARGUMENT {@link SnowkeepError} naming a parameter. */
export function invalidArgument(message: string): SnowkeepError {
  return new SnowkeepError(Status.INVALID_ARGUMENT, message);
}

/** Throws an {@link AbortError} when `signal` is aborted. */
export function throwIfAborted(signal: AbortSignal | undefined): void {
  if (signal?.aborted) {
    throw new AbortError(undefined, signal.reason);
  }
}

/**
 * The {@link SnowkeepError} of a failed grpc-js call: its code and the
 * server's message (`details`); a failure without a code is UNAVAILABLE.
 */
export function fromGrpcError(err: unknown): SnowkeepError {
  if (err instanceof SnowkeepError) {
    return err;
  }
  const e = err as { code?: unknown; details?: unknown; message?: unknown };
  const code = typeof e?.code === "number" ? e.code : Status.UNAVAILABLE;
  const details =
    typeof e?.details === "string" && e.details !== ""
      ? e.details
      : typeof e?.message === "string"
        ? e.message
        : String(err);
  return new SnowkeepError(code, details, { cause: err });
}
