// The conformance driver of @snowkeep/client: reads one JSON request per line
// on stdin, answers with JSON lines on stdout (conformance/README.md, "The
// driver protocol"). It uses the package's public entry point only.

import { createInterface } from "node:readline";
import { setTimeout as delay } from "node:timers/promises";

import { AbortError, SnowkeepClient, SnowkeepError } from "../../../clients/typescript/dist/esm/index.js";

let client = null;
let pool = null;

function write(obj) {
  process.stdout.write(JSON.stringify(obj) + "\n");
}

function errorAnswer(err, extra = {}) {
  if (err instanceof SnowkeepError) {
    return { ok: false, code: err.codeName, message: err.details, ...extra };
  }
  if (err instanceof AbortError) {
    return { ok: false, code: "CANCELLED", message: err.message, ...extra };
  }
  return { ok: false, code: "UNKNOWN", message: String(err?.stack ?? err), ...extra };
}

function needClient() {
  if (client === null) {
    throw new SnowkeepError(9, "client closed");
  }
  return client;
}

function closeAll() {
  pool?.close();
  pool = null;
  client?.close();
  client = null;
}

function open(req) {
  closeAll();
  const tls = req.tls ? { ca: req.tls.ca ?? null, cert: req.tls.cert ?? null, key: req.tls.key ?? null } : null;
  client = new SnowkeepClient(req.endpoints ?? [], {
    apiKey: req.api_key ?? null,
    tls,
    requestTimeoutMs: req.request_timeout_ms ?? undefined,
    retryBudgetMs: req.retry_budget_ms ?? undefined,
    backoffMs: req.backoff_ms ?? undefined,
    maxBackoffMs: req.max_backoff_ms ?? undefined,
  });
  return { ok: true };
}

async function stream(req) {
  const ids = [];
  const every = req.progress_every ?? 0;
  const pace = req.pace_ms ?? 0;
  let batches = 0;
  try {
    for await (const batch of needClient().stream(BigInt(req.total), { batchSize: req.batch_size ?? 0 })) {
      for (const id of batch) ids.push(id.toString());
      batches += 1;
      if (every > 0 && batches % every === 0) {
        write({ progress: { received: ids.length, last_id: ids[ids.length - 1] } });
      }
      if (pace > 0) await delay(pace);
    }
  } catch (err) {
    return errorAnswer(err, { ids });
  }
  return { ok: true, ids };
}

async function poolTake(req) {
  const ids = [];
  try {
    if (pool === null) throw new SnowkeepError(9, "pool closed");
    for (let i = 0; i < req.count; i++) ids.push((await pool.next()).toString());
  } catch (err) {
    return errorAnswer(err, { ids });
  }
  return { ok: true, ids };
}

async function benchStream(req) {
  const start = process.hrtime.bigint();
  let n = 0;
  for await (const batch of needClient().stream(BigInt(req.total), { batchSize: req.batch_size ?? 0 })) {
    n += batch.length;
  }
  return { ok: true, ids: n, seconds: Number(process.hrtime.bigint() - start) / 1e9 };
}

async function benchUnary(req) {
  const c = needClient();
  const end = performance.now() + req.seconds * 1000;
  const latencies = [];
  const worker = async () => {
    while (performance.now() < end) {
      const t = performance.now();
      await c.nextIds(1);
      latencies.push(performance.now() - t);
    }
  };
  await Promise.all(Array.from({ length: req.concurrency }, worker));
  latencies.sort((a, b) => a - b);
  const at = (q) => (latencies.length === 0 ? 0 : latencies[Math.min(latencies.length - 1, Math.floor(q * latencies.length))]);
  return { ok: true, calls: latencies.length, p50_ms: at(0.5), p99_ms: at(0.99) };
}

async function benchPool(req) {
  // A fresh pool of batch 100000 and low water 50000; the first next() (the
  // first fill) is untimed, then `count` timed next() calls, then close.
  const p = needClient().pool({ batch: 100_000, lowWater: 50_000 });
  try {
    await p.next();
    const start = process.hrtime.bigint();
    for (let i = 0; i < req.count; i++) await p.next();
    const ns = Number(process.hrtime.bigint() - start);
    return { ok: true, ids: req.count, ns_per_id: req.count > 0 ? ns / req.count : 0 };
  } finally {
    p.close();
  }
}

async function decode(req) {
  const d = await needClient().decode(BigInt(req.id));
  return { ok: true, unix_ms: d.unixMs, machine_id: d.machineId, sequence: d.sequence };
}

async function handle(req) {
  switch (req.op) {
    case "open":
      return open(req);
    case "next_ids":
      return { ok: true, ids: (await needClient().nextIds(req.count)).map(String) };
    case "stream":
      return stream(req);
    case "pool_open":
      pool?.close();
      pool = null;
      pool = needClient().pool({
        batch: req.batch ?? undefined,
        lowWater: req.low_water ?? undefined,
        maxAgeMs: req.max_age_ms ?? undefined,
      });
      return { ok: true };
    case "pool_take":
      return poolTake(req);
    case "pool_close":
      pool?.close();
      return { ok: true };
    case "decode":
      return decode(req);
    case "bench_stream":
      return benchStream(req);
    case "bench_unary":
      return benchUnary(req);
    case "bench_pool":
      return benchPool(req);
    case "close":
      pool?.close();
      client?.close();
      return { ok: true };
    default:
      return { ok: false, code: "INVALID_ARGUMENT", message: `unknown op ${JSON.stringify(req.op)}` };
  }
}

const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
for await (const line of lines) {
  if (line.trim() === "") continue;
  let answer;
  try {
    answer = await handle(JSON.parse(line));
  } catch (err) {
    answer = errorAnswer(err);
  }
  write(answer);
}
closeAll();
