// The npm package and the chat page in a real browser: Debian's Chromium, headless, driven
// over the DevTools protocol, the package served over HTTP from BITNET_WEB_PKG (default
// target/web) with the golden files beside it. Checks the tiny golden model's logits against
// bitnet.cpp's with the fast gates and greedy text against the native CLI (BITNET_CLI), then
// chats on the page (streaming, Stop) and chats again with the server gone (the page and the
// model from the browser's caches). Without Chromium the tests fail when CI is set and are
// skipped, saying so, otherwise. Run by scripts/test-wasm.
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { resolve } from "node:path";
import { after, before, test } from "node:test";
import { Browser, findChromium, serve } from "./chromium.mjs";
import { PROMPTS, cli, f32s, gates, golden, modelPath, native as nativeBytes, pkg, promptText, reference, sameGreedy } from "./common.mjs";

const native = (args) => nativeBytes(args).toString("utf8");

const chromium = findChromium();
if (!chromium && process.env.CI) throw new Error("no Chromium found: CI must install it (apt-get install chromium)");
const skip = chromium ? false : "no Chromium found (chromium, chromium-browser, google-chrome or $BITNET_CHROMIUM)";
if (skip) console.log(`# SKIPPING the browser tests: ${skip}`);
if (!skip && !cli) throw new Error("BITNET_CLI must name the native bitnet binary (scripts/test-wasm sets it)");

let server, base, browser;
before(async () => {
  if (skip) return;
  server = await serve(pkg, { golden });
  base = `http://127.0.0.1:${server.address().port}`;
  browser = await Browser.launch(chromium);
});
after(async () => {
  await browser?.close();
  server?.close();
});

// Waits until the chat page's model is ready or has failed (the tests then assert no error);
// a timeout says what the page showed. Gives the seconds it took.
async function pageLoaded(ms) {
  const t0 = Date.now();
  try {
    await browser.waitFor("window.bitnetChat && (bitnetChat.ready || bitnetChat.error)", ms);
  } catch (e) {
    const shown = await browser
      .eval(`["status", "progress-text"].map((id) => document.getElementById(id)?.textContent).join(" | ")`)
      .catch(() => "(the page could not be read)");
    throw new Error(`${e.message}\nthe page showed: ${shown}`);
  }
  assert.equal(await browser.eval("bitnetChat.error"), null);
  return (Date.now() - t0) / 1000;
}

test("the package in Chromium: logits pass the gates (exact numerics: bit for bit), greedy text equals the native CLI's", { skip }, async () => {
  await browser.goto(`${base}/index.html`);
  const ua = await browser.eval("navigator.userAgent");
  const ids = PROMPTS.map((p) => reference(p).prompt_tokens);
  const texts = PROMPTS.map(promptText);
  const r = await browser.eval(`(async () => {
    const { Model, selfTest } = await import("/bitnet.js");
    const check = await selfTest("auto", 24);
    const m = await Model.load("/golden/bitnet-tiny-i2_s.gguf", { device: "cpu", cache: false });
    const logits = [];
    for (const i of ${JSON.stringify(ids)}) logits.push(Array.from(await m.logits(i)));
    const texts = [];
    for (const t of ${JSON.stringify(texts)}) {
      const g = await m.generate(t, { maxTokens: 24, temperature: 0 });
      texts.push({ text: g.text, tokens: g.tokens, prompt: Array.from(m.tokenize(t)) });
    }
    const info = m.info;
    m.free();
    const e = await Model.load("/golden/bitnet-tiny-i2_s.gguf", { device: "cpu", cache: false, numerics: "exact" });
    const exact = [];
    for (const i of ${JSON.stringify(ids)}) exact.push(Array.from(await e.logits(i)));
    e.free();
    return { logits, texts, info, check, exact };
  })()`);
  console.log(`# ${ua.match(/Chrome\/[\d.]+/)?.[0]}, wasm tier ${r.info.isa}`);
  // Chromium computes relaxed SIMD's dot product: the auto choice is that module, and its
  // kernels matched the scalar ones bit for bit (selfTest rejects on a difference).
  assert.equal(r.info.isa, "simd128-relaxed");
  assert.equal(r.check.tier, "simd128-relaxed");
  // V8 fuses relaxed SIMD's multiply-add on x86-64 with FMA: the head dots and attention
  // were checked too.
  assert.equal(r.check.fused, true);
  assert.ok(r.check.compared > 10000);
  PROMPTS.forEach((p, i) => {
    // Exact numerics: bitnet.cpp's logits bit for bit (the F16 head on the fused dots).
    const ref = f32s(resolve(golden, `${p}.logits.f32`));
    const diff = ref.findIndex((w, j) => Object.is(w, Math.fround(r.exact[i][j])) === false);
    assert.equal(diff, -1, `exact ${p}: logit ${diff}: ${r.exact[i][diff]} vs ${ref[diff]}`);
    const g = gates(Float32Array.from(r.logits[i]), ref, p);
    console.log(`# ${p}: max |Δ| ${g.maxd.toFixed(4)}, cos ${g.cos.toFixed(6)}`);
    const want = native(["run", "-m", modelPath, "-p", texts[i], "-n", "24", "--temp", "0", "--no-echo"]);
    sameGreedy(p, r.texts[i].prompt, r.texts[i], want);
  });
});

