// Headless Chromium for the package's tests and benchmark: find it, serve the package over
// HTTP, and drive a page over the DevTools protocol.
import { spawn } from "node:child_process";
import { createReadStream, existsSync, mkdtempSync, readFileSync, rmSync, statSync } from "node:fs";
import { createServer } from "node:http";
import { tmpdir } from "node:os";
import { delimiter, extname, join } from "node:path";

export function findChromium() {
  if (process.env.BITNET_CHROMIUM) return process.env.BITNET_CHROMIUM;
  for (const name of ["chromium", "chromium-browser", "google-chrome", "google-chrome-stable"]) {
    for (const dir of (process.env.PATH ?? "").split(delimiter)) {
      const p = join(dir, name);
      if (existsSync(p)) return p;
    }
  }
  return null;
}

const TYPES = { ".html": "text/html", ".js": "text/javascript", ".mjs": "text/javascript", ".css": "text/css", ".wasm": "application/wasm", ".json": "application/json" };

/** A static server: `pkg` at /, each `mounts[prefix]` folder at /prefix/. */
export function serve(pkg, mounts = {}, port = 0) {
  const server = createServer((req, res) => {
    const path = decodeURIComponent(new URL(req.url, "http://x").pathname);
    const mount = Object.keys(mounts).find((m) => path.startsWith(`/${m}/`));
    const file = mount ? join(mounts[mount], path.slice(mount.length + 2)) : join(pkg, path === "/" ? "index.html" : path);
    if (file.includes("..") || !existsSync(file)) {
      res.writeHead(404).end("not found");
      return;
    }
    res.writeHead(200, { "content-type": TYPES[extname(file)] ?? "application/octet-stream", "content-length": statSync(file).size });
    createReadStream(file).pipe(res);
  });
  return new Promise((r) => server.listen(port, "127.0.0.1", () => r(server)));
}

/** Headless Chromium with a DevTools connection to one page. */
export class Browser {
  static async launch(chromium) {
    const profile = mkdtempSync(join(tmpdir(), "bitnet-web-"));
    const child = spawn(chromium, [
      "--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--no-first-run",
      "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
      "--disable-component-update", "--disable-sync", "--disable-quic", "--remote-debugging-port=0",
      // WebGPU: on a machine without a GPU, through SwiftShader's Vulkan.
      "--enable-unsafe-webgpu", "--enable-features=Vulkan", "--use-vulkan=native",
      `--user-data-dir=${profile}`, "about:blank",
    ], { stdio: "ignore", detached: true });
    // The browser has a process group of its own (for `close`); it must not outlive this
    // process, however that ends.
    const reap = () => {
      try { process.kill(-child.pid, "SIGKILL"); } catch { /* gone */ }
    };
    process.once("exit", reap);
    for (const sig of ["SIGINT", "SIGTERM", "SIGHUP"]) {
      process.once(sig, () => {
        reap();
        process.exit(128 + (sig === "SIGINT" ? 2 : sig === "SIGTERM" ? 15 : 1));
      });
    }
    // A failure to connect (no DevTools port, no WebSocket in this Node) ends the browser
    // too: left running, it would keep this process, and the test run, alive for ever.
    try {
      const portFile = join(profile, "DevToolsActivePort");
      for (let i = 0; i < 300 && !existsSync(portFile); i++) await new Promise((r) => setTimeout(r, 100));
      const port = readFileSync(portFile, "utf8").split("\n")[0];
      let targets = [];
      for (let i = 0; i < 50 && !targets.some((t) => t.type === "page"); i++) {
        targets = await (await fetch(`http://127.0.0.1:${port}/json/list`)).json();
        if (!targets.some((t) => t.type === "page")) await new Promise((r) => setTimeout(r, 100));
      }
      const page = targets.find((t) => t.type === "page");
      const ws = new WebSocket(page.webSocketDebuggerUrl);
      await new Promise((ok, bad) => { ws.onopen = ok; ws.onerror = bad; });
      const b = new Browser();
      Object.assign(b, { child, profile, ws, next: 1, pending: new Map(), logs: [] });
      ws.onmessage = (ev) => {
        const m = JSON.parse(ev.data);
        if (m.id && b.pending.has(m.id)) {
          const { ok, bad } = b.pending.get(m.id);
          b.pending.delete(m.id);
          m.error ? bad(new Error(JSON.stringify(m.error))) : ok(m.result);
        } else if (m.method === "Runtime.consoleAPICalled") {
          b.logs.push(m.params.args.map((a) => a.value ?? a.description).join(" "));
        } else if (m.method === "Runtime.exceptionThrown") {
          b.logs.push("exception: " + JSON.stringify(m.params.exceptionDetails.exception?.description ?? m.params.exceptionDetails.text));
        }
      };
      await b.send("Runtime.enable");
      await b.send("Page.enable");
      return b;
    } catch (e) {
      reap();
      rmSync(profile, { recursive: true, force: true, maxRetries: 10, retryDelay: 200 });
      throw e;
    }
  }
  send(method, params = {}) {
    const id = this.next++;
    this.ws.send(JSON.stringify({ id, method, params }));
    return new Promise((ok, bad) => this.pending.set(id, { ok, bad }));
  }
  async eval(expression) {
    const r = await this.send("Runtime.evaluate", { expression, awaitPromise: true, returnByValue: true });
    if (r.exceptionDetails) throw new Error(`${expression.slice(0, 80)}…: ${r.exceptionDetails.exception?.description ?? r.exceptionDetails.text}\n${this.logs.join("\n")}`);
    return r.result.value;
  }
  async goto(url) {
    await this.send("Page.navigate", { url });
    await this.waitFor("document.readyState === 'complete'", 20000);
  }
  async waitFor(expression, ms = 30000) {
    const t0 = Date.now();
    for (;;) {
      let v = false;
      try { v = await this.eval(`!!(${expression})`); } catch { /* the page is navigating */ }
      if (v) return;
      if (Date.now() - t0 > ms) throw new Error(`timed out waiting for ${expression}\n${this.logs.join("\n")}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  async close() {
    try { this.ws.close(); } catch { /* closed */ }
    const exited = new Promise((r) => this.child.once("exit", r));
    // The whole process group: Chromium's helpers write to the profile until they end.
    try { process.kill(-this.child.pid, "SIGTERM"); } catch { this.child.kill(); }
    await exited;
    rmSync(this.profile, { recursive: true, force: true, maxRetries: 10, retryDelay: 200 });
  }
}

