// nextIds, the retry rule, ejection, the budget, cancellation and close,
// against in-process fakes of snowkeep.v1.IdService.

import assert from "node:assert/strict";
import { after, describe, test } from "node:test";

import { status as Status } from "@grpc/grpc-js";

import { AbortError, SnowkeepClient, SnowkeepError, isRetryableCode } from "../src/index.js";
import { BUDGET_CUTS, deadUrl, type Fake, fakes, range } from "./fake.js";

const started: Fake[] = [];
async function servers(n: number): Promise<Fake[]> {
  const f = await fakes(n);
  started.push(...f);
  return f;
}
after(() => started.forEach((f) => f.stop()));

const fast = { backoffMs: 1, maxBackoffMs: 1 };

const RETRYABLE = [
  Status.UNAVAILABLE,
  Status.DEADLINE_EXCEEDED,
  Status.UNKNOWN,
  Status.CANCELLED,
  Status.RESOURCE_EXHAUSTED,
  Status.ABORTED,
  Status.INTERNAL,
  Status.FAILED_PRECONDITION,
  Status.NOT_FOUND,
];
const FINAL = [
  Status.INVALID_ARGUMENT,
  Status.UNAUTHENTICATED,
  Status.PERMISSION_DENIED,
  Status.OUT_OF_RANGE,
  Status.UNIMPLEMENTED,
  Status.ALREADY_EXISTS,
  Status.DATA_LOSS,
];

