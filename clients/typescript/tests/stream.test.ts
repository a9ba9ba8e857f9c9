// The resuming stream against scripted fakes.

import assert from "node:assert/strict";
import { after, describe, test } from "node:test";

import { status as Status } from "@grpc/grpc-js";

import { SnowkeepClient, SnowkeepError } from "../src/index.js";
import { BUDGET_CUTS, type Fake, fakes, range } from "./fake.js";

const started: Fake[] = [];
async function servers(n: number): Promise<Fake[]> {
  const f = await fakes(n);
  started.push(...f);
  return f;
}
after(() => started.forEach((f) => f.stop()));

const fast = { backoffMs: 1, maxBackoffMs: 1 };

async function collect(it: AsyncIterable<bigint[]>): Promise<{ batches: bigint[][]; error: unknown }> {
  const batches: bigint[][] = [];
  try {
    for await (const b of it) batches.push(b);
  } catch (error) {
    return { batches, error };
  }
  return { batches, error: null };
}

describe("stream", () => {
  test("delivers exactly total ids from one server and asks for total and batch size", async () => {
    const [a] = await servers(1);
    a!.streamScript = [{ batches: [range(10n, 4), range(14n, 4), range(18n, 2)] }];
    const client = new SnowkeepClient([a!.url]);
    const { batches, error } = await collect(client.stream(10n, { batchSize: 4 }));
    assert.equal(error, null);
    assert.deepEqual(batches, [range(10n, 4), range(14n, 4), range(18n, 2)]);
    assert.equal(a!.streamCalls[0]!.total, 10n);
    assert.equal(a!.streamCalls[0]!.batchSize, 4);
    client.close();
  });

  test("resumes the rest on the next endpoint after a retryable end", async () => {
    const [a, b] = await servers(2);
    a!.streamScript = [{ batches: [range(100n, 4)], end: { code: Status.UNAVAILABLE, details: "shutting down" } }];
    b!.streamScript = [{ batches: [range(50n, 3), range(53n, 3)] }];
    const client = new SnowkeepClient([a!.url, b!.url], fast);
    const { batches, error } = await collect(client.stream(10, { batchSize: 4 }));
    assert.equal(error, null);
    assert.deepEqual(batches, [range(100n, 4), range(50n, 3), range(53n, 3)]);
    assert.deepEqual(
      [a!.streamCalls.map((r) => r.total), b!.streamCalls.map((r) => r.total)],
      [[10n], [6n]],
    );
    client.close();
  });

  test("a stream ended with OK before its total is resumed too", async () => {
    const [a, b] = await servers(2);
    a!.streamScript = [{ batches: [range(1n, 2)] }];
    b!.streamScript = [{ batches: [range(7n, 3)] }];
    const client = new SnowkeepClient([a!.url, b!.url], fast);
    const { batches, error } = await collect(client.stream(5n));
    assert.equal(error, null);
    assert.deepEqual(batches, [range(1n, 2), range(7n, 3)]);
    assert.deepEqual(b!.streamCalls.map((r) => r.total), [3n]);
    client.close();
  });

  test("never delivers more than total", async () => {
    const [a] = await servers(1);
    a!.streamScript = [{ batches: [range(1n, 4), range(5n, 4)] }];
    const client = new SnowkeepClient([a!.url]);
    const { batches, error } = await collect(client.stream(6n));
    assert.equal(error, null);
    assert.deepEqual(batches, [range(1n, 4), range(5n, 2)]);
    client.close();
  });

  test("a non-retryable end surfaces after the batches delivered", async () => {
    const [a, b] = await servers(2);
    a!.streamScript = [{ batches: [range(1n, 3)], end: { code: Status.OUT_OF_RANGE, details: "out of range" } }];
    const client = new SnowkeepClient([a!.url, b!.url], fast);
    const { batches, error } = await collect(client.stream(10n));
    assert.deepEqual(batches, [range(1n, 3)]);
    assert.ok(error instanceof SnowkeepError);
    assert.equal(error.code, Status.OUT_OF_RANGE);
    assert.equal(error.details, "out of range");
    assert.equal(b!.streamCalls.length, 0);
    client.close();
  });

  test("a spent budget after a part ended fails with its error, after the batches delivered", async () => {
    const [a] = await servers(1);
    const down = { code: Status.UNAVAILABLE, details: "lease lost" };
    a!.streamScript = [
      { batches: [range(1n, 2)], end: down },
      { batches: [range(3n, 2)], end: down },
      { batches: [], end: down },
    ];
    // Backoff far above the budget: after a failed round with no batch, the budget is spent.
    const client = new SnowkeepClient([a!.url], { retryBudgetMs: 200, backoffMs: 5000, maxBackoffMs: 5000 });
    const { batches, error } = await collect(client.stream(10n));
    assert.deepEqual(batches, [range(1n, 2)]);
    assert.ok(error instanceof SnowkeepError);
    assert.equal(error.codeName, "UNAVAILABLE");
    assert.equal(error.details, "lease lost");
    assert.equal(a!.streamCalls.length, 1);
    client.close();
  });

  test("a resume the budget cuts short reports the part's end, not DEADLINE_EXCEEDED", async () => {
    const [a] = await servers(1);
    a!.streamScript = [
      { batches: [range(1n, 2)], end: { code: Status.UNAVAILABLE, details: "lease lost" } },
      { batches: [], hang: true },
    ];
    const client = new SnowkeepClient([a!.url], BUDGET_CUTS);
    const { batches, error } = await collect(client.stream(10n));
    assert.deepEqual(batches, [range(1n, 2)]);
    assert.ok(error instanceof SnowkeepError);
    assert.equal(error.codeName, "UNAVAILABLE");
    assert.equal(error.details, "lease lost");
    assert.equal(a!.streamCalls.length, 2);
    client.close();
  });

  test("a batch forgets the failures before it: a stall after it is what a spent budget reports", async () => {
    const [a] = await servers(1);
    a!.streamScript = [
      { batches: [], end: { code: Status.UNAVAILABLE, details: "a down" } },
      { batches: [range(1n, 2)], hang: true },
    ];
    const client = new SnowkeepClient([a!.url], BUDGET_CUTS);
    const { batches, error } = await collect(client.stream(10n));
    assert.deepEqual(batches, [range(1n, 2)]);
    assert.ok(error instanceof SnowkeepError);
    assert.equal(error.codeName, "DEADLINE_EXCEEDED");
    assert.equal(a!.streamCalls.length, 2);
    client.close();
  });

  test("after a batch, a part waits requestTimeoutMs for the next, however little budget it opened with", async () => {
    const [a] = await servers(1);
    // The first part sends nothing until requestTimeoutMs (600 ms) ends it;
    // the second opens with about 200 ms of the 800 ms budget left, and
    // its batches then come 400 ms apart, within requestTimeoutMs.
    a!.streamScript = [
      { batches: [], hang: true },
      { batches: [range(1n, 2), range(3n, 2), range(5n, 2)], gapMs: 400 },
    ];
    const client = new SnowkeepClient([a!.url], {
      requestTimeoutMs: 600,
      retryBudgetMs: 800,
      backoffMs: 1,
      maxBackoffMs: 1,
    });
    const { batches, error } = await collect(client.stream(6n));
    assert.equal(error, null);
    assert.deepEqual(batches, [range(1n, 2), range(3n, 2), range(5n, 2)]);
    assert.equal(a!.streamCalls.length, 2);
    client.close();
  });

  test("with two endpoints each failure moves to the other at once", async () => {
    const [a, b] = await servers(2);
    const down = { code: Status.UNAVAILABLE, details: "down" };
    a!.streamScript = [{ batches: [range(1n, 2)], end: down }, { batches: [range(20n, 2)] }];
    b!.streamScript = [{ batches: [range(10n, 2)], end: down }];
    const client = new SnowkeepClient([a!.url, b!.url], { backoffMs: 5000, maxBackoffMs: 5000 });
    const { batches, error } = await collect(client.stream(6n));
    assert.equal(error, null);
    assert.deepEqual(batches, [range(1n, 2), range(10n, 2), range(20n, 2)]);
    assert.deepEqual(a!.streamCalls.map((r) => r.total), [6n, 2n]);
    client.close();
  });

  test("leaving the loop early cancels the call", async () => {
    const [a] = await servers(1);
    a!.streamScript = [{ batches: [range(1n, 2)], hang: true }];
    const client = new SnowkeepClient([a!.url]);
    for await (const b of client.stream(100n)) {
      assert.deepEqual(b, [1n, 2n]);
      break;
    }
    client.close();
  });

  test("aborting mid-stream rejects with AbortError after the batches", async () => {
    const [a, b] = await servers(2);
    a!.streamScript = [{ batches: [range(1n, 2), range(3n, 2), range(5n, 2)], hang: true }];
    const client = new SnowkeepClient([a!.url, b!.url]);
    const ac = new AbortController();
    const got: bigint[][] = [];
    await assert.rejects(async () => {
      for await (const batch of client.stream(100n, { signal: ac.signal })) {
        got.push(batch);
        ac.abort();
      }
    }, { name: "AbortError" });
    assert.deepEqual(got, [[1n, 2n]]);
    assert.equal(b!.calls, 0);
    client.close();
  });

  test("a bad total or batch size is refused before any call", async () => {
    const [a] = await servers(1);
    const client = new SnowkeepClient([a!.url]);
    for (const total of [0n, -1n, 1n << 63n, 0, 1.5]) {
      assert.throws(() => client.stream(total), { code: Status.INVALID_ARGUMENT, message: /^total must be 1 to 9223372036854775807/ });
    }
    for (const batchSize of [-1, 100_001, 2.5]) {
      assert.throws(() => client.stream(5n, { batchSize }), { code: Status.INVALID_ARGUMENT, message: /^batchSize \(the contract's batch_size\) must be 0 to 100000/ });
    }
    assert.equal(a!.calls, 0);
    client.close();
  });
});
