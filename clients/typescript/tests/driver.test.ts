// The conformance driver (conformance/drivers/typescript) against a fake:
// every op answers per the driver protocol, with ids as decimal strings.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { join } from "node:path";
import { after, describe, test } from "node:test";

import { status as Status } from "@grpc/grpc-js";

import { type Fake, fakes, range } from "./fake.js";

const driver = join(__dirname, "..", "..", "..", "..", "conformance", "drivers", "typescript", "driver.mjs");

const started: Fake[] = [];
after(() => started.forEach((f) => f.stop()));

/** Runs the driver on `requests`; its stdout lines, parsed. */
function run(requests: object[]): Promise<Record<string, unknown>[]> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [driver], { stdio: ["pipe", "pipe", "inherit"] });
    let out = "";
    child.stdout.setEncoding("utf8");
    child.stdout.on("data", (d: string) => (out += d));
    child.on("error", reject);
    child.on("close", (code) => {
      if (code !== 0) {
        reject(new Error(`driver exited ${code}`));
        return;
      }
      resolve(out.split("\n").filter((l) => l !== "").map((l) => JSON.parse(l) as Record<string, unknown>));
    });
    child.stdin.end(requests.map((r) => JSON.stringify(r)).join("\n") + "\n");
  });
}

function open(url: string): object {
  return {
    op: "open",
    endpoints: [url],
    api_key: null,
    tls: null,
    request_timeout_ms: 5000,
    retry_budget_ms: 10000,
    backoff_ms: 20,
    max_backoff_ms: 1000,
  };
}

describe("driver", () => {
  test("answers next_ids, stream with progress, pool, decode and errors", async () => {
    const [a] = await fakes(1);
    started.push(a!);
    const big = 9223372036854775000n;
    a!.nextIdsScript = [{ ids: [big, big + 1n] }, { error: { code: Status.PERMISSION_DENIED, details: "no ids permission" } }];
    a!.streamScript = [{ batches: [range(1n, 2), range(3n, 2), range(5n, 1)] }];
    const answers = await run([
      open(a!.url),
      { op: "next_ids", count: 2 },
      { op: "next_ids", count: 1 },
      { op: "next_ids", count: 0 },
      { op: "stream", total: 5, batch_size: 2, pace_ms: 0, progress_every: 2 },
      { op: "pool_open", batch: 3, low_water: 0, max_age_ms: 600000 },
      { op: "pool_take", count: 2 },
      { op: "pool_close" },
      { op: "pool_take", count: 1 },
      { op: "decode", id: String((7n << 22n) | (3n << 10n) | 9n) },
      { op: "decode", id: "9223372036854775808" },
      { op: "close" },
      { op: "next_ids", count: 1 },
      { op: "open", endpoints: ["nope"] },
    ]);
    assert.deepEqual(answers, [
      { ok: true },
      { ok: true, ids: ["9223372036854775000", "9223372036854775001"] },
      { ok: false, code: "PERMISSION_DENIED", message: "no ids permission" },
      { ok: false, code: "INVALID_ARGUMENT", message: "count must be 1 to 100000, got 0" },
      { progress: { received: 4, last_id: "4" } },
      { ok: true, ids: ["1", "2", "3", "4", "5"] },
      { ok: true },
      { ok: true, ids: ["1", "2"] },
      { ok: true },
      { ok: false, code: "FAILED_PRECONDITION", message: "pool closed", ids: [] },
      { ok: true, unix_ms: 1767225600007, machine_id: 3, sequence: 9 },
      {
        ok: false,
        code: "INVALID_ARGUMENT",
        message: "id 9223372036854775808 is outside the layout's ids 0 to 9223372036854775807",
      },
      { ok: true },
      { ok: false, code: "FAILED_PRECONDITION", message: "client closed" },
      {
        ok: false,
        code: "INVALID_ARGUMENT",
        message:
          'endpoints: invalid endpoint "nope": use host:port, http://host:port or https://host:port with a port from 1 to 65535',
      },
    ]);
  });

  test("a stream error answer carries the ids delivered before it", async () => {
    const [a] = await fakes(1);
    started.push(a!);
    a!.streamScript = [{ batches: [range(10n, 2)], end: { code: Status.OUT_OF_RANGE, details: "layout exhausted" } }];
    const answers = await run([open(a!.url), { op: "stream", total: 5, batch_size: 2, pace_ms: 0, progress_every: 0 }]);
    assert.deepEqual(answers[1], { ok: false, code: "OUT_OF_RANGE", message: "layout exhausted", ids: ["10", "11"] });
  });

  test("bench ops count what they took", async () => {
    const [a] = await fakes(1);
    started.push(a!);
    a!.streamScript = [{ batches: [range(1n, 1000), range(1001n, 1000)] }];
    const answers = await run([
      open(a!.url),
      { op: "bench_stream", total: 2000, batch_size: 1000 },
      { op: "bench_unary", concurrency: 2, seconds: 0.2 },
      { op: "bench_pool", count: 500 },
    ]);
    const [, stream, unary, pool] = answers;
    assert.equal(stream!.ok, true);
    assert.equal(stream!.ids, 2000);
    assert.equal(typeof stream!.seconds, "number");
    assert.equal(unary!.ok, true);
    assert.ok((unary!.calls as number) > 0);
    assert.equal(typeof unary!.p50_ms, "number");
    assert.equal(typeof unary!.p99_ms, "number");
    assert.equal(pool!.ok, true);
    assert.equal(pool!.ids, 500);
    assert.equal(typeof pool!.ns_per_id, "number");
  });
});
