// Run a wasm32-wasip1 program (a test binary) under Node's WASI, with the filesystem
// visible at its own paths: `node scripts/wasi-run.mjs PROGRAM.wasm [ARGS...]`.
// Cargo uses it as the runner for `--target wasm32-wasip1` (scripts/test-wasm).
import { readFile } from "node:fs/promises";
import { WASI } from "node:wasi";

const [program, ...args] = process.argv.slice(2);
const wasi = new WASI({
  version: "preview1",
  args: [program, ...args],
  env: process.env,
  preopens: { "/": "/" },
  returnOnExit: true,
});
const module = await WebAssembly.compile(await readFile(program));
const instance = await WebAssembly.instantiate(module, wasi.getImportObject());
process.exitCode = wasi.start(instance);
