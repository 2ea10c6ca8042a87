// What the package's tests share: the golden files, the fast gates, and the native CLI.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export const root = resolve(dirname(fileURLToPath(import.meta.url)), "../../..");
export const pkg = resolve(root, process.env.BITNET_WEB_PKG ?? "target/web");
export const golden = resolve(root, "testdata/golden/tiny");
export const modelPath = resolve(golden, "bitnet-tiny-i2_s.gguf");
export const PROMPTS = ["p1_english", "p2_unicode", "p3_digits_punct", "p4_code_ws"];
export const cli = process.env.BITNET_CLI;

/** The reference's top-1 must be ours where its margin over its second exceeds this. */
export const MARGIN = 0.08;

export function f32s(path) {
  const b = readFileSync(path);
  return new Float32Array(b.buffer, b.byteOffset, b.byteLength / 4);
}

export const promptText = (p) => readFileSync(resolve(golden, `${p}.txt`), "utf8");
export const reference = (p) => JSON.parse(readFileSync(resolve(golden, `${p}.tokens.json`), "utf8"));

/** Index of the largest value, and its margin over the second largest. */
export function top(v) {
  let t = 0;
  for (let i = 1; i < v.length; i++) if (v[i] > v[t]) t = i;
  let second = -Infinity;
  for (let i = 0; i < v.length; i++) if (i !== t && v[i] > second) second = v[i];
  return { index: t, margin: v[t] - second };
}

/** The fast gates: max |Δ| ≤ 0.25, cosine ≥ 0.995, the reference's top-1 where its margin
 * exceeds MARGIN. */
export function gates(got, want, what) {
  assert.equal(got.length, want.length, `${what}: length`);
  let maxd = 0, dot = 0, ng = 0, nw = 0;
  for (let i = 0; i < want.length; i++) {
    maxd = Math.max(maxd, Math.abs(got[i] - want[i]));
    dot += got[i] * want[i];
    ng += got[i] * got[i];
    nw += want[i] * want[i];
  }
  const cos = dot / Math.sqrt(ng * nw);
  assert.ok(maxd <= 0.25, `${what}: max |Δ| ${maxd}`);
  assert.ok(cos >= 0.995, `${what}: cosine ${cos}`);
  const w = top(want);
  if (w.margin > MARGIN) assert.equal(top(got).index, w.index, `${what}: top-1`);
  return { maxd, cos };
}

export function native(args) {
  if (!cli) throw new Error("BITNET_CLI must name the native bitnet binary (scripts/test-wasm sets it)");
  return execFileSync(cli, args, { stdio: ["ignore", "pipe", "ignore"], maxBuffer: 1 << 28 });
}

/** Greedy text from the package against the native CLI's. The same text, or else: every
 * token ours chose is the native engine's top-1 on the same history (teacher-forced,
 * `bitnet logits --then`) wherever that top-1 leads by more than MARGIN: two engines whose
 * float sums differ in rounding may part at a near-tie, never elsewhere. Returns the
 * number of tokens the texts share. */
export function sameGreedy(what, promptIds, got, nativeText) {
  const gotText = got.text;
  if (gotText + "\n" === nativeText) return got.tokens.length;
  const raw = native(["logits", "-m", modelPath, "--ids", promptIds.join(","), "--then", got.tokens.slice(0, -1).join(",")]);
  const all = new Float32Array(raw.buffer, raw.byteOffset, raw.byteLength / 4);
  const n = all.length / got.tokens.length;
  let parted = false;
  for (let s = 0; s < got.tokens.length; s++) {
    const t = top(all.subarray(s * n, (s + 1) * n));
    if (t.index !== got.tokens[s]) {
      assert.ok(t.margin <= MARGIN, `${what}: step ${s} chose ${got.tokens[s]}, the native top-1 ${t.index} leads by ${t.margin}`);
      parted = true;
    }
  }
  assert.ok(parted, `${what}: the texts differ but every token is the native top-1:\n${JSON.stringify(gotText)}\n${JSON.stringify(nativeText)}`);
  return -1;
}
