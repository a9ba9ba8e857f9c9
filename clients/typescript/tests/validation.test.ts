// Settings and arguments refused when the client is built or before any call.

import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";

import { status as Status } from "@grpc/grpc-js";

import { SnowkeepClient } from "../src/index.js";
import { type Fake, fakes } from "./fake.js";

const started: Fake[] = [];
after(() => started.forEach((f) => f.stop()));

function refused(build: () => unknown, message: string): void {
  assert.throws(build, (e: unknown) => {
    const err = e as { code: number; codeName: string; message: string };
    assert.equal(err.code, Status.INVALID_ARGUMENT);
    assert.equal(err.codeName, "INVALID_ARGUMENT");
    assert.equal(err.message, message);
    return true;
  });
}

describe("endpoints", () => {
  const hint = "use host:port, http://host:port or https://host:port with a port from 1 to 65535";
  test("an empty list is refused", () => {
    refused(() => new SnowkeepClient([]), "endpoints: give at least one endpoint (host:port, http://host:port or https://host:port)");
  });
  for (const bad of ["localhost", "http://localhost", "127.0.0.1:0", "127.0.0.1:65536", "ftp://127.0.0.1:80", "", "http://a b:1", "grpc://x:1"]) {
    test(`${JSON.stringify(bad)} is refused naming endpoints and the value`, () => {
      refused(() => new SnowkeepClient(["127.0.0.1:1", bad]), `endpoints: invalid endpoint ${JSON.stringify(bad)}: ${hint}`);
    });
  }
  for (const good of ["127.0.0.1:50051", "http://localhost:1", "https://snowkeep.example:65535", "http://[::1]:50051", "localhost:50051/"]) {
    test(`${good} is accepted`, () => {
      new SnowkeepClient([good]).close();
    });
  }
});

describe("api key", () => {
  for (const bad of ["a b", "k.secret\n", "k.sécret", "", "\tk.s"]) {
    test(`${JSON.stringify(bad)} is refused naming api_key`, () => {
      refused(() => new SnowkeepClient(["127.0.0.1:1"], { apiKey: bad }), "api_key: an API key is <id>.<secret> in printable ASCII, without whitespace");
    });
  }
});

describe("tls files", () => {
  const dir = mkdtempSync(join(tmpdir(), "snowkeep-ts-"));
  const pem = join(dir, "x.pem");
  writeFileSync(pem, "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n");
  const missing = join(dir, "missing.pem");
  test("an unreadable CA file is refused naming tls.ca and the path", () => {
    refused(() => new SnowkeepClient(["https://127.0.0.1:1"], { tls: { ca: missing } }), `tls.ca: cannot read ${JSON.stringify(missing)} (ENOENT)`);
  });
  test("an unreadable cert file is refused naming tls.cert", () => {
    refused(() => new SnowkeepClient(["https://127.0.0.1:1"], { tls: { cert: missing, key: pem } }), `tls.cert: cannot read ${JSON.stringify(missing)} (ENOENT)`);
  });
  test("an unreadable key file is refused naming tls.key", () => {
    refused(() => new SnowkeepClient(["https://127.0.0.1:1"], { tls: { cert: pem, key: dir } }), `tls.key: cannot read ${JSON.stringify(dir)} (EISDIR)`);
  });
  test("a certificate without its key is refused", () => {
    refused(() => new SnowkeepClient(["https://127.0.0.1:1"], { tls: { cert: pem } }), "tls.key: a client certificate (tls.cert) needs its key");
  });
  test("a key without its certificate is refused", () => {
    refused(() => new SnowkeepClient(["https://127.0.0.1:1"], { tls: { key: pem, cert: null } }), "tls.cert: a client key (tls.key) needs its certificate");
  });
});

describe("counts", () => {
  for (const count of [0, 100_001, -1, 1.5, Number.NaN]) {
    test(`nextIds(${count}) is refused before any call`, async () => {
      const [a] = await fakes(1);
      started.push(a!);
      const client = new SnowkeepClient([a!.url]);
      await assert.rejects(client.nextIds(count), {
        code: Status.INVALID_ARGUMENT,
        codeName: "INVALID_ARGUMENT",
        message: `count must be 1 to 100000, got ${count}`,
      });
      assert.equal(a!.calls, 0);
      client.close();
    });
  }
  for (const [count, shown] of [[3n, "bigint 3"], ["3", "string 3"]] as const) {
    test(`nextIds of the ${shown} is refused as not a number`, async () => {
      const [a] = await fakes(1);
      started.push(a!);
      const client = new SnowkeepClient([a!.url]);
      await assert.rejects(client.nextIds(count as unknown as number), {
        code: Status.INVALID_ARGUMENT,
        message: `count must be a number (an integer of 1 to 100000), got the ${shown}`,
      });
      assert.equal(a!.calls, 0);
      client.close();
    });
  }
  test("nextIds(100000) is sent", async () => {
    const [a] = await fakes(1);
    started.push(a!);
    const client = new SnowkeepClient([a!.url]);
    const ids = await client.nextIds(100_000);
    assert.equal(ids.length, 100_000);
    assert.equal(ids[99_999], 100_000n);
    client.close();
  });
});
