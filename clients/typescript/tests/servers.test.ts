// The endpoint choice and ejection bookkeeping, and the jitter, without calls.

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { checkSettings } from "../src/options.js";
import { jittered } from "../src/retry.js";
import { Servers, now } from "../src/servers.js";

function servers(n: number, backoffMs = 20, maxBackoffMs = 1000): Servers {
  const endpoints = Array.from({ length: n }, (_, i) => `127.0.0.1:${1000 + i}`);
  return new Servers(checkSettings(endpoints, { backoffMs, maxBackoffMs }));
}

function picks(s: Servers, n: number): number[] {
  return Array.from({ length: n }, () => s.list.indexOf(s.pick()));
}

describe("endpoint choice", () => {
  test("round-robin over the endpoints", () => {
    const s = servers(3);
    assert.deepEqual(picks(s, 7), [0, 1, 2, 0, 1, 2, 0]);
    s.close();
  });

  test("an ejected endpoint is skipped, and comes back once cleared", () => {
    const s = servers(3);
    s.eject(s.list[1]!);
    assert.deepEqual(picks(s, 4), [0, 2, 0, 2]);
    s.clear(s.list[1]!);
    assert.deepEqual(picks(s, 3), [0, 1, 2]);
    s.close();
  });

  test("with every endpoint ejected, the one whose ejection ends first", () => {
    const s = servers(3);
    const t = now();
    s.list[0]!.ejectedUntil = t + 3_000_000;
    s.list[1]!.ejectedUntil = t + 1_000_000;
    s.list[2]!.ejectedUntil = t + 2_000_000;
    assert.deepEqual(picks(s, 2), [1, 1]);
    s.close();
  });

  test("ejection doubles per consecutive failure up to max backoff", () => {
    const s = servers(1, 20, 100);
    const spans: number[] = [];
    for (let i = 0; i < 5; i++) {
      const before = now();
      s.eject(s.list[0]!);
      const after = now();
      const span = s.list[0]!.ejectedUntil - before;
      assert.ok(span >= 0 && span - (after - before) <= 100);
      spans.push(Math.round(span));
    }
    assert.deepEqual(spans, [20, 40, 80, 100, 100]);
    assert.equal(s.list[0]!.failures, 5);
    s.clear(s.list[0]!);
    assert.deepEqual([s.list[0]!.failures, s.list[0]!.ejectedUntil], [0, 0]);
    s.close();
  });
});

describe("jitter", () => {
  test("scales by a factor in [0.8, 1.2]", () => {
    assert.equal(jittered(100, () => 0), 80);
    assert.equal(jittered(100, () => 0.5), 100);
    assert.ok(Math.abs(jittered(100, () => 0.999999) - 120) < 1e-3);
    for (let i = 0; i < 1000; i++) {
      const d = jittered(20);
      assert.ok(d >= 16 && d < 24, String(d));
    }
  });
});
