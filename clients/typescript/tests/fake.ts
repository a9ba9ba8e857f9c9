// An in-process double of snowkeep.v1.IdService and InfoService on a free
// loopback port, scripted per test, recording every request it receives.

import {
  Server,
  ServerCredentials,
  type ServerUnaryCall,
  type ServerWritableStream,
  type sendUnaryData,
  status as Status,
  Metadata,
} from "@grpc/grpc-js";

import {
  IdServiceService,
  type IdBatch,
  type NextIdsRequest,
  type NextIdsResponse,
  type StreamIdsRequest,
} from "../src/gen/snowkeep/v1/id.js";
import { InfoServiceService, type GetInfoResponse, type Layout } from "../src/gen/snowkeep/v1/info.js";

/** A gRPC error status to answer with. */
export interface Refusal {
  code: number;
  details: string;
}

/** What one NextIds call answers: ids, a refusal, or nothing ever ("hang"). */
export type UnaryAnswer = { ids: bigint[] } | { error: Refusal } | "hang";

/** What one StreamIds call does: send these batches, then end with OK or `end`. */
export interface StreamScript {
  batches: bigint[][];
  end?: Refusal;
  /** Never end after the batches. */
  hang?: boolean;
  /** Pause this long (ms) before each batch after the first. */
  gapMs?: number;
}

/** The ids `from`, `from + 1`, ... (`n` of them). */
export function range(from: bigint, n: number): bigint[] {
  return Array.from({ length: n }, (_, i) => from + BigInt(i));
}

/**
 * Client options under which only the retry budget (300 ms) cuts an
 * attempt short: a request timeout far above it, 20 ms between rounds.
 */
export const BUDGET_CUTS = {
  requestTimeoutMs: 60_000,
  retryBudgetMs: 300,
  backoffMs: 20,
  maxBackoffMs: 20,
} as const;

/** The default layout 41/12/10 from 2026-01-01. */
export const LAYOUT: Layout = {
  timestampBits: 41,
  machineBits: 12,
  sequenceBits: 10,
  epochUnixMs: 1767225600000n,
  timeUnitMs: 1,
};

/** A scripted fake server. */
export class Fake {
  /** `http://127.0.0.1:<port>`, once started. */
  url = "";
  /** Every NextIds request, in order. */
  readonly nextIdsCalls: NextIdsRequest[] = [];
  /** Every StreamIds request, in order. */
  readonly streamCalls: StreamIdsRequest[] = [];
  /** GetInfo calls. */
  infoCalls = 0;
  /** The metadata of every call. */
  readonly metadata: Metadata[] = [];
  /** NextIds answers by call index; past the end, `nextIdsDefault`. */
  nextIdsScript: UnaryAnswer[] = [];
  /** The answer of NextIds calls past the script: the ids 1 to count. */
  nextIdsDefault: (req: NextIdsRequest) => UnaryAnswer = (req) => ({ ids: range(1n, req.count) });
  /** StreamIds behaviour by call index; past the end, a refusal UNIMPLEMENTED. */
  streamScript: StreamScript[] = [];
  /** GetInfo's layout. */
  layout: Layout = LAYOUT;
  private readonly server = new Server();
  private readonly waiters: { n: number; resolve: () => void }[] = [];

  /** Calls of every method so far. */
  get calls(): number {
    return this.nextIdsCalls.length + this.streamCalls.length + this.infoCalls;
  }

  /** Resolves once `n` calls (of any method) have arrived. */
  called(n: number): Promise<void> {
    if (this.calls >= n) {
      return Promise.resolve();
    }
    return new Promise((resolve) => this.waiters.push({ n, resolve }));
  }

  private arrived(md: Metadata): void {
    this.metadata.push(md);
    for (const w of this.waiters.filter((w) => this.calls >= w.n)) {
      this.waiters.splice(this.waiters.indexOf(w), 1);
      w.resolve();
    }
  }

  private nextIds(call: ServerUnaryCall<NextIdsRequest, NextIdsResponse>, cb: sendUnaryData<NextIdsResponse>): void {
    const answer = this.nextIdsScript[this.nextIdsCalls.length] ?? this.nextIdsDefault(call.request);
    this.nextIdsCalls.push(call.request);
    this.arrived(call.metadata);
    if (answer === "hang") {
      return;
    }
    if ("error" in answer) {
      cb({ code: answer.error.code, details: answer.error.details });
    } else {
      cb(null, { ids: answer.ids, texts: [] });
    }
  }

  private streamIds(call: ServerWritableStream<StreamIdsRequest, IdBatch>): void {
    const script = this.streamScript[this.streamCalls.length];
    this.streamCalls.push(call.request);
    this.arrived(call.metadata);
    if (script === undefined) {
      call.emit("error", { code: Status.UNIMPLEMENTED, details: "no script" });
      return;
    }
    void this.play(call, script);
  }

  private async play(call: ServerWritableStream<StreamIdsRequest, IdBatch>, script: StreamScript): Promise<void> {
    for (const [i, ids] of script.batches.entries()) {
      if (i > 0 && script.gapMs !== undefined) {
        await new Promise((resolve) => setTimeout(resolve, script.gapMs));
        if (call.cancelled) {
          return;
        }
      }
      call.write({ ids, texts: [] });
    }
    if (script.hang) {
      return;
    }
    if (script.end) {
      call.emit("error", { code: script.end.code, details: script.end.details });
    } else {
      call.end();
    }
  }

  private getInfo(call: ServerUnaryCall<unknown, GetInfoResponse>, cb: sendUnaryData<GetInfoResponse>): void {
    this.infoCalls += 1;
    this.arrived(call.metadata);
    cb(null, {
      version: "fake",
      namespace: "default",
      layout: this.layout,
      instanceId: "fake",
      held: [],
      serverTimeUnixMs: 0n,
      store: "fake",
      layoutEndUnixMs: 0n,
      layoutRemainingSeconds: 0n,
    });
  }

  /** Starts serving on a free loopback port. */
  async start(): Promise<this> {
    this.server.addService(IdServiceService, {
      nextIds: this.nextIds.bind(this),
      streamIds: this.streamIds.bind(this),
    });
    this.server.addService(InfoServiceService, {
      getInfo: this.getInfo.bind(this),
      decodeId: (_: unknown, cb: sendUnaryData<never>) => cb({ code: Status.UNIMPLEMENTED }),
      getCapacity: (_: unknown, cb: sendUnaryData<never>) => cb({ code: Status.UNIMPLEMENTED }),
    });
    const port = await new Promise<number>((resolve, reject) =>
      this.server.bindAsync("127.0.0.1:0", ServerCredentials.createInsecure(), (err, p) =>
        err ? reject(err) : resolve(p),
      ),
    );
    this.url = `http://127.0.0.1:${port}`;
    return this;
  }

  /** Stops at once, ending calls in flight. */
  stop(): void {
    this.server.forceShutdown();
  }
}

/** Starts `n` fakes. */
export async function fakes(n: number): Promise<Fake[]> {
  return Promise.all(Array.from({ length: n }, () => new Fake().start()));
}

/** A port nothing listens on: one a fake bound, then released. */
export async function deadUrl(): Promise<string> {
  const f = await new Fake().start();
  f.stop();
  return f.url;
}
