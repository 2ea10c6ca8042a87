// The model runs here, off the page's thread: the page stays responsive while a reply is
// computed, and a Stop reaches the generation between two tokens.
import { Model } from "./bitnet.js";

let model = null;
let controller = null;

function post(msg) {
  self.postMessage(msg);
}

self.onmessage = async (ev) => {
  const m = ev.data;
  try {
    if (m.type === "load") {
      if (model) model.free();
      model = null;
      model = await Model.load(m.source, {
        device: m.device ?? "auto",
        ctxSize: m.ctxSize,
        onProgress: (p) => post({ type: "progress", ...p }),
      });
      post({ type: "ready", info: model.info });
    } else if (m.type === "chat") {
      if (!model) throw new Error("no model loaded");
      controller = new AbortController();
      const result = await model.chat(m.messages, {
        ...m.options,
        signal: controller.signal,
        onToken: (p) => post({ type: "token", text: p.text }),
      });
      post({ type: "done", result });
    } else if (m.type === "stop") {
      if (controller) controller.abort();
    }
  } catch (e) {
    post({ type: "error", message: e instanceof Error ? e.message : String(e), during: m.type });
  } finally {
    if (m.type === "chat") controller = null;
  }
};
