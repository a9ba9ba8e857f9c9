// Builds dist/esm (ES modules) and dist/cjs (CommonJS), each with its .d.ts
// files and a package.json that tells Node the module kind of its folder.
import { execFileSync } from "node:child_process";
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = join(dirname(fileURLToPath(import.meta.url)), "..");
const tsc = join(here, "node_modules", "typescript", "bin", "tsc");
rmSync(join(here, "dist"), { recursive: true, force: true });
for (const [config, dir, type] of [
  ["tsconfig.json", "esm", "module"],
  ["tsconfig.cjs.json", "cjs", "commonjs"],
]) {
  try {
    execFileSync(process.execPath, [tsc, "-p", join(here, config)], { stdio: "inherit" });
  } catch {
    process.exit(1);
  }
  mkdirSync(join(here, "dist", dir), { recursive: true });
  writeFileSync(join(here, "dist", dir, "package.json"), JSON.stringify({ type }) + "\n");
}
