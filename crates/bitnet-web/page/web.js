// The serverless chat page: the model is fetched (or picked) and run in this browser, in a
// worker (worker.js); the conversation lives in this page only. `?model=URL` loads a model
// at once (`&device=cpu|webgpu|auto` chooses where it runs). State is reachable as `window.bitnetChat` (the console, the page's tests).
import { isCached } from "./bitnet.js";

const $ = (id) => document.getElementById(id);
const state = { messages: [], busy: false, ready: false, info: null, last: null, error: null };
window.bitnetChat = state;

const DEMO_MODEL = "kjv-i2_s.gguf";
const FIELDS = ["model-url", "system", "temperature", "top-k", "top-p", "max-tokens", "seed", "device"];
const STORE = "bitnet-web-settings";

function loadSettings() {
  try {
    const saved = JSON.parse(localStorage.getItem(STORE) || "{}");
    for (const k of FIELDS) if (typeof saved[k] === "string" && saved[k] !== "") $(k).value = saved[k];
  } catch { /* storage unavailable or corrupt: keep the defaults */ }
}

function saveSettings() {
  const s = {};
  for (const k of FIELDS) s[k] = $(k).value;
  try { localStorage.setItem(STORE, JSON.stringify(s)); } catch { /* private mode */ }
}

function setStatus(text, cls) {
  $("status").textContent = text;
  $("status").className = "status " + (cls || "");
}

const mib = (n) => (n / 1048576).toFixed(1) + " MiB";

// The app shell works offline once a service worker has cached it (not on file:// pages).
if ("serviceWorker" in navigator && location.protocol !== "file:") {
  navigator.serviceWorker.register("sw.js").catch(() => { /* offline use needs it; chat does not */ });
}

const worker = new Worker(new URL("./worker.js", import.meta.url), { type: "module" });
let reply = null; // { el, body, text }

// A worker whose script cannot load or throws outside a message (an old or broken cached
// copy, a blocked module) says so on the page rather than leave it loading for ever.
// A load that failed: the message, and Load enabled again.
function loadFailed(message) {
  setStatus(message, "bad");
  $("load").disabled = false;
  $("progress").hidden = true;
}
function workerFailed(message) {
  state.error = message;
  state.ready = false;
  loadFailed(message);
  if (reply) finishReply(null, message);
}
worker.onerror = (e) => {
  e.preventDefault();
  workerFailed("the model's worker failed: " + (e.message || "its script did not load"));
};
worker.onmessageerror = () => workerFailed("the model's worker sent a message that could not be read");

worker.onmessage = (ev) => {
  const m = ev.data;
  if (m.type === "progress") {
    const p = $("progress");
    p.hidden = false;
    if (m.phase === "download") {
      p.max = m.total || 1;
      p.value = m.total ? m.loaded : 0;
      $("progress-text").textContent = m.total ? `${mib(m.loaded)} of ${mib(m.total)}` : mib(m.loaded);
    } else if (m.phase === "build") {
      $("progress-text").textContent = `${mib(m.loaded)} read; building the model…`;
    } else if (m.phase === "cache-failed") {
      $("progress-text").textContent = "could not keep a copy for offline use: " + m.error;
    }
  } else if (m.type === "ready") {
    state.ready = true;
    state.info = m.info;
    $("progress").hidden = true;
    $("progress-text").textContent = "";
    const where = m.info.device === "cpu" ? `CPU, ${m.info.isa}` : m.info.device;
    $("model").textContent = `${m.info.arch} · ${m.info.nLayer} layers · ${m.info.nCtx} ctx · ${mib(m.info.fileBytes)} · ${where}`;
    setStatus("ready", "ok");
    $("load").disabled = false;
    $("send").disabled = false;
  } else if (m.type === "token") {
    if (reply) {
      reply.text += m.text;
      reply.body.textContent = reply.text;
      $("messages").parentElement.scrollTop = 1e9;
      window.dispatchEvent(new CustomEvent("bitnet-token", { detail: m.text }));
    }
  } else if (m.type === "done") {
    finishReply(m.result);
  } else if (m.type === "error") {
    state.error = m.message;
    if (m.during === "chat") {
      finishReply(null, m.message);
    } else {
      loadFailed(m.message);
    }
  }
};

