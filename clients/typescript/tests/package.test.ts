// The package as users load it: `import` (ESM) and `require` (CommonJS)
// through package.json `exports`, and generated code that matches a fresh
// generation from the protos.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, readdirSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { describe, test } from "node:test";

const pkg = join(__dirname, "..", "..");

function node(args: string[]): string {
  return execFileSync(process.execPath, args, { cwd: pkg, encoding: "utf8" }).trim();
}

const probe =
  "const c = new m.SnowkeepClient(['127.0.0.1:1']); c.close();" +
  "const e = new m.SnowkeepError(3, 'x');" +
  "console.log([typeof m.SnowkeepClient, e instanceof Error, e.codeName, typeof m.IdPool, typeof m.AbortError].join(' '));";

describe("package", () => {
  test("import resolves the ES module build", () => {
    const out = node(["--input-type=module", "-e", `import * as m from '@snowkeep/client'; ${probe}`]);
    assert.equal(out, "function true INVALID_ARGUMENT function function");
  });

  test("require resolves the CommonJS build", () => {
    const out = node(["-e", `const m = require('@snowkeep/client'); ${probe}`]);
    assert.equal(out, "function true INVALID_ARGUMENT function function");
  });

  test("both builds ship type declarations", () => {
    const manifest = JSON.parse(readFileSync(join(pkg, "package.json"), "utf8"));
    const dot = manifest.exports["."];
    for (const file of [dot.import.types, dot.require.types, dot.import.default, dot.require.default]) {
      assert.ok(statSync(join(pkg, file)).isFile(), file);
    }
  });
});

function files(dir: string): Map<string, string> {
  const out = new Map<string, string>();
  const walk = (d: string): void => {
    for (const name of readdirSync(d)) {
      const p = join(d, name);
      if (statSync(p).isDirectory()) walk(p);
      else out.set(relative(dir, p), readFileSync(p, "utf8"));
    }
  };
  walk(dir);
  return out;
}

describe("generated code", () => {
  test("src/gen matches a fresh generation from the protos", () => {
    const fresh = mkdtempSync(join(tmpdir(), "snowkeep-gen-"));
    execFileSync(join(pkg, "generate"), ["--out", fresh], { stdio: "inherit" });
    const want = files(fresh);
    const have = files(join(pkg, "src", "gen"));
    assert.deepEqual([...have.keys()].sort(), [...want.keys()].sort());
    for (const [name, text] of want) {
      assert.ok(have.get(name) === text, `src/gen/${name} differs from a fresh generation: run clients/typescript/generate`);
    }
  });
});
