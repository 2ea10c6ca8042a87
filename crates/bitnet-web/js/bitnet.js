// bitnet-rs in JavaScript: BitNet b1.58 models in the browser and in Node, on the CPU
// (WebAssembly). `Model.load` takes a URL, a File/Blob or the file's bytes.
import init, { Loader, WebModel } from "./bitnet_web.js";

const isNode = typeof process !== "undefined" && process.versions != null && process.versions.node != null;
const CACHE_NAME = "bitnet-models";

let ready = null;

/** Load and instantiate the WebAssembly module once. */
function initWasm() {
  if (!ready) {
    ready = (async () => {
      const url = new URL("./bitnet_web_bg.wasm", import.meta.url);
      if (isNode && url.protocol === "file:") {
        const fs = await import("node:fs/promises");
        await init({ module_or_path: await fs.readFile(url) });
      } else {
        await init({ module_or_path: url });
      }
    })();
  }
  return ready;
}

/** Turn whatever the engine threw into an Error with its message. */
function asError(e) {
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

/** Fill a Loader from `source`. */
async function readSource(source, opts) {
  const onProgress = opts.onProgress;
  if (source instanceof Uint8Array || source instanceof ArrayBuffer) {
    const bytes = source instanceof Uint8Array ? source : new Uint8Array(source);
    const loader = new Loader(bytes.byteLength);
    loader.push(bytes);
    if (onProgress) onProgress({ phase: "download", loaded: bytes.byteLength, total: bytes.byteLength });
    return loader;
  }
  if (typeof Blob !== "undefined" && source instanceof Blob) {
    const loader = new Loader(source.size);
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
      const loader = new Loader(size);
      const stream = fs.createReadStream(path, { highWaterMark: 1 << 22 });
      let loaded = 0;
      for await (const chunk of stream) {
        loader.push(chunk);
        loaded += chunk.byteLength;
        if (onProgress) onProgress({ phase: "download", loaded, total: size });
      }
      return loader;
    }
    return fetchWithCache(text, opts);
  }
  throw new Error("Model.load: the source must be a URL, a File/Blob, an ArrayBuffer or a Uint8Array");
}

/** Fetch a model with progress; with Cache Storage, keep it for the next visit. */
async function fetchWithCache(url, opts) {
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
    const loader = new Loader(bytes.byteLength);
    loader.push(bytes);
    return loader;
  }
  const loader = new Loader(total);
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
  #busy = false;

  constructor(inner) {
    this.#inner = inner;
  }

  /**
   * Load a GGUF model. `source`: a URL (fetched with progress and cached), a File/Blob, an
   * ArrayBuffer or a Uint8Array; in Node also a path. Options: `device` ("cpu", "auto" or
   * "webgpu"), `onProgress({phase, loaded, total})`, `ctxSize`, `lmHead` ("f16", "q8_0",
   * "q4_0"), `numerics` ("fast", "exact"), `cache` (false: skip Cache Storage).
   */
  static async load(source, options = {}) {
    const device = options.device ?? "auto";
    if (!["cpu", "auto", "webgpu"].includes(device)) {
      throw new Error(`Model.load: device ${JSON.stringify(device)}: use "cpu", "auto" or "webgpu"`);
    }
    if (device === "webgpu") {
      throw new Error('Model.load: this build runs on the CPU only (WebAssembly); use device "cpu" or "auto"');
    }
    await initWasm();
    const loader = await readSource(source, options);
    const size = loader.received;
    if (options.onProgress) options.onProgress({ phase: "build", loaded: size, total: size });
    let inner;
    try {
      inner = loader.finish({
        ctxSize: options.ctxSize,
        lmHead: options.lmHead,
        numerics: options.numerics,
      });
    } catch (e) {
      throw asError(e);
    }
    const model = new Model(inner);
    if (options.onProgress) options.onProgress({ phase: "ready", loaded: size, total: size });
    return model;
  }

  #live() {
    if (!this.#inner) throw new Error("the model was freed");
    return this.#inner;
  }

  /** `{ arch, nVocab, nCtx, nCtxTrain, nLayer, nEmbd, bos, eos, device, isa, fileBytes, memoryBytes }`. */
  get info() {
    return this.#live().info();
  }

  /** Token ids of `text` (BOS first unless `addBos: false`; `special: true` parses special-token text). */
  tokenize(text, { addBos = true, special = false } = {}) {
    try {
      return this.#live().tokenize(text, addBos, special);
    } catch (e) {
      throw asError(e);
    }
  }

  /** The text of `ids`. */
  detokenize(ids) {
    try {
      return this.#live().detokenize(Uint32Array.from(ids));
    } catch (e) {
      throw asError(e);
    }
  }

  /** The logits at the last of `ids` (Float32Array of nVocab). */
  logits(ids) {
    this.#idle();
    try {
      return this.#live().logits(Uint32Array.from(ids));
    } catch (e) {
      throw asError(e);
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
      throw asError(e);
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
      inner.start(ids, genOptions(options));
      for (;;) {
        if (signal?.aborted) break;
        const piece = inner.next();
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
      throw asError(e);
    } finally {
      this.#busy = false;
    }
  }

  /** Forget the cached conversation. */
  reset() {
    this.#idle();
    this.#live().reset();
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
