// The bitnet-rs chat page: streams replies from this server's /v1/chat/completions.
// Plain JavaScript, no dependencies; the conversation lives in this page only.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  // Page state, also reachable as `window.bitnetChat` (handy in the console).
  const state = { messages: [], replies: [], busy: false, controller: null };
  window.bitnetChat = state;

  const FIELDS = ["system", "temperature", "top-p", "max-tokens", "api-key"];
  const STORE = "bitnet-chat-settings";

  function loadSettings() {
    try {
      const saved = JSON.parse(localStorage.getItem(STORE) || "{}");
      for (const k of FIELDS) if (typeof saved[k] === "string") $(k).value = saved[k];
    } catch (_) { /* storage unavailable or corrupt: keep the defaults */ }
  }

  function saveSettings() {
    const s = {};
    for (const k of FIELDS) s[k] = $(k).value;
    try { localStorage.setItem(STORE, JSON.stringify(s)); } catch (_) { /* private mode */ }
  }

  function headers() {
    const h = { "Content-Type": "application/json" };
    const key = $("api-key").value.trim();
    if (key) h.Authorization = "Bearer " + key;
    return h;
  }

  function setStatus(text, cls) {
    const el = $("status");
    el.textContent = text;
    el.className = "status " + (cls || "");
  }

  async function checkServer() {
    try {
      const r = await fetch("/health");
      const j = await r.json();
      if (j.status === "loading") {
        setStatus("loading the model…");
        setTimeout(checkServer, 1000);
        return;
      }
      if (j.status !== "ok") {
        setStatus((j.error && j.error.message) || j.status, "bad");
        return;
      }
      const m = await fetch("/v1/models", { headers: headers() });
      if (m.status === 401) {
        setStatus("API key required (Settings)", "bad");
        return;
      }
      const models = await m.json();
      const model = models.data && models.data[0];
      if (model) {
        $("model").textContent = model.id + (model.meta && model.meta.n_ctx ? " · " + model.meta.n_ctx + " ctx" : "");
      }
      setStatus("ready", "ok");
    } catch (e) {
      setStatus("server unreachable", "bad");
      setTimeout(checkServer, 3000);
    }
  }

  // ---- markdown (a small, safe subset: text is escaped first, then marked up) ----
  const ESC = { "&": "&amp;", "<": "&lt;", ">": "&gt;", "\"": "&quot;", "'": "&#39;" };
  const escapeHtml = (s) => s.replace(/[&<>"']/g, (c) => ESC[c]);

  function inline(escaped) {
    return escaped.split(/(`[^`\n]+`)/g).map((p) => {
      if (p.length > 1 && p.startsWith("`") && p.endsWith("`")) return "<code>" + p.slice(1, -1) + "</code>";
      return p
        .replace(/\*\*([^*\n]+)\*\*/g, "<strong>$1</strong>")
        .replace(/(^|[^*\w])\*([^*\n]+)\*(?!\w)/g, "$1<em>$2</em>")
        .replace(/\[([^\]\n]+)\]\((https?:\/\/[^\s()]+)\)/g,
          "<a href=\"$2\" target=\"_blank\" rel=\"noopener noreferrer\">$1</a>");
    }).join("");
  }

  function markdown(src) {
    const out = [];
    const lines = src.split("\n");
    let para = [];
    let list = null;
    const flushPara = () => {
      if (para.length) out.push("<p>" + para.map((l) => inline(escapeHtml(l))).join("<br>") + "</p>");
      para = [];
    };
    const flushList = () => {
      if (list) {
        out.push("<" + list.tag + ">" + list.items.map((x) => "<li>" + inline(escapeHtml(x)) + "</li>").join("") + "</" + list.tag + ">");
      }
      list = null;
    };
    for (let i = 0; i < lines.length; i++) {
      const line = lines[i];
      const fence = line.match(/^\s*```\s*([\w+#.-]*)\s*$/);
      if (fence) {
        flushPara(); flushList();
        const code = [];
        // An unclosed fence (a reply still streaming) runs to the end.
        for (i++; i < lines.length && !/^\s*```\s*$/.test(lines[i]); i++) code.push(lines[i]);
        const cls = fence[1] ? " class=\"language-" + escapeHtml(fence[1]) + "\"" : "";
        out.push("<pre><code" + cls + ">" + escapeHtml(code.join("\n")) + "</code></pre>");
        continue;
      }
      const h = line.match(/^(#{1,6})\s+(.*)$/);
      if (h) {
        flushPara(); flushList();
        out.push("<h" + h[1].length + ">" + inline(escapeHtml(h[2])) + "</h" + h[1].length + ">");
        continue;
      }
      const item = line.match(/^\s*([-*+]|\d+[.)])\s+(.*)$/);
      if (item) {
        flushPara();
        const tag = /\d/.test(item[1]) ? "ol" : "ul";
        if (list && list.tag !== tag) flushList();
        if (!list) list = { tag, items: [] };
        list.items.push(item[2]);
        continue;
      }
      if (line.trim() === "") { flushPara(); flushList(); continue; }
      flushList();
      para.push(line);
    }
    flushPara(); flushList();
    return out.join("");
  }
  window.bitnetMarkdown = markdown;

  // ---- conversation ----
  function scrollDown() {
    const m = document.querySelector("main");
    m.scrollTop = m.scrollHeight;
  }

  function addMessage(role, text) {
    const div = document.createElement("div");
    div.className = "msg " + role;
    if (role === "assistant") {
      const body = document.createElement("div");
      body.className = "body";
      const stats = document.createElement("span");
      stats.className = "stats";
      div.append(body, stats);
    } else {
      div.textContent = text;
    }
    $("messages").appendChild(div);
    scrollDown();
    return div;
  }

  function setBusy(b) {
    state.busy = b;
    $("send").disabled = b;
    $("stop").disabled = !b;
  }

  function number(id, lo, hi) {
    const v = $(id).value.trim();
    if (v === "") return undefined;
    const x = Number(v);
    return Number.isFinite(x) && x >= lo && x <= hi ? x : undefined;
  }

  // Reads one SSE stream of chat chunks into `reply`, calling `onText` as text arrives.
  async function readStream(response, reply, onText) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        const data = event.split("\n").filter((l) => l.startsWith("data:"))
          .map((l) => l.slice(5).replace(/^ /, "")).join("\n");
        if (!data || data === "[DONE]") continue;
        const j = JSON.parse(data);
        if (j.error) throw new Error(j.error.message || "the server reported an error");
        if (j.usage) reply.tokens = j.usage.completion_tokens;
        const c = j.choices && j.choices[0];
        if (c && c.delta && c.delta.content) onText(c.delta.content);
        if (c && c.finish_reason) reply.finish = c.finish_reason;
      }
    }
  }

  async function send() {
    const text = $("input").value;
    if (state.busy || !text.trim()) return;
    $("input").value = "";
    state.messages.push({ role: "user", content: text });
    addMessage("user", text);
    const div = addMessage("assistant", "");
    const body = div.querySelector(".body");
    const stats = div.querySelector(".stats");
    body.classList.add("cursor");
    const reply = { content: "", pieces: 0, done: false, stopped: false, error: null, finish: null, tokens: null, tokPerS: null };
    state.replies.push(reply);
    setBusy(true);
    const controller = new AbortController();
    state.controller = controller;

    const messages = [];
    const system = $("system").value.trim();
    if (system) messages.push({ role: "system", content: system });
    messages.push(...state.messages);
    const req = { messages, stream: true, stream_options: { include_usage: true } };
    const temperature = number("temperature", 0, 2);
    const topP = number("top-p", 0, 1);
    const maxTokens = number("max-tokens", 1, 1e9);
    if (temperature !== undefined) req.temperature = temperature;
    if (topP !== undefined) req.top_p = topP;
    if (maxTokens !== undefined) req.max_tokens = Math.floor(maxTokens);

    const t0 = performance.now();
    let first = null;
    let last = null;
    let pieces = 0;
    try {
      const r = await fetch("/v1/chat/completions", {
        method: "POST", headers: headers(), body: JSON.stringify(req), signal: controller.signal,
      });
      if (!r.ok) {
        let msg = r.status + " " + r.statusText;
        try { const j = await r.json(); if (j.error && j.error.message) msg = j.error.message; } catch (_) { /* not JSON */ }
        throw new Error(msg);
      }
      await readStream(r, reply, (t) => {
        const now = performance.now();
        if (first === null) first = now;
        last = now;
        pieces++;
        reply.pieces = pieces;
        reply.content += t;
        body.innerHTML = markdown(reply.content);
        scrollDown();
      });
    } catch (e) {
      if (e.name === "AbortError") reply.stopped = true;
      else reply.error = String((e && e.message) || e);
    }
    const end = performance.now();
    body.classList.remove("cursor");
    state.controller = null;

    if (reply.error && !reply.content) {
      // Nothing came back: show why, and give the message back for another try.
      div.classList.add("error");
      body.textContent = reply.error;
      state.messages.pop();
      $("input").value = text;
    } else {
      body.innerHTML = markdown(reply.content);
      state.messages.push({ role: "assistant", content: reply.content });
      const n = reply.tokens !== null ? reply.tokens : pieces;
      const parts = [n + (n === 1 ? " token" : " tokens")];
      // Generation speed: tokens after the first over the time they took.
      if (first !== null && last > first && n > 1) {
        reply.tokPerS = (n - 1) / ((last - first) / 1000);
      } else if (n > 0 && end > t0) {
        reply.tokPerS = n / ((end - t0) / 1000);
      }
      if (reply.tokPerS !== null) parts.push(reply.tokPerS.toFixed(1) + " tok/s");
      parts.push(((end - t0) / 1000).toFixed(1) + " s");
      if (reply.stopped) parts.push("stopped");
      else if (reply.finish === "length") parts.push("hit the token limit");
      if (reply.error) parts.push("error: " + reply.error);
      stats.textContent = parts.join(" · ");
    }
    reply.done = true;
    setBusy(false);
    $("input").focus();
  }

  function newChat() {
    if (state.controller) state.controller.abort();
    state.messages = [];
    $("messages").replaceChildren();
    $("input").focus();
  }

  document.addEventListener("DOMContentLoaded", () => {
    loadSettings();
    for (const k of FIELDS) $(k).addEventListener("change", saveSettings);
    $("api-key").addEventListener("change", checkServer);
    $("composer").addEventListener("submit", (e) => { e.preventDefault(); send(); });
    $("input").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
    });
    $("stop").addEventListener("click", () => { if (state.controller) state.controller.abort(); });
    $("new-chat").addEventListener("click", newChat);
    setBusy(false);
    checkServer();
    $("input").focus();
  });
})();
