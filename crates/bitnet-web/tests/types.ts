// The TypeScript types of the package, used as a program would (checked by scripts/test-wasm
// with tsc --strict; never run).
import { Model, isCached, type GenerateOptions } from "../../../target/web/bitnet.js";
async function main() {
  const m = await Model.load("x.gguf", { device: "cpu", onProgress: (p) => console.log(p.phase, p.loaded / p.total) });
  const ids: Uint32Array = m.tokenize("hi");
  const l: Float32Array = await m.logits(ids);
  const o: GenerateOptions = { maxTokens: 4, onToken: (p) => { console.log(p.text); } };
  const g = await m.generate("hi", o);
  const c = await m.chat([{ role: "user", content: "hi" }]);
  console.log(l.length, g.finishReason, c.tokens.length, m.info.nVocab, await isCached("x"));
  m.free();
}
main();