describe("nextIds", () => {
  test("returns the server's ids as bigints, exactly, above 2^53 too", async () => {
    const [a] = await servers(1);
    const big = (1n << 62n) + 1n;
    a!.nextIdsScript = [{ ids: [big, big + 1n, big + 2n] }];
    const client = new SnowkeepClient([a!.url]);
    assert.deepEqual(await client.nextIds(3), [4611686018427387905n, 4611686018427387906n, 4611686018427387907n]);
    assert.equal(a!.nextIdsCalls[0]!.count, 3);
    client.close();
  });

  test("sends the API key as authorization: Bearer on every call", async () => {
    const [a] = await servers(1);
    const client = new SnowkeepClient([a!.url], { apiKey: "k0123456789ab.s3cret" });
    await client.nextIds(1);
    await client.nextIds(2);
    assert.deepEqual(
      a!.metadata.map((m) => m.get("authorization")),
      [["Bearer k0123456789ab.s3cret"], ["Bearer k0123456789ab.s3cret"]],
    );
    client.close();
  });

  test("sends no authorization without a key", async () => {
    const [a] = await servers(1);
    const client = new SnowkeepClient(a!.url);
    await client.nextIds(1);
    assert.deepEqual(a!.metadata[0]!.get("authorization"), []);
    client.close();
  });

  test("goes round-robin over the endpoints", async () => {
    const [a, b, c] = await servers(3);
    const client = new SnowkeepClient([a!.url, b!.url, c!.url]);
    for (let i = 0; i < 6; i++) await client.nextIds(1);
    assert.deepEqual([a!.nextIdsCalls.length, b!.nextIdsCalls.length, c!.nextIdsCalls.length], [2, 2, 2]);
    client.close();
  });

  for (const code of RETRYABLE) {
    test(`retries code ${code} on the next endpoint`, async () => {
      const [a, b] = await servers(2);
      a!.nextIdsScript = [{ error: { code, details: "busy" } }];
      const client = new SnowkeepClient([a!.url, b!.url], fast);
      assert.deepEqual(await client.nextIds(3), [1n, 2n, 3n]);
      assert.deepEqual([a!.nextIdsCalls.length, b!.nextIdsCalls.length], [1, 1]);
      client.close();
    });
  }

  for (const code of FINAL) {
    test(`surfaces code ${code} after one attempt with the server's message`, async () => {
      const [a, b] = await servers(2);
      a!.nextIdsScript = [{ error: { code, details: `refused ${code}` } }];
      const client = new SnowkeepClient([a!.url, b!.url], fast);
      const err = await client.nextIds(3).then(
        () => assert.fail("expected an error"),
        (e: unknown) => e,
      );
      assert.ok(err instanceof SnowkeepError);
      assert.ok(err instanceof Error);
      assert.equal(err.code, code);
      assert.equal(err.details, `refused ${code}`);
      assert.equal(err.message, `refused ${code}`);
      assert.deepEqual([a!.nextIdsCalls.length, b!.nextIdsCalls.length], [1, 0]);
      client.close();
    });
  }

  test("the retryable list is exactly the nine codes", () => {
    const all = Array.from({ length: 17 }, (_, c) => c).filter(isRetryableCode);
    assert.deepEqual(all, [...RETRYABLE].sort((x, y) => x - y));
  });

  test("codeName is the canonical name", async () => {
    const [a] = await servers(1);
    a!.nextIdsScript = [{ error: { code: Status.PERMISSION_DENIED, details: "no" } }];
    const client = new SnowkeepClient(a!.url);
    await assert.rejects(client.nextIds(1), { name: "SnowkeepError", code: 7, codeName: "PERMISSION_DENIED" });
    client.close();
  });

  test("a refused connection counts as UNAVAILABLE and fails over", async () => {
    const dead = await deadUrl();
    const [b] = await servers(1);
    const client = new SnowkeepClient([dead, b!.url], fast);
    assert.deepEqual(await client.nextIds(2), [1n, 2n]);
    client.close();
  });

  test("an ejected endpoint is skipped until its ejection ends", async () => {
    const [a, b] = await servers(2);
    a!.nextIdsScript = [{ error: { code: Status.UNAVAILABLE, details: "down" } }];
    const client = new SnowkeepClient([a!.url, b!.url], { backoffMs: 60_000, maxBackoffMs: 60_000 });
    for (let i = 0; i < 4; i++) await client.nextIds(1);
    assert.deepEqual([a!.nextIdsCalls.length, b!.nextIdsCalls.length], [1, 4]);
    client.close();
  });

  test("with every endpoint failing, the next round after the backoff reaches the one that recovered", async () => {
    const [a, b] = await servers(2);
    a!.nextIdsScript = [{ error: { code: Status.UNAVAILABLE, details: "a down" } }];
    b!.nextIdsScript = [
      { error: { code: Status.UNAVAILABLE, details: "b down" } },
      { error: { code: Status.UNAVAILABLE, details: "b down" } },
    ];
    const client = new SnowkeepClient([a!.url, b!.url], { backoffMs: 1, maxBackoffMs: 1 });
    assert.deepEqual(await client.nextIds(1), [1n]);
    assert.deepEqual([a!.nextIdsCalls.length, b!.nextIdsCalls.length], [2, 1]);
    client.close();
  });

  test("a spent retry budget fails with the last retryable error, no sleep past it", async () => {
    const [a, b] = await servers(2);
    a!.nextIdsDefault = () => ({ error: { code: Status.UNAVAILABLE, details: "a is down" } });
    b!.nextIdsDefault = () => ({ error: { code: Status.RESOURCE_EXHAUSTED, details: "b is busy" } });
    // The first sleep (>= 800 ms) would end after the 100 ms budget: no second round.
    const client = new SnowkeepClient([a!.url, b!.url], { retryBudgetMs: 100, backoffMs: 1000, maxBackoffMs: 1000 });
    await assert.rejects(client.nextIds(1), { code: Status.RESOURCE_EXHAUSTED, details: "b is busy" });
    assert.deepEqual([a!.nextIdsCalls.length, b!.nextIdsCalls.length], [1, 1]);
    client.close();
  });

  test("an attempt past its request timeout is DEADLINE_EXCEEDED and fails over", async () => {
    const [a, b] = await servers(2);
    a!.nextIdsScript = ["hang"];
    const client = new SnowkeepClient([a!.url, b!.url], { requestTimeoutMs: 100, ...fast });
    assert.deepEqual(await client.nextIds(2), [1n, 2n]);
    assert.deepEqual([a!.nextIdsCalls.length, b!.nextIdsCalls.length], [1, 1]);
    client.close();
  });

  test("the attempt deadline is the budget left when that is shorter", async () => {
    const [a] = await servers(1);
    a!.nextIdsDefault = () => "hang";
    const client = new SnowkeepClient([a!.url], { requestTimeoutMs: 60_000, retryBudgetMs: 150 });
    await assert.rejects(client.nextIds(1), { code: Status.DEADLINE_EXCEEDED });
    assert.equal(a!.nextIdsCalls.length, 1);
    client.close();
  });

  test("an attempt the budget cuts short reports the failure before it, not DEADLINE_EXCEEDED", async () => {
    const [a] = await servers(1);
    a!.nextIdsScript = [{ error: { code: Status.UNAVAILABLE, details: "a is down" } }, "hang"];
    const client = new SnowkeepClient([a!.url], BUDGET_CUTS);
    await assert.rejects(client.nextIds(1), { code: Status.UNAVAILABLE, details: "a is down" });
    assert.equal(a!.nextIdsCalls.length, 2);
    client.close();
  });
});

