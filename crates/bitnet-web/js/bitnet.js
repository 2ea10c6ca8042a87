// bitnet-rs in JavaScript: BitNet b1.58 models in the browser and in Node, on the CPU
// (WebAssembly). `Model.load` takes a URL, a File/Blob or the file's bytes.
const isNode = typeof process !== "undefined" && process.versions != null && process.versions.node != null;
const CACHE_NAME = "bitnet-models";

// A module whose one function returns lane 0 of i32x4.relaxed_dot_i8x16_i7x16_add_s over
// sixteen −1s and sixteen 2s: −8 where the engine computes relaxed SIMD's dot product as
// defined (some engines that validate it get it wrong, and are given the simd128 module).
const RELAXED_PROBE = (() => {
  const v = (byte) => [0xfd, 0x0c, ...new Array(16).fill(byte)];
  const body = [0x00, ...v(0xff), ...v(2), ...v(0), 0xfd, 0x93, 0x02, 0xfd, 0x1b, 0x00, 0x0b];
  return new Uint8Array([
    0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, 0x01, 0x05, 0x01, 0x60, 0x00, 0x01, 0x7f,
    0x03, 0x02, 0x01, 0x00, 0x07, 0x05, 0x01, 0x01, 0x66, 0x00, 0x00,
    0x0a, body.length + 2, 0x01, body.length, ...body,
  ]);
})();

/** Whether this engine runs relaxed SIMD's integer dot product as defined. */
export function hasRelaxedSimd() {
  try {
    const m = new WebAssembly.Instance(new WebAssembly.Module(RELAXED_PROBE));
    return m.exports.f() === -8;
  } catch {
    return false;
  }
}

const modules = new Map();

/** Load and instantiate one of the package's WebAssembly modules once: "relaxed" (relaxed
 * SIMD), "simd128", or "auto" (relaxed where it runs right). Returns its bindings. */
function initWasm(kind = "auto") {
  if (kind === "auto") kind = hasRelaxedSimd() ? "relaxed" : "simd128";
  if (kind !== "relaxed" && kind !== "simd128") {
    return Promise.reject(new Error(`wasm ${JSON.stringify(kind)}: use "auto", "simd128" or "relaxed"`));
  }
  if (!modules.has(kind)) {
    modules.set(kind, (async () => {
      const name = kind === "relaxed" ? "bitnet_web_relaxed" : "bitnet_web";
      const glue = await import(`./${name}.js`);
      const url = new URL(`./${name}_bg.wasm`, import.meta.url);
      if (isNode && url.protocol === "file:") {
        const fs = await import("node:fs/promises");
        await glue.default({ module_or_path: await fs.readFile(url) });
      } else {
        await glue.default({ module_or_path: url });
      }
      return glue;
    })());
  }
  return modules.get(kind);
}

/** Check the kernels of a module ("auto", "simd128", "relaxed") against its scalar kernels
 * on random ternary matmuls (and head dots and attention, where they fuse their
 * multiply-adds); resolves to `{ tier, compared, fused }`, rejects on a difference. */
export async function selfTest(kind = "auto", rounds = 16) {
  const glue = await initWasm(kind);
  try {
    return { tier: glue.kernelTier(), compared: glue.selfTest(rounds), fused: glue.fusedMultiplyAdd() };
  } catch (e) {
    throw asError(e, glue);
  }
}

/** Turn whatever the engine threw into an Error with its message. A trap (a panic: a bug,
 * never bad input) becomes an Error with the panic's message. */
function asError(e, glue) {
  if (typeof WebAssembly !== "undefined" && e instanceof WebAssembly.RuntimeError) {
    const msg = glue?.lastPanic?.() ?? "";
    const err = new Error(`bitnet-rs internal error${msg ? ": " + msg : ` (${e.message})`}; load the model again`);
    err.trap = true;
    return err;
  }
  if (e instanceof Error) return e;
  return new Error(typeof e === "string" ? e : String(e));
}