test("WebGPU in Chromium (SwiftShader): logits pass the gates, greedy text equals the native CLI's", { skip }, async () => {
  await browser.goto(`${base}/index.html`);
  const ids = PROMPTS.map((p) => reference(p).prompt_tokens);
  const texts = PROMPTS.map(promptText);
  const r = await browser.eval(`(async () => {
    if (!navigator.gpu || !(await navigator.gpu.requestAdapter())) return { none: true };
    const { Model } = await import("/bitnet.js");
    const m = await Model.load("/golden/bitnet-tiny-i2_s.gguf", { device: "webgpu", cache: false });
    const logits = [];
    for (const i of ${JSON.stringify(ids)}) logits.push(Array.from(await m.logits(i)));
    // Greedy text for one prompt (SwiftShader runs a step in about a second).
    const texts = [];
    for (const t of ${JSON.stringify(texts.slice(0, 1))}) {
      const g = await m.generate(t, { maxTokens: 8, temperature: 0 });
      texts.push({ text: g.text, tokens: g.tokens, prompt: Array.from(m.tokenize(t)) });
    }
    const a = await navigator.gpu.requestAdapter();
    const info = m.info;
    m.free();
    return { logits, texts, info, adapter: a.info.vendor + " " + a.info.architecture };
  })()`);
  assert.ok(!r.none, "Chromium gave no WebGPU adapter (it was started with SwiftShader's Vulkan)");
  assert.match(r.info.device, /^webgpu/);
  assert.equal(r.info.hostWeights, false, "the file streamed onto the GPU");
  console.log(`# WebGPU adapter: ${r.adapter}`);
  PROMPTS.forEach((p, i) => {
    const g = gates(Float32Array.from(r.logits[i]), f32s(resolve(golden, `${p}.logits.f32`)), `webgpu ${p}`);
    console.log(`# webgpu ${p}: max |Δ| ${g.maxd.toFixed(4)}, cos ${g.cos.toFixed(6)}`);
  });
  const want = native(["run", "-m", modelPath, "-p", texts[0], "-n", "8", "--temp", "0", "--no-echo"]);
  sameGreedy(`webgpu ${PROMPTS[0]}`, r.texts[0].prompt, r.texts[0], want);
});

