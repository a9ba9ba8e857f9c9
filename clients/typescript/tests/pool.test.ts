// The prefetching pool against scripted fakes.

import assert from "node:assert/strict";
import { after, describe, test } from "node:test";
import { setTimeout as delay } from "node:timers/promises";

import { status as Status } from "@grpc/grpc-js";

import { SnowkeepClient } from "../src/index.js";
import { type Fake, fakes, range } from "./fake.js";

const started: Fake[] = [];
async function servers(n: number): Promise<Fake[]> {
  const f = await fakes(n);
  started.push(...f);
  return f;
}
after(() => started.forEach((f) => f.stop()));

/** A fake whose k-th NextIds answers the ids k*1000+1 .. k*1000+count. */
function counting(f: Fake): void {
  f.nextIdsDefault = (req) => ({ ids: range(BigInt(f.nextIdsCalls.length * 1000 + 1), req.count) });
}

describe("pool", () => {
  test("hands out the fetched ids in order and refills at the low-water mark", async () => {
    const [a] = await servers(1);
    counting(a!);
    const client = new SnowkeepClient([a!.url]);
    const pool = client.pool({ batch: 4, lowWater: 1 });
    const got: bigint[] = [];
    for (let i = 0; i < 6; i++) got.push(await pool.next());
    assert.deepEqual(got, [1n, 2n, 3n, 4n, 1001n, 1002n]);
    // The start, then one refill when 1 id was left: both asked for the batch.
    assert.deepEqual(a!.nextIdsCalls.map((r) => r.count), [4, 4]);
    pool.close();
    client.close();
  });

  test("defaults: batch 100, low water 25, max age 10 minutes", async () => {
    const [a] = await servers(1);
    const client = new SnowkeepClient([a!.url]);
    const pool = client.pool();
    assert.deepEqual([pool.batch, pool.lowWater, pool.maxAgeMs], [100, 25, 600_000]);
    assert.equal(await pool.next(), 1n);
    assert.deepEqual(a!.nextIdsCalls.map((r) => r.count), [100]);
    pool.close();
    client.close();
  });

  test("ids older than max age are dropped, never handed out", async () => {
    const [a] = await servers(1);
    counting(a!);
    const client = new SnowkeepClient([a!.url]);
    const pool = client.pool({ batch: 10, lowWater: 0, maxAgeMs: 30 });
    assert.equal(await pool.next(), 1n);
    await delay(60); // the condition under test is the passing of time itself
    assert.equal(await pool.next(), 1001n);
    pool.close();
    client.close();
  });

  test("next fails with the refill's last error when the budget is spent", async () => {
    const [a] = await servers(1);
    a!.nextIdsDefault = () => ({ error: { code: Status.UNAVAILABLE, details: "no lease" } });
    const client = new SnowkeepClient([a!.url], { retryBudgetMs: 50, backoffMs: 1000, maxBackoffMs: 1000 });
    const pool = client.pool({ batch: 5 });
    await assert.rejects(pool.next(), { code: Status.UNAVAILABLE, details: "no lease" });
    pool.close();
    client.close();
  });

  test("close stops the refill; next after close fails with pool closed", async () => {
    const [a] = await servers(1);
    a!.nextIdsScript = ["hang"];
    const client = new SnowkeepClient([a!.url]);
    const pool = client.pool({ batch: 5 });
    const waiting = pool.next();
    await a!.called(1);
    pool.close();
    await assert.rejects(waiting, { code: Status.FAILED_PRECONDITION, details: "pool closed" });
    await assert.rejects(pool.next(), { code: Status.FAILED_PRECONDITION, details: "pool closed", retryable: false });
    assert.equal(a!.nextIdsCalls.length, 1);
    client.close();
  });

  test("at most one refill is in flight", async () => {
    const [a] = await servers(1);
    counting(a!);
    const client = new SnowkeepClient([a!.url]);
    const pool = client.pool({ batch: 3, lowWater: 2 });
    const got = await Promise.all(Array.from({ length: 7 }, () => pool.next()));
    assert.deepEqual(got, [1n, 2n, 3n, 1001n, 1002n, 1003n, 2001n]);
    // Three fetches served the seven ids; a fourth may have started since.
    assert.ok(a!.nextIdsCalls.length === 3 || a!.nextIdsCalls.length === 4, `${a!.nextIdsCalls.length} calls`);
    assert.ok(a!.nextIdsCalls.every((r) => r.count === 3));
    pool.close();
    client.close();
  });

  test("an aborted wait rejects with AbortError", async () => {
    const [a] = await servers(1);
    a!.nextIdsScript = ["hang"];
    const client = new SnowkeepClient([a!.url]);
    const pool = client.pool({ batch: 5 });
    const ac = new AbortController();
    const waiting = pool.next({ signal: ac.signal });
    await a!.called(1);
    ac.abort();
    await assert.rejects(waiting, { name: "AbortError" });
    pool.close();
    client.close();
  });

  test("bad settings are refused", async () => {
    const [a] = await servers(1);
    const client = new SnowkeepClient([a!.url]);
    assert.throws(() => client.pool({ batch: 0 }), { code: Status.INVALID_ARGUMENT, message: "batch must be 1 to 100000, got 0" });
    assert.throws(() => client.pool({ batch: 100_001 }), { code: Status.INVALID_ARGUMENT });
    assert.throws(() => client.pool({ batch: 10, lowWater: 10 }), {
      code: Status.INVALID_ARGUMENT,
      message: "lowWater must be 0 to 9 (batch - 1), got 10",
    });
    assert.throws(() => client.pool({ maxAgeMs: 0 }), { code: Status.INVALID_ARGUMENT });
    assert.equal(a!.calls, 0);
    client.close();
  });
});