/** Give the event loop a turn (streamed pieces reach the page, a Stop is seen). */
let channel = null;
function yieldToLoop() {
  if (isNode) return new Promise((r) => setImmediate(r));
  if (typeof MessageChannel !== "undefined") {
    if (!channel) channel = new MessageChannel();
    return new Promise((r) => {
      channel.port1.onmessage = () => r();
      channel.port2.postMessage(0);
    });
  }
  return new Promise((r) => setTimeout(r, 0));
}

/** Read a stream of byte chunks into the loader, reporting progress. */
async function pump(reader, loader, total, onProgress) {
  let loaded = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    loader.push(value);
    loaded += value.byteLength;
    if (onProgress) onProgress({ phase: "download", loaded, total });
  }
  return loaded;
}

function isUrlLike(source) {
  return typeof source === "string" || (typeof URL !== "undefined" && source instanceof URL);
}

/** Fill a loader from `source`; `open(size)` makes one (size 0: unknown). */
async function readSource(open, source, opts) {
  const onProgress = opts.onProgress;
  if (source instanceof Uint8Array || source instanceof ArrayBuffer) {
    const bytes = source instanceof Uint8Array ? source : new Uint8Array(source);
    const loader = await open(bytes.byteLength);
    // Pieces of 16 MiB: a streaming loader uploads each block as soon as it is in.
    for (let at = 0; at < bytes.byteLength; at += 1 << 24) {
      loader.push(bytes.subarray(at, Math.min(at + (1 << 24), bytes.byteLength)));
    }
    if (onProgress) onProgress({ phase: "download", loaded: bytes.byteLength, total: bytes.byteLength });
    return loader;
  }
  if (typeof Blob !== "undefined" && source instanceof Blob) {
    const loader = await open(source.size);
    await pump(source.stream().getReader(), loader, source.size, onProgress);
    return loader;
  }
  if (isUrlLike(source)) {
    const text = String(source);
    // Node: a path or a file: URL is read from disk.
    if (isNode && !/^https?:/i.test(text)) {
      const fs = await import("node:fs");
      const url = await import("node:url");
      const path = text.startsWith("file:") ? url.fileURLToPath(text) : text;
      const size = fs.statSync(path).size;
      const loader = await open(size);
      const stream = fs.createReadStream(path, { highWaterMark: 1 << 22 });
      let loaded = 0;
      for await (const chunk of stream) {
        loader.push(chunk);
        loaded += chunk.byteLength;
        if (onProgress) onProgress({ phase: "download", loaded, total: size });
      }
      return loader;
    }
    return fetchWithCache(open, text, opts);
  }
  throw new Error("Model.load: the source must be a URL, a File/Blob, an ArrayBuffer or a Uint8Array");
}

/** Fetch a model with progress; with Cache Storage, keep it for the next visit. */
async function fetchWithCache(open, url, opts) {
  const useCache = opts.cache !== false && typeof caches !== "undefined";
  let cache = null;
  let response = null;
  let fromCache = false;
  if (useCache) {
    try {
      cache = await caches.open(CACHE_NAME);
      response = await cache.match(url);
      fromCache = response != null;
    } catch {
      cache = null; // an opaque origin or a private window: no cache
    }
  }
  if (!response) {
    response = await fetch(url);
    if (!response.ok) throw new Error(`Model.load: ${url}: HTTP ${response.status} ${response.statusText}`);
  }
  const total = Number(response.headers.get("content-length")) || 0;
  let stored = null;
  if (cache && !fromCache) {
    // The copy for the cache is written while the model reads its own.
    stored = cache.put(url, response.clone()).catch((e) => {
      if (opts.onProgress) opts.onProgress({ phase: "cache-failed", loaded: 0, total, error: String(e) });
    });
  }
  if (!response.body) {
    const bytes = new Uint8Array(await response.arrayBuffer());
    const loader = await open(bytes.byteLength);
    loader.push(bytes);
    return loader;
  }
  const loader = await open(total);
  await pump(response.body.getReader(), loader, total, opts.onProgress);
  if (stored) await stored;
  return loader;
}

