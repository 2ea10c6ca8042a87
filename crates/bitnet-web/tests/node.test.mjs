// The npm package under Node (the CPU path, WebAssembly): the tiny golden model's logits
// against bitnet.cpp's reference outputs with the fast gates, greedy text against the native
// CLI, streaming, stopping and errors. Run by scripts/test-wasm:
//   BITNET_CLI=target/release/bitnet node --test crates/bitnet-web/tests/
// BITNET_WEB_PKG names the package folder (default target/web).
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { test } from "node:test";
import { pathToFileURL } from "node:url";
import { PROMPTS, f32s, gates, golden, modelPath, native as nativeBytes, pkg, promptText, reference, sameGreedy } from "./common.mjs";

const { Model, selfTest, hasRelaxedSimd } = await import(pathToFileURL(resolve(pkg, "bitnet.js")).href);
const native = (args) => nativeBytes(args).toString("utf8");

const model = await Model.load(modelPath, { device: "cpu", ctxSize: 512 });

test("the model reports its shapes and the CPU tier", () => {
  const info = model.info;
  assert.equal(info.nVocab, 4256);
  assert.equal(info.nLayer, 2);
  assert.equal(info.nEmbd, 256);
  assert.equal(info.bos, 4000);
  assert.equal(info.device, "cpu");
  assert.equal(info.fileBytes, 2680544);
  console.log(`# wasm kernel tier: ${info.isa}`);
});

test("the simd128 module's kernels match its scalar kernels bit for bit", async () => {
  const r = await selfTest("simd128", 24);
  assert.equal(r.tier, "simd128");
  assert.equal(r.fused, false);
  assert.ok(r.compared > 10000, `${r.compared}`);
  // The relaxed-SIMD module runs where the engine computes its dot product right (checked
  // in Chromium by browser.test.mjs); say which this Node is.
  console.log(`# relaxed SIMD here: ${hasRelaxedSimd()}`);
});

test("tokenize gives the native tokenizer's ids", () => {
  for (const p of PROMPTS) {
    const text = promptText(p);
    const want = JSON.parse(native(["tokenize", "-m", modelPath, "--json", "--no-parse-special", text])).ids;
    assert.deepEqual(Array.from(model.tokenize(text)), want, p);
    assert.equal(model.detokenize(model.tokenize(text, { addBos: false })), text, p);
  }
});

test("last-position logits pass the fast gates against bitnet.cpp", async () => {
  for (const p of PROMPTS) {
    const ref = reference(p);
    const got = await model.logits(ref.prompt_tokens);
    const r = gates(got, f32s(resolve(golden, `${p}.logits.f32`)), p);
    console.log(`# ${p}: max |Δ| ${r.maxd.toFixed(4)}, cos ${r.cos.toFixed(6)}`);
  }
});

test("exact numerics gives bitnet.cpp's logits bit for bit", async () => {
  const exact = await Model.load(modelPath, { numerics: "exact" });
  for (const p of PROMPTS) {
    const got = await exact.logits(reference(p).prompt_tokens);
    const want = f32s(resolve(golden, `${p}.logits.f32`));
    const diff = want.findIndex((w, i) => Object.is(w, got[i]) === false);
    assert.equal(diff, -1, `${p}: logit ${diff}: ${got[diff]} vs ${want[diff]}`);
  }
  exact.free();
});

test("one-token steps pass the fast gates against bitnet.cpp (teacher-forced)", async () => {
  for (const p of PROMPTS) {
    const ref = reference(p);
    const steps = f32s(resolve(golden, `${p}.step_logits.f32`));
    const n = ref.n_vocab;
    for (const s of [1, 5, 17, 31]) {
      const ids = ref.prompt_tokens.concat(ref.generated_tokens.slice(0, s));
      gates(await model.logits(ids), steps.subarray(s * n, (s + 1) * n), `${p} step ${s}`);
    }
  }
});

test("greedy text equals the native CLI's (or parts from it only at a near-tie)", async () => {
  for (const p of PROMPTS) {
    const text = promptText(p);
    const want = native(["run", "-m", modelPath, "-p", text, "-n", "24", "--temp", "0", "--no-echo"]);
    const pieces = [];
    const g = await model.generate(text, {
      maxTokens: 24,
      temperature: 0,
      onToken: (piece) => {
        pieces.push(piece.text);
      },
    });
    const shared = sameGreedy(p, Array.from(model.tokenize(text)), g, want);
    console.log(`# ${p}: ${shared < 0 ? "parted at a near-tie" : "the same text"}`);
    assert.equal(pieces.join(""), g.text, `${p}: the streamed pieces make the text`);
    assert.equal(g.generatedTokens, 24);
    assert.equal(g.finishReason, "length");
  }
});

