// decode(id) under the layout GetInfo reports.

import assert from "node:assert/strict";
import { after, describe, test } from "node:test";

import { status as Status } from "@grpc/grpc-js";

import { decodeId, maxId, SnowkeepClient } from "../src/index.js";
import { type Fake, fakes, LAYOUT } from "./fake.js";

const started: Fake[] = [];
after(() => started.forEach((f) => f.stop()));

describe("decode", () => {
  test("splits an id under the server's layout, reading GetInfo once", async () => {
    const [a] = await fakes(1);
    started.push(a!);
    const client = new SnowkeepClient([a!.url]);
    // tick 123456789, machine 4095, sequence 1023 under 41/12/10
    const id = (123456789n << 22n) | (4095n << 10n) | 1023n;
    assert.deepEqual(await client.decode(id), {
      unixMs: 1767225600000 + 123456789,
      timestampMs: 123456789,
      machineId: 4095,
      sequence: 1023,
    });
    assert.deepEqual(await client.decode(1n), { unixMs: 1767225600000, timestampMs: 0, machineId: 0, sequence: 1 });
    assert.equal(a!.infoCalls, 1);
    client.close();
  });

  test("an id above the layout's largest is refused naming id", async () => {
    const [a] = await fakes(1);
    started.push(a!);
    const client = new SnowkeepClient([a!.url]);
    await assert.rejects(client.decode(1n << 63n), {
      code: Status.INVALID_ARGUMENT,
      message: "id 9223372036854775808 is outside the layout's ids 0 to 9223372036854775807",
    });
    await assert.rejects(client.decode(-1n), { code: Status.INVALID_ARGUMENT });
    client.close();
  });

  test("a time unit multiplies the ticks; 0 means 1 ms", () => {
    const js53 = { timestampBits: 39, machineBits: 6, sequenceBits: 8, epochUnixMs: 1767225600000n, timeUnitMs: 10 };
    const id = (1000n << 14n) | (5n << 8n) | 7n;
    assert.deepEqual(decodeId(js53, id), { unixMs: 1767225610000, timestampMs: 10000, machineId: 5, sequence: 7 });
    assert.equal(maxId(js53), 9007199254740991n);
    assert.throws(() => decodeId(js53, 9007199254740992n), { code: Status.INVALID_ARGUMENT });
  });

  test("a server reporting time unit 0 decodes in 1 ms ticks", async () => {
    const [a] = await fakes(1);
    started.push(a!);
    a!.layout = { ...LAYOUT, timeUnitMs: 0 };
    const client = new SnowkeepClient([a!.url]);
    assert.equal((await client.decode(5n << 22n)).unixMs, 1767225600005);
    assert.equal((await client.serverInfo()).layout.timeUnitMs, 1);
    client.close();
  });
});
