// Prompt and decode speed of the npm package (WebAssembly, one thread), under Node or in
// headless Chromium, beside the native CLI at one thread in the same run:
//   node [--experimental-websocket] crates/bitnet-web/bench/bench.mjs MODEL.gguf [--browser]
//        [--native target/release/bitnet] [--wasm auto|simd128|relaxed] [--lm-head f16|q8_0]
//        [--device cpu|webgpu|auto]
//        [--pkg target/web]
//        [-p 64] [-n 32] [-r 3]
// (--browser drives Chromium over a WebSocket, which Node 20 has behind that flag)
// prints a table like `bitnet bench`'s: tok/s (best of -r), and the ratio to native.
import { execFileSync } from "node:child_process";
import { basename, dirname, resolve } from "node:path";
import { pathToFileURL } from "node:url";

const args = process.argv.slice(2);
function take(name, dflt) {
  const i = args.indexOf(name);
  if (i < 0) return dflt;
  const v = args[i + 1];
  args.splice(i, 2);
  return v;
}
function flag(name) {
  const i = args.indexOf(name);
  if (i >= 0) args.splice(i, 1);
  return i >= 0;
}
const nPrompt = Number(take("-p", 64));
const nGen = Number(take("-n", 32));
const reps = Number(take("-r", 3));
const pkg = resolve(take("--pkg", "target/web"));
const nativeCli = take("--native", null);
const browser = flag("--browser");
const wasm = take("--wasm", "auto");
const lmHead = take("--lm-head", "f16");
const device = take("--device", "cpu");
const [modelArg] = args;
if (!modelArg) {
  console.error("usage: bench.mjs MODEL.gguf [--browser] [--native BITNET] [--wasm KIND] [--pkg DIR] [-p 64] [-n 32] [-r 3]");
  process.exit(2);
}
const modelPath = resolve(modelArg);

/** The measurement, run where the package runs (Node, or the page: it is sent as text). */
async function measure(Model, source, nPrompt, nGen, reps, wasm, lmHead, device) {
  const t0 = performance.now();
  const m = await Model.load(source, { device, ctxSize: nPrompt + nGen + 8, cache: false, wasm, lmHead });
  const loadMs = performance.now() - t0;
  const info = m.info;
  const ids = Array.from({ length: nPrompt }, (_, i) => (i * 7919 + 13) % info.nVocab);
  let pp = 0;
  let tg = 0;
  for (let r = 0; r < reps; r++) {
    const t = performance.now();
    await m.logits(ids);
    pp = Math.max(pp, nPrompt / ((performance.now() - t) / 1e3));
    m.reset();
    // Greedy from BOS, no stop: nGen tokens unless the model ends its text.
    const g = await m.generate([info.bos ?? 1], { maxTokens: nGen, temperature: 0 });
    tg = Math.max(tg, g.generatedTokens / (g.generationMs / 1e3));
  }
  const out = { pp, tg, loadMs, isa: info.isa, device: info.device, memoryBytes: m.info.memoryBytes, layers: info.nLayer, embd: info.nEmbd };
  m.free();
  return out;
}

let where;
let r;
if (browser) {
  const { Browser, findChromium, serve } = await import("../tests/chromium.mjs");
  const exe = findChromium();
  if (!exe) throw new Error("no Chromium found (chromium, chromium-browser, google-chrome or $BITNET_CHROMIUM)");
  const server = await serve(pkg, { model: dirname(modelPath) });
  const b = await Browser.launch(exe);
  try {
    await b.goto(`http://127.0.0.1:${server.address().port}/index.html`);
    const ua = await b.eval("navigator.userAgent");
    where = `headless ${ua.match(/(Headless)?Chrome\/[\d.]+/)?.[0] ?? "Chromium"}`;
    r = await b.eval(`import("/bitnet.js").then(({ Model }) =>
      (${measure.toString()})(Model, "/model/${basename(modelPath)}", ${nPrompt}, ${nGen}, ${reps}, ${JSON.stringify(wasm)}, ${JSON.stringify(lmHead)}, ${JSON.stringify(device)}))`);
  } finally {
    await b.close();
    server.close();
  }
} else {
  const { Model } = await import(pathToFileURL(resolve(pkg, "bitnet.js")).href);
  where = `Node ${process.versions.node}`;
  r = await measure(Model, modelPath, nPrompt, nGen, reps, wasm, lmHead, device);
}

let native = null;
if (nativeCli) {
  const out = execFileSync(nativeCli, ["bench", "-m", modelPath, "-p", String(nPrompt), "-n", String(nGen), "-t", "1", "-r", String(reps), "--lm-head", lmHead], { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] });
  const rate = (name) => Number(out.split("\n").find((l) => l.startsWith(name + " "))?.trim().split(/\s+/)[2]);
  native = { pp: rate(`pp${nPrompt}`), tg: rate(`tg${nGen}`) };
}
const mib = (n) => (n / 1048576).toFixed(0) + " MiB";
console.log(`model ${modelArg} | ${r.layers} layers, n_embd ${r.embd} | head ${lmHead} | ${where}, ${r.device === "cpu" ? "wasm tier " + r.isa : r.device} | load ${(r.loadMs / 1e3).toFixed(2)} s | wasm memory ${mib(r.memoryBytes)}`);
console.log(["test", "package tok/s", "native 1-thread tok/s", "ratio"].join("\t"));
for (const [name, v, n] of [[`pp${nPrompt}`, r.pp, native?.pp], [`tg${nGen}`, r.tg, native?.tg]]) {
  console.log([name, v.toFixed(2), n ? n.toFixed(2) : "-", n ? (v / n).toFixed(3) : "-"].join("\t"));
}