/** Whether a model URL is in the page's cache (the chat page shows it). */
export async function isCached(url) {
  if (typeof caches === "undefined") return false;
  try {
    const cache = await caches.open(CACHE_NAME);
    return (await cache.match(url)) != null;
  } catch {
    return false;
  }
}

/** Remove a model URL (or every model, without one) from the cache. */
export async function clearCache(url) {
  if (typeof caches === "undefined") return false;
  if (url === undefined) return caches.delete(CACHE_NAME);
  const cache = await caches.open(CACHE_NAME);
  return cache.delete(url);
}

/** Generation options in the engine's names. */
function genOptions(o) {
  const g = {};
  const names = ["maxTokens", "temperature", "topK", "topP", "minP", "repeatPenalty", "repeatLastN", "presencePenalty", "frequencyPenalty", "seed", "stop"];
  for (const k of names) if (o[k] !== undefined) g[k] = o[k];
  if (typeof g.stop === "string") g.stop = [g.stop];
  return g;
}

export class Model {
  #inner;
  #glue;
  #busy = false;
  #broken = null;

  constructor(inner, glue) {
    this.#inner = inner;
    this.#glue = glue;
  }

  /** An Error for `e`; after a trap the instance is not used again. */
  #fail(e) {
    const err = asError(e, this.#glue);
    if (err.trap) this.#broken = err.message;
    return err;
  }

  /**
   * Load a GGUF model. `source`: a URL (fetched with progress and cached), a File/Blob, an
   * ArrayBuffer or a Uint8Array; in Node also a path. Options: `device` ("cpu", "webgpu" or
   * "auto": WebGPU where the runtime has it and the adapter can run the model, else the CPU), `onProgress({phase, loaded, total})`, `ctxSize`, `lmHead` ("f16", "q8_0",
   * "q4_0"), `numerics` ("fast", "exact"), `cache` (false: skip Cache Storage), `wasm`
   * ("auto", "simd128" or "relaxed": which of the package's modules runs it).
   */
  static async load(source, options = {}) {
    const device = options.device ?? "auto";
    if (!["cpu", "auto", "webgpu"].includes(device)) {
      throw new Error(`Model.load: device ${JSON.stringify(device)}: use "cpu", "auto" or "webgpu"`);
    }
    const hasGpu = typeof navigator !== "undefined" && navigator.gpu != null;
    if (device === "webgpu" && !hasGpu) {
      throw new Error("Model.load: this runtime has no WebGPU (navigator.gpu); use device \"cpu\" or \"auto\"");
    }
    const glue = await initWasm(options.wasm ?? "auto");
    const engineOptions = {
      ctxSize: options.ctxSize,
      lmHead: options.lmHead,
      numerics: options.numerics,
    };
    const toCpu = (size) => new glue.Loader(size);
    // WebGPU: the file streams onto the device as it arrives (each block uploaded when its
    // bytes are in), so the page never holds it; a source of unknown size is gathered first.
    const toGpu = async (size) =>
      size > 0 ? await glue.Loader.streamToGpu(size, { ...engineOptions, device: "webgpu" }) : toCpu(size);
    const build = async (open, dev) => {
      const loader = await readSource(open, source, options);
      const size = loader.received;
      if (options.onProgress) options.onProgress({ phase: "build", loaded: size, total: size });
      return [await loader.finish({ ...engineOptions, device: dev }), size];
    };
    let inner, size;
    try {
      // What only the CPU runs (exact numerics) goes there under "auto"; the q8_0 and q4_0
      // heads are quantized on upload to WebGPU too.
      const cpuOnly = (options.numerics ?? "fast") !== "fast";
      if (device === "cpu" || (device === "auto" && (!hasGpu || cpuOnly))) {
        [inner, size] = await build(toCpu, "cpu");
      } else {
        try {
          [inner, size] = await build(toGpu, "webgpu");
        } catch (e) {
          // "auto": the adapter cannot run this model (or WebGPU failed): the CPU runs it.
          if (device !== "auto" || (e instanceof WebAssembly.RuntimeError)) throw e;
          if (options.onProgress) options.onProgress({ phase: "fallback", loaded: 0, total: 0, error: String(e?.message ?? e) });
          [inner, size] = await build(toCpu, "cpu");
        }
      }
    } catch (e) {
      throw asError(e, glue);
    }
    const model = new Model(inner, glue);
    if (options.onProgress) options.onProgress({ phase: "ready", loaded: size, total: size });
    return model;
  }

