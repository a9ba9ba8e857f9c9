/**
 * Id layouts and decoding: an id is, from its top bit down, the timestamp
 * field (ticks of `timeUnitMs` since the layout's epoch), the machine id and
 * the sequence.
 */

import { invalidArgument, SnowkeepError } from "./errors.js";
import type { Layout as WireLayout } from "./gen/snowkeep/v1/info.js";

import { status as Status } from "@grpc/grpc-js";

/** The bit layout of a namespace's ids, as `InfoService.GetInfo` reports it. */
export interface Layout {
  /** Bits of the timestamp field (the top bits). */
  readonly timestampBits: number;
  /** Bits of the machine id field. */
  readonly machineBits: number;
  /** Bits of the sequence field (the low bits). */
  readonly sequenceBits: number;
  /** The layout's epoch, Unix milliseconds. */
  readonly epochUnixMs: bigint;
  /** Milliseconds per timestamp tick: 1, 10, 100 or 1000 (a server's 0 is read as 1). */
  readonly timeUnitMs: number;
}

/** The parts of one id. */
export interface DecodedId {
  /** When the id was stamped: the first millisecond of its tick, Unix ms. */
  readonly unixMs: number;
  /** The same instant in layout ms (since the layout's epoch). */
  readonly timestampMs: number;
  /** The machine id that issued it. */
  readonly machineId: number;
  /** Its sequence number within its tick and machine id. */
  readonly sequence: number;
}

/** Reads and checks a layout a server sent (bits non-zero, 32 to 63 in all). */
export function layoutFromWire(l: WireLayout | undefined): Layout {
  const ok =
    l !== undefined &&
    l.timestampBits > 0 &&
    l.machineBits > 0 &&
    l.sequenceBits > 0 &&
    l.timestampBits + l.machineBits + l.sequenceBits >= 32 &&
    l.timestampBits + l.machineBits + l.sequenceBits <= 63;
  if (!ok) {
    throw new SnowkeepError(Status.INTERNAL, `the server reported an invalid layout ${JSON.stringify(l, (_, v: unknown) => (typeof v === "bigint" ? v.toString() : v))}`);
  }
  return {
    timestampBits: l.timestampBits,
    machineBits: l.machineBits,
    sequenceBits: l.sequenceBits,
    epochUnixMs: l.epochUnixMs,
    timeUnitMs: l.timeUnitMs === 0 ? 1 : l.timeUnitMs,
  };
}

/** The largest id of `layout`: `2^(total bits) - 1`. */
export function maxId(layout: Layout): bigint {
  return (1n << BigInt(layout.timestampBits + layout.machineBits + layout.sequenceBits)) - 1n;
}

/**
 * Splits `id` under `layout`. Throws an INVALID_ARGUMENT {@link SnowkeepError}
 * naming `id` when it is negative or above the layout's largest id.
 */
export function decodeId(layout: Layout, id: bigint): DecodedId {
  if (typeof id !== "bigint") {
    throw invalidArgument(`id must be a bigint, got ${typeof id}`);
  }
  const max = maxId(layout);
  if (id < 0n || id > max) {
    throw invalidArgument(`id ${id} is outside the layout's ids 0 to ${max}`);
  }
  const seqBits = BigInt(layout.sequenceBits);
  const low = BigInt(layout.machineBits + layout.sequenceBits);
  const tick = id >> low;
  const machine = (id >> seqBits) & ((1n << BigInt(layout.machineBits)) - 1n);
  const sequence = id & ((1n << seqBits) - 1n);
  const timestampMs = tick * BigInt(layout.timeUnitMs);
  return {
    unixMs: Number(layout.epochUnixMs + timestampMs),
    timestampMs: Number(timestampMs),
    machineId: Number(machine),
    sequence: Number(sequence),
  };
}