describe("cancellation", () => {
  test("aborting a call in flight rejects with AbortError, never retried", async () => {
    const [a, b] = await servers(2);
    a!.nextIdsScript = ["hang"];
    const client = new SnowkeepClient([a!.url, b!.url], fast);
    const ac = new AbortController();
    const call = client.nextIds(1, { signal: ac.signal });
    await a!.called(1);
    ac.abort(new Error("caller gave up"));
    await assert.rejects(call, (e: unknown) => {
      assert.ok(e instanceof AbortError);
      assert.equal(e.name, "AbortError");
      assert.equal((e.cause as Error).message, "caller gave up");
      return true;
    });
    assert.deepEqual([a!.nextIdsCalls.length, b!.nextIdsCalls.length], [1, 0]);
    client.close();
  });

  test("an already aborted signal makes no call", async () => {
    const [a] = await servers(1);
    const client = new SnowkeepClient([a!.url]);
    await assert.rejects(client.nextIds(1, { signal: AbortSignal.abort() }), { name: "AbortError" });
    assert.equal(a!.calls, 0);
    client.close();
  });

  test("aborting during the backoff sleep rejects with AbortError", async () => {
    const [a] = await servers(1);
    a!.nextIdsDefault = () => ({ error: { code: Status.UNAVAILABLE, details: "down" } });
    const client = new SnowkeepClient([a!.url], { backoffMs: 60_000, maxBackoffMs: 60_000, retryBudgetMs: 120_000 });
    const ac = new AbortController();
    const call = client.nextIds(1, { signal: ac.signal });
    await a!.called(1);
    ac.abort();
    await assert.rejects(call, { name: "AbortError" });
    assert.equal(a!.nextIdsCalls.length, 1);
    client.close();
  });
});

describe("close", () => {
  test("calls after close fail with FAILED_PRECONDITION client closed", async () => {
    const [a] = await servers(1);
    const client = new SnowkeepClient([a!.url]);
    client.close();
    client.close();
    await assert.rejects(client.nextIds(1), { code: Status.FAILED_PRECONDITION, details: "client closed", retryable: false });
    await assert.rejects(client.decode(1n), { code: Status.FAILED_PRECONDITION, details: "client closed" });
    assert.throws(() => client.pool(), { code: Status.FAILED_PRECONDITION, details: "client closed" });
    await assert.rejects(async () => {
      for await (const _ of client.stream(1n)) {
        assert.fail("no batch expected");
      }
    }, { code: Status.FAILED_PRECONDITION, details: "client closed" });
    assert.equal(a!.calls, 0);
  });

  test("building a client makes no call", async () => {
    const [a] = await servers(1);
    const client = new SnowkeepClient([a!.url, "127.0.0.1:1"]);
    client.close();
    assert.equal(a!.calls, 0);
    assert.deepEqual(range(5n, 2), [5n, 6n]);
  });
});