  #live() {
    if (this.#broken) throw new Error(this.#broken);
    if (!this.#inner) throw new Error("the model was freed");
    return this.#inner;
  }

  /** `{ arch, nVocab, nCtx, nCtxTrain, nLayer, nEmbd, bos, eos, device, isa, fileBytes,
   * hostWeights, memoryBytes }` (`device`: "cpu" or "webgpu (adapter)"; `hostWeights`:
   * false when the file streamed onto the GPU). */
  get info() {
    return this.#live().info();
  }

  /** Token ids of `text` (BOS first unless `addBos: false`; `special: true` parses special-token text). */
  tokenize(text, { addBos = true, special = false } = {}) {
    try {
      return this.#live().tokenize(text, addBos, special);
    } catch (e) {
      throw this.#fail(e);
    }
  }

  /** The text of `ids`. */
  detokenize(ids) {
    try {
      return this.#live().detokenize(Uint32Array.from(ids));
    } catch (e) {
      throw this.#fail(e);
    }
  }

  /** The logits at the last of `ids`: a Promise of a Float32Array of nVocab. */
  async logits(ids) {
    this.#idle();
    const inner = this.#live();
    this.#busy = true;
    try {
      return await inner.logits(Uint32Array.from(ids));
    } catch (e) {
      throw this.#fail(e);
    } finally {
      this.#busy = false;
    }
  }

  #idle() {
    if (this.#busy) throw new Error("the model is generating: wait for it or stop it first");
  }

  /**
   * Generate after `prompt` (text, or token ids). Options: `maxTokens`, `temperature`,
   * `topK`, `topP`, `minP`, `repeatPenalty`, `seed`, `stop` (strings), `onToken({token, text})`
   * (return false to stop), `signal` (an AbortSignal). Resolves to `{ text, tokens,
   * finishReason, promptTokens, generatedTokens, promptMs, generationMs }`.
   */
  async generate(prompt, options = {}) {
    const ids = typeof prompt === "string" ? this.tokenize(prompt) : Uint32Array.from(prompt);
    return this.#run(ids, options);
  }

  /** The ids of a conversation (`[{ role, content }]`) in the model's chat template, ending
   * where the assistant's reply begins. */
  chatTokens(messages) {
    try {
      return this.#live().chatTokens(messages);
    } catch (e) {
      throw this.#fail(e);
    }
  }

  /** `generate` over a conversation (`[{ role, content }]`), with the model's chat template. */
  async chat(messages, options = {}) {
    return this.#run(this.chatTokens(messages), options);
  }

  async #run(ids, options) {
    this.#idle();
    const inner = this.#live();
    this.#busy = true;
    const { onToken, signal } = options;
    let text = "";
    const tokens = [];
    try {
      await inner.start(ids, genOptions(options));
      for (;;) {
        if (signal?.aborted) break;
        const piece = await inner.next();
        if (piece === null) break;
        tokens.push(piece.token);
        text += piece.text;
        if (onToken && (await onToken(piece)) === false) break;
        await yieldToLoop();
      }
      const done = inner.finish();
      text += done.text;
      if (done.text && onToken) await onToken({ token: null, text: done.text });
      return { ...done, text, tokens };
    } catch (e) {
      throw this.#fail(e);
    } finally {
      this.#busy = false;
    }
  }

  /** Forget the cached conversation. */
  reset() {
    this.#idle();
    try {
      this.#live().reset();
    } catch (e) {
      throw this.#fail(e);
    }
  }

  /** Release the model's memory; the object cannot be used afterwards. */
  free() {
    if (this.#inner) {
      this.#inner.free();
      this.#inner = null;
    }
  }
}

export default Model;