test("WebGPU streaming: a 25 MiB model loads with the page's memory below the file's size; on the CPU above it", { skip }, async () => {
  // The small preset's shapes (6 blocks, 1024 wide) with the tiny vocabulary.
  const dir = mkdtempSync(resolve(tmpdir(), "bitnet-stream-"));
  const file = resolve(dir, "small.gguf");
  native(["synth", "--preset", "small", "--quiet", "-o", file]);
  const size = statSync(file).size;
  const local = await serve(pkg, { m: dir });
  try {
    const url = `http://127.0.0.1:${local.address().port}`;
    const load = async (device) => {
      // A fresh page: a fresh WebAssembly memory.
      await browser.goto(`${url}/index.html`);
      return browser.eval(`(async () => {
        if (!navigator.gpu || !(await navigator.gpu.requestAdapter())) return { none: true };
        const { Model } = await import("/bitnet.js");
        const phases = new Set();
        const m = await Model.load("/m/small.gguf", { device: ${JSON.stringify(device)}, cache: false, onProgress: (p) => phases.add(p.phase) });
        const l = await m.logits([1, 2, 3]);
        const info = m.info;
        m.free();
        return { info, phases: [...phases], finite: l.every(Number.isFinite), n: l.length };
      })()`);
    };
    const gpu = await load("webgpu");
    assert.ok(!gpu.none, "Chromium gave no WebGPU adapter");
    const cpu = await load("cpu");
    const mib = (b) => (b / 2 ** 20).toFixed(1);
    console.log(`# ${mib(size)} MiB file: wasm memory ${mib(gpu.info.memoryBytes)} MiB streamed onto WebGPU, ${mib(cpu.info.memoryBytes)} MiB on the CPU`);
    assert.equal(gpu.info.hostWeights, false);
    assert.equal(cpu.info.hostWeights, true);
    assert.ok(gpu.finite && gpu.n === gpu.info.nVocab, "logits from the streamed model");
    assert.ok(!gpu.phases.includes("fallback"), `phases ${gpu.phases}`);
    // The whole file in the module would take its size on top of the module's own memory.
    assert.ok(gpu.info.memoryBytes < size, `streamed: ${gpu.info.memoryBytes} bytes of memory for a ${size}-byte file`);
    assert.ok(cpu.info.memoryBytes > size, `CPU: ${cpu.info.memoryBytes} bytes of memory for a ${size}-byte file`);
  } finally {
    local.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test("the chat page: a message in, streamed text out, Stop, and offline after the first load", { skip }, async () => {
  const model = `${base}/golden/bitnet-tiny-i2_s.gguf`;
  await browser.goto(`${base}/index.html?device=cpu&model=${encodeURIComponent(model)}`);
  console.log(`# chat page on the CPU: ready in ${(await pageLoaded(60000)).toFixed(1)} s`);
  const setField = (id, v) => browser.eval(`document.getElementById(${JSON.stringify(id)}).value = ${JSON.stringify(v)}, true`);
  await setField("temperature", "0");
  await setField("max-tokens", "16");
  await browser.eval(`window.__tokens = 0; addEventListener("bitnet-token", () => window.__tokens++), true`);
  await setField("input", "Name three colors.");
  await browser.eval(`document.getElementById("send").click(), true`);
  await browser.waitFor("bitnetChat.last && !bitnetChat.busy");
  const want = native(["run", "-m", modelPath, "--chat", "-p", "Name three colors.", "-n", "16", "--temp", "0"]);
  const last = await browser.eval("bitnetChat.last");
  const chatIds = await browser.eval(`import("/bitnet.js").then(async ({ Model }) => {
    const m = await Model.load("/golden/bitnet-tiny-i2_s.gguf", { cache: false });
    const ids = Array.from(m.chatTokens([{ role: "user", content: "Name three colors." }]));
    m.free();
    return ids;
  })`);
  sameGreedy("page", chatIds, last, want);
  assert.equal(await browser.eval("document.querySelector('.msg.assistant .body').textContent"), last.text);
  assert.ok((await browser.eval("window.__tokens")) >= 2, "the reply streamed in pieces");

  // Stop: a long reply, stopped at its first piece.
  await setField("max-tokens", "400");
  await browser.eval(`bitnetChat.last = null; addEventListener("bitnet-token", () => document.getElementById("stop").click(), { once: true }), true`);
  await setField("input", "Tell me a long story.");
  await browser.eval(`document.getElementById("send").click(), true`);
  await browser.waitFor("bitnetChat.last && !bitnetChat.busy");
  const stopped = await browser.eval("bitnetChat.last");
  assert.equal(stopped.finishReason, "cancelled");
  assert.ok(stopped.generatedTokens < 400, `stopped after ${stopped.generatedTokens} tokens`);
  assert.equal(await browser.eval("bitnetChat.messages.length"), 4);

  // Offline: the server goes away; the page (service worker) and the model (Cache Storage) stay.
  assert.ok(await browser.eval(`import("/bitnet.js").then((b) => b.isCached(${JSON.stringify(model)}))`), "the model is cached");
  await browser.waitFor("navigator.serviceWorker.controller || navigator.serviceWorker.ready.then(() => true)");
  await browser.eval("navigator.serviceWorker.ready.then(() => true)");
  await new Promise((r) => server.close(r));
  server.closeAllConnections?.();
  server = null;
  await browser.goto(`${base}/index.html?device=cpu&model=${encodeURIComponent(model)}`);
  console.log(`# chat page on the CPU: ready in ${(await pageLoaded(60000)).toFixed(1)} s`);
  await setField("max-tokens", "16");
  await setField("temperature", "0");
  await setField("input", "Name three colors.");
  await browser.eval(`document.getElementById("send").click(), true`);
  await browser.waitFor("bitnetChat.last && !bitnetChat.busy");
  assert.equal((await browser.eval("bitnetChat.last")).text, last.text);
});

test("the chat page on WebGPU", { skip }, async () => {
  const model = `${base}/golden/bitnet-tiny-i2_s.gguf`;
  if (!server) {
    server = await serve(pkg, { golden }, Number(new URL(base).port));
  }
  await browser.goto(`${base}/index.html?device=webgpu&model=${encodeURIComponent(model)}`);
  // SwiftShader compiles the model's shaders on the CPU: 11 s on a 2-core Emerald Rapids
  // VM, about twice that on slower hosts; 30 s was once too few.
  console.log(`# chat page on WebGPU: ready in ${(await pageLoaded(180000)).toFixed(1)} s`);
  assert.match(await browser.eval("bitnetChat.info.device"), /^webgpu/);
  await browser.eval(`document.getElementById("temperature").value = "0", document.getElementById("max-tokens").value = "6", true`);
  await browser.eval(`document.getElementById("new-chat").click(), document.getElementById("input").value = "Name three colors.", document.getElementById("send").click(), true`);
  await browser.waitFor("bitnetChat.last && !bitnetChat.busy && bitnetChat.messages.length === 2");
  const last = await browser.eval("bitnetChat.last");
  const ids = await browser.eval(`import("/bitnet.js").then(async ({ Model }) => {
    const m = await Model.load("/golden/bitnet-tiny-i2_s.gguf", { device: "cpu", cache: false });
    const ids = Array.from(m.chatTokens([{ role: "user", content: "Name three colors." }]));
    m.free();
    return ids;
  })`);
  const want = native(["run", "-m", modelPath, "--chat", "-p", "Name three colors.", "-n", "6", "--temp", "0"]);
  sameGreedy("page on webgpu", ids, last, want);
});

test("the demo model served with the page: one click, then words", { skip }, async () => {
  if (!server) {
    server = await serve(pkg, { golden }, Number(new URL(base).port));
  }
  await browser.goto(`${base}/index.html?device=cpu`);
  await browser.waitFor("document.readyState === 'complete' && !!window.bitnetChat");
  await browser.eval(`document.getElementById("demo").click(), true`);
  console.log(`# demo model on the CPU: ready in ${(await pageLoaded(60000)).toFixed(1)} s`);
  assert.match(await browser.eval("document.getElementById('model').textContent"), /^bitnet-25 · 6 layers · 512 ctx/);
  await browser.eval(`document.getElementById("temperature").value = "0", document.getElementById("max-tokens").value = "24", true`);
  await browser.eval(`document.getElementById("new-chat").click(), document.getElementById("input").value = "And God said,", document.getElementById("send").click(), true`);
  await browser.waitFor("bitnetChat.last && !bitnetChat.busy && bitnetChat.messages.length === 2");
  const last = await browser.eval("bitnetChat.last");
  // The trained model writes English words (its parity with bitnet.cpp is checked natively:
  // crates/bitnet-engine/tests/trained.rs).
  const words = last.text.match(/[A-Za-z]{2,}/g) ?? [];
  assert.ok(last.tokens.length >= 8 && words.length >= 6, `reply ${JSON.stringify(last.text)}`);
  assert.ok(words.some((w) => ["the", "and", "of", "unto", "LORD", "God"].includes(w)), `reply ${JSON.stringify(last.text)}`);
});
