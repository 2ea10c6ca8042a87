// Keeps the page's own files for offline use (the model files are cached by bitnet.js):
// answered from the cache, refreshed from the network when it is there.
const SHELL = "bitnet-web-shell-v1";
const FILES = ["./", "index.html", "web.js", "worker.js", "bitnet.js", "bitnet_web.js", "bitnet_web_bg.wasm", "bitnet_web_relaxed.js", "bitnet_web_relaxed_bg.wasm", "chat.css", "web.css"];

self.addEventListener("install", (e) => {
  e.waitUntil(caches.open(SHELL).then((c) => c.addAll(FILES)).then(() => self.skipWaiting()));
});
self.addEventListener("activate", (e) => e.waitUntil(self.clients.claim()));

self.addEventListener("fetch", (e) => {
  const url = new URL(e.request.url);
  const shell = url.origin === location.origin && FILES.some((f) => new URL(f, location.href).pathname === url.pathname);
  if (e.request.method !== "GET" || !shell) return;
  e.respondWith(
    caches.open(SHELL).then(async (cache) => {
      const cached = await cache.match(e.request, { ignoreSearch: true });
      const fresh = fetch(e.request)
        .then((r) => {
          if (r.ok) cache.put(e.request, r.clone());
          return r;
        })
        .catch(() => cached);
      return cached || fresh;
    }),
  );
});