function addMessage(role, text) {
  const el = document.createElement("div");
  el.className = "msg " + role;
  const body = document.createElement("div");
  body.className = "body";
  body.textContent = text;
  el.appendChild(body);
  $("messages").appendChild(el);
  return { el, body };
}

function finishReply(result, error) {
  if (!reply) return;
  reply.body.classList.remove("cursor");
  if (error) {
    reply.el.classList.add("error");
    reply.body.textContent = reply.text ? reply.text + "\n\n" + error : error;
  } else {
    state.messages.push({ role: "assistant", content: result.text });
    const s = document.createElement("span");
    s.className = "stats";
    const tps = result.generationMs > 0 ? (result.generatedTokens / (result.generationMs / 1000)).toFixed(1) : "–";
    s.textContent = `${result.generatedTokens} tokens · ${tps} tok/s · ${result.finishReason}`;
    reply.el.appendChild(s);
  }
  state.last = result;
  reply = null;
  state.busy = false;
  $("send").disabled = !state.ready;
  $("stop").disabled = true;
  window.dispatchEvent(new CustomEvent("bitnet-done", { detail: result }));
}

function options() {
  const num = (id) => {
    const v = $(id).value.trim();
    return v === "" ? undefined : Number(v);
  };
  return {
    temperature: num("temperature"),
    topK: num("top-k"),
    topP: num("top-p"),
    maxTokens: num("max-tokens"),
    seed: num("seed") ?? Math.floor(Math.random() * 2 ** 32),
  };
}

function send() {
  const text = $("input").value.trim();
  if (!text || state.busy || !state.ready) return;
  saveSettings();
  $("input").value = "";
  state.messages.push({ role: "user", content: text });
  addMessage("user", text);
  reply = addMessage("assistant", "");
  reply.text = "";
  reply.body.classList.add("cursor");
  state.busy = true;
  $("send").disabled = true;
  $("stop").disabled = false;
  const system = $("system").value.trim();
  const messages = system ? [{ role: "system", content: system }, ...state.messages] : state.messages;
  worker.postMessage({ type: "chat", messages, options: options() });
}

async function load(source, label) {
  state.ready = false;
  state.error = null;
  $("send").disabled = true;
  $("load").disabled = true;
  setStatus("loading " + label + "…");
  worker.postMessage({ type: "load", source, device: $("device").value });
}

$("load-form").addEventListener("submit", (e) => {
  e.preventDefault();
  saveSettings();
  const url = new URL($("model-url").value, location.href).href;
  load(url, url.split("/").pop());
});
// The demo model (testdata/trained/kjv-i2_s.gguf), which scripts/build-web puts beside the page.
$("demo").addEventListener("click", () => {
  const url = new URL(DEMO_MODEL, location.href).href;
  $("model-url").value = url;
  saveSettings();
  load(url, DEMO_MODEL);
});
$("model-file").addEventListener("change", () => {
  const f = $("model-file").files[0];
  if (f) load(f, f.name);
});
$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  send();
});
$("input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) {
    e.preventDefault();
    send();
  }
});
$("stop").addEventListener("click", () => worker.postMessage({ type: "stop" }));
$("new-chat").addEventListener("click", () => {
  if (state.busy) worker.postMessage({ type: "stop" });
  state.messages = [];
  $("messages").replaceChildren();
});

loadSettings();
const query = new URLSearchParams(location.search);
if (query.get("device")) $("device").value = query.get("device");
const fromQuery = query.get("model");
if (fromQuery) {
  const url = new URL(fromQuery, location.href).href;
  $("model-url").value = url;
  load(url, url.split("/").pop());
} else {
  setStatus("pick a model");
  isCached(new URL($("model-url").value, location.href).href).then((c) => {
    if (c) setStatus("the model is cached: Load works offline");
  });
}
