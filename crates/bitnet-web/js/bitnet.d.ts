// Types of bitnet-rs's JavaScript API (bitnet.js).

export type Device = "cpu" | "auto" | "webgpu";

export interface Progress {
  /** "download" while bytes arrive (on WebGPU each block is uploaded as its bytes come),
   * "build" while the model is built, "ready" at the end, "cache-failed" when the copy for
   * the cache could not be written (loading goes on), "fallback" when `device: "auto"`
   * found that WebGPU cannot run the model and loading starts again on the CPU (`error`
   * says why). */
  phase: "download" | "build" | "ready" | "cache-failed" | "fallback";
  loaded: number;
  /** 0 when the size is unknown. */
  total: number;
  error?: string;
}

export interface LoadOptions {
  device?: Device;
  onProgress?: (p: Progress) => void;
  /** Context positions (default: the model's, at most 4096). */
  ctxSize?: number;
  lmHead?: "f16" | "q8_0" | "q4_0";
  numerics?: "fast" | "exact";
  /** false: do not use Cache Storage for a URL. */
  cache?: boolean;
  /** The package's module that runs the model: "auto" (default: "relaxed" where the engine
   * computes relaxed SIMD right), "simd128" or "relaxed". */
  wasm?: "auto" | "simd128" | "relaxed";
}

export interface ModelInfo {
  arch: string;
  nVocab: number;
  nCtx: number;
  nCtxTrain: number;
  nLayer: number;
  nEmbd: number;
  bos: number | null;
  eos: number | null;
  /** "cpu", or "webgpu" (with the adapter's name where the browser gives it). */
  device: string;
  isa: string;
  fileBytes: number;
  /** Whether the weights are in the WebAssembly memory (false on WebGPU: the file streamed
   * onto the GPU as it arrived, and the page never held it). */
  hostWeights: boolean;
  /** The WebAssembly memory in bytes: it only grows, so this is the peak so far. */
  memoryBytes: number;
}

export interface Piece {
  /** null for the text held back until the end (an incomplete character, a partial stop). */
  token: number | null;
  text: string;
}

export interface GenerateOptions {
  maxTokens?: number;
  temperature?: number;
  topK?: number;
  topP?: number;
  minP?: number;
  repeatPenalty?: number;
  repeatLastN?: number;
  presencePenalty?: number;
  frequencyPenalty?: number;
  seed?: number;
  stop?: string | string[];
  /** Each new token; return false to stop. */
  onToken?: (p: Piece) => boolean | void | Promise<boolean | void>;
  signal?: AbortSignal;
}

export interface Generation {
  text: string;
  tokens: number[];
  finishReason: "stop" | "length" | "cancelled";
  promptTokens: number;
  cachedTokens: number;
  generatedTokens: number;
  promptMs: number;
  generationMs: number;
}

export interface ChatMessage {
  role: "system" | "user" | "assistant" | "developer";
  content: string;
}

export class Model {
  static load(source: string | URL | Blob | ArrayBuffer | Uint8Array, options?: LoadOptions): Promise<Model>;
  readonly info: ModelInfo;
  tokenize(text: string, options?: { addBos?: boolean; special?: boolean }): Uint32Array;
  detokenize(ids: ArrayLike<number>): string;
  logits(ids: ArrayLike<number>): Promise<Float32Array>;
  generate(prompt: string | ArrayLike<number>, options?: GenerateOptions): Promise<Generation>;
  chatTokens(messages: ChatMessage[]): Uint32Array;
  chat(messages: ChatMessage[], options?: GenerateOptions): Promise<Generation>;
  reset(): void;
  free(): void;
}

export function isCached(url: string): Promise<boolean>;
export function hasRelaxedSimd(): boolean;
export function selfTest(wasm?: "auto" | "simd128" | "relaxed", rounds?: number): Promise<{ tier: string; compared: number; fused: boolean }>;
export function clearCache(url?: string): Promise<boolean>;
export default Model;