test("chat uses the model's template, as the native CLI's --chat", async () => {
  const want = native(["run", "-m", modelPath, "--chat", "-p", "Name three colors.", "-n", "16", "--temp", "0"]);
  const msgs = [{ role: "user", content: "Name three colors." }];
  const g = await model.chat(msgs, { maxTokens: 16, temperature: 0 });
  sameGreedy("chat", Array.from(model.chatTokens(msgs)), g, want);
});

test("seeded sampling repeats itself", async () => {
  const o = { maxTokens: 12, temperature: 0.9, topK: 40, topP: 0.95, seed: 1234 };
  const a = await model.generate("Once upon a time", o);
  const b = await model.generate("Once upon a time", o);
  assert.deepEqual(a.tokens, b.tokens);
  const c = await model.generate("Once upon a time", { ...o, seed: 1235 });
  assert.notDeepEqual(a.tokens, c.tokens);
});

test("stop strings, onToken returning false and an AbortSignal end a generation", async () => {
  const full = await model.generate("Once upon a time", { maxTokens: 24, temperature: 0 });
  const cut = full.text.slice(4, 8);
  const s = await model.generate("Once upon a time", { maxTokens: 24, temperature: 0, stop: [cut] });
  assert.equal(s.finishReason, "stop");
  assert.ok(!s.text.includes(cut) && full.text.startsWith(s.text));

  let n = 0;
  const byToken = await model.generate("Once upon a time", { maxTokens: 24, temperature: 0, onToken: () => ++n < 3 });
  assert.equal(byToken.finishReason, "cancelled");
  assert.equal(byToken.generatedTokens, 3);

  const ac = new AbortController();
  let seen = 0;
  const bySignal = await model.generate("Once upon a time", {
    maxTokens: 24,
    temperature: 0,
    signal: ac.signal,
    onToken: () => {
      if (++seen === 5) ac.abort();
    },
  });
  assert.equal(bySignal.finishReason, "cancelled");
  assert.equal(bySignal.generatedTokens, 5);
});

test("bad input is an Error with the engine's message, never a trap", async () => {
  await assert.rejects(Model.load(new Uint8Array([1, 2, 3, 4, 5, 6, 7, 8])), (e) => e instanceof Error && /GGUF|magic|file/i.test(e.message));
  const bytes = readFileSync(modelPath);
  await assert.rejects(Model.load(bytes.subarray(0, 100000)), (e) => e instanceof Error && e.message.length > 0);
  await assert.rejects(Model.load(bytes, { device: "tpu" }), /device/);
  await assert.rejects(Model.load(bytes, { lmHead: "q9" }), /lmHead/);
  await assert.rejects(model.generate("x", { temperature: Number.NaN }), /temperature/);
  await assert.rejects(model.generate("x", { seed: -1 }), /seed/);
  await assert.rejects(model.generate("x", { maxTokens: "many" }), Error);
  await assert.rejects(model.chat([{ role: "robot", content: "hi" }]), /role/);
  await assert.rejects(model.logits([999999]), Error);
  await assert.rejects(model.logits([]), Error);
  // The model still works after every refusal.
  gates(await model.logits(reference("p1_english").prompt_tokens), f32s(resolve(golden, "p1_english.logits.f32")), "after errors");
});

test("a model loads from a Blob and from an ArrayBuffer, and a freed model refuses calls", async () => {
  const bytes = readFileSync(modelPath);
  const progress = [];
  const fromBlob = await Model.load(new Blob([bytes]), { onProgress: (p) => progress.push(p.phase) });
  assert.ok(progress.includes("download") && progress.at(-1) === "ready", progress.join(","));
  const ids = [4000, 1966, 346];
  assert.deepEqual(Array.from(await fromBlob.logits(ids)), Array.from(await model.logits(ids)));
  fromBlob.free();
  await assert.rejects(fromBlob.logits(ids), /freed/);
  const fromBuffer = await Model.load(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
  assert.equal(fromBuffer.info.nVocab, 4256);
  fromBuffer.free();
});
