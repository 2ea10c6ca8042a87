//! `--hf` downloads against a loopback stand-in for the Hugging Face hub.
//!
//! The server below answers the way huggingface.co does for the requests a hub client makes:
//! `GET {endpoint}/{repo}/resolve/main/{file}` (LFS files: 302 to a storage URL with
//! `x-linked-etag`; small files: direct, with `etag`), ranged `GET`s answered with 206 and
//! `Content-Range`, `GET {endpoint}/api/models/{repo}/revision/main` for the file listing, and
//! 404/401 with `x-error-code` for missing files and repos. It is hand-written on
//! `std::net` rather than taken from an HTTP server crate because the test needs exact control
//! of every status and header, one request per connection, and a hard bound on its work.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers

#[path = "../src/download.rs"]
mod download;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

const REPO: &str = "test-org/tiny-gguf";
const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
/// LFS etag: the hub uses the file's sha256; any stable hex name works for the client.
const LFS_ETAG: &str = "5f0c3a1e9b7d2c4f6a8e0b1d3c5e7f9a2b4d6f8e0a1c3e5b7d9f1a3c5e7b9d1f";
const DIRECT_REPO: &str = "test-org/direct";
const DIRECT_ETAG: &str = "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678";
const TWO_REPO: &str = "test-org/two-ggufs";
/// Upper bound on connections one server accepts; the scenario needs about 20.
const MAX_CONNECTIONS: usize = 64;
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(60);

/// 100 KiB of deterministic bytes that start like a GGUF v3 file (xorshift64 stream after the
/// 8-byte header).
fn synthetic_gguf(len: usize, seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(b"GGUF");
    out.extend_from_slice(&3u32.to_le_bytes());
    let mut x = seed;
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

struct Hub {
    /// URL path -> bytes, for the storage ("CDN") side.
    blobs: HashMap<String, Arc<Vec<u8>>>,
}

struct Server {
    addr: SocketAddr,
    /// One line per request: "GET /path range=bytes=0-0".
    log: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    fn start(model: Arc<Vec<u8>>, direct: Arc<Vec<u8>>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        assert!(addr.ip().is_loopback());
        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut blobs = HashMap::new();
        blobs.insert(format!("/cdn/{LFS_ETAG}"), model);
        blobs.insert(format!("/{DIRECT_REPO}/resolve/main/direct.gguf"), direct);
        let hub = Hub { blobs };
        let (log2, stop2) = (log.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            for _ in 0..MAX_CONNECTIONS {
                let Ok((stream, _)) = listener.accept() else {
                    break;
                };
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                // A broken connection only fails the client's request, which the test sees.
                let _ = serve_one(stream, addr, &hub, &log2);
            }
        });
        Server {
            addr,
            log,
            stop,
            thread: Some(thread),
        }
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn requests(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// Stops accepting and closes the listening socket.
    fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.stop();
        }
    }
}

fn serve_one(
    mut stream: TcpStream,
    addr: SocketAddr,
    hub: &Hub,
    log: &Mutex<Vec<String>>,
) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    // Read the request head (GETs carry no body).
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf)?;
        if n == 0 || head.len() > 64 * 1024 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&head).to_string();
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next().unwrap_or("").split(' ');
    let method = request_line.next().unwrap_or("").to_string();
    let path = request_line.next().unwrap_or("").to_string();
    let headers: HashMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let range = headers.get("range").cloned();
    log.lock().unwrap().push(format!(
        "{method} {path} range={}",
        range.as_deref().unwrap_or("-")
    ));

    let commit = ("x-repo-commit", COMMIT.to_string());
    let lfs_resolve = format!("/{REPO}/resolve/main/model.gguf");
    let (status, mut hdrs, body): (&str, Vec<(&str, String)>, Vec<u8>) = if method != "GET" {
        ("405 Method Not Allowed", vec![], vec![])
    } else if path == lfs_resolve {
        let model = &hub.blobs[&format!("/cdn/{LFS_ETAG}")];
        (
            "302 Found",
            vec![
                commit,
                ("x-linked-etag", format!("\"{LFS_ETAG}\"")),
                ("x-linked-size", model.len().to_string()),
                ("etag", "W/\"pointer-etag\"".to_string()),
                ("location", format!("http://{addr}/cdn/{LFS_ETAG}")),
            ],
            vec![],
        )
    } else if let Some(data) = hub.blobs.get(&path) {
        let mut hdrs = vec![];
        if path.contains("/resolve/") {
            hdrs.push(commit);
            hdrs.push(("etag", format!("\"{DIRECT_ETAG}\"")));
        }
        ranged(data, range.as_deref(), hdrs)
    } else if path == format!("/api/models/{REPO}/revision/main") {
        let json = format!(
            r#"{{"id":"{REPO}","sha":"{COMMIT}","siblings":[{{"rfilename":".gitattributes"}},{{"rfilename":"README.md"}},{{"rfilename":"model.gguf"}}]}}"#
        );
        ("200 OK", vec![], json.into_bytes())
    } else if path == format!("/api/models/{TWO_REPO}/revision/main") {
        let json = format!(
            r#"{{"id":"{TWO_REPO}","sha":"{COMMIT}","siblings":[{{"rfilename":"a-q8_0.gguf"}},{{"rfilename":"b-i2_s.gguf"}},{{"rfilename":"README.md"}}]}}"#
        );
        ("200 OK", vec![], json.into_bytes())
    } else if path.starts_with(&format!("/{REPO}/"))
        || path.starts_with(&format!("/{DIRECT_REPO}/"))
    {
        (
            "404 Not Found",
            vec![
                commit,
                ("x-error-code", "EntryNotFound".to_string()),
                ("x-error-message", "Entry not found".to_string()),
            ],
            b"Entry not found".to_vec(),
        )
    } else {
        // The hub answers unknown repos with 401 so as not to reveal private ones.
        (
            "401 Unauthorized",
            vec![
                ("x-error-code", "RepoNotFound".to_string()),
                ("x-error-message", "Repository not found".to_string()),
            ],
            b"Repository not found".to_vec(),
        )
    };
    hdrs.push(("content-length", body.len().to_string()));
    hdrs.push(("connection", "close".to_string()));
    let mut out = format!("HTTP/1.1 {status}\r\n");
    for (k, v) in hdrs {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    stream.write_all(out.as_bytes())?;
    stream.write_all(&body)?;
    stream.flush()
}

/// A 200 or 206 answer for `data` honouring a single `bytes=S-` / `bytes=S-E` range.
fn ranged<'a>(
    data: &[u8],
    range: Option<&str>,
    mut hdrs: Vec<(&'a str, String)>,
) -> (&'a str, Vec<(&'a str, String)>, Vec<u8>) {
    hdrs.push(("accept-ranges", "bytes".to_string()));
    let n = data.len();
    let Some(spec) = range.and_then(|r| r.strip_prefix("bytes=")) else {
        return ("200 OK", hdrs, data.to_vec());
    };
    let (s, e) = spec.split_once('-').unwrap();
    let start: usize = s.parse().unwrap();
    let end: usize = if e.is_empty() {
        n - 1
    } else {
        e.parse::<usize>().unwrap().min(n - 1)
    };
    if start > end {
        hdrs.push(("content-range", format!("bytes */{n}")));
        return ("416 Range Not Satisfiable", hdrs, vec![]);
    }
    hdrs.push(("content-range", format!("bytes {start}-{end}/{n}")));
    ("206 Partial Content", hdrs, data[start..=end].to_vec())
}

/// Runs `f` on its own thread and fails the test if it takes longer than `SCENARIO_TIMEOUT`.
fn with_timeout(f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = mpsc::channel();
    let t = std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(SCENARIO_TIMEOUT) {
        Ok(()) => t.join().unwrap(),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(p) = t.join() {
                std::panic::resume_unwind(p)
            }
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("download scenario timed out"),
    }
}

fn err_text(r: anyhow::Result<PathBuf>) -> String {
    format!("{:#}", r.expect_err("expected an error"))
}

fn assert_mentions(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "error {msg:?} does not mention {p:?}");
    }
}

/// Every network-facing case, run in order in one test because `HF_*` environment variables
/// are process-wide.
#[test]
fn hub_download_cache_and_errors() {
    with_timeout(scenario);
}

fn scenario() {
    for k in ["HF_HUB_OFFLINE", "HF_TOKEN", "HF_HUB_CACHE"] {
        std::env::remove_var(k);
    }
    let model = Arc::new(synthetic_gguf(100 * 1024, 0x9E37_79B9_7F4A_7C15));
    let direct = Arc::new(synthetic_gguf(4099, 0x0123_4567_89AB_CDEF));
    let mut server = Server::start(model.clone(), direct.clone());
    let endpoint = server.endpoint();
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("hub");

    // 1. LFS-style file (302 to storage): downloaded into the hub cache layout.
    let spec = format!("{REPO}:model.gguf");
    let path = download::resolve_hf_with(&spec, &endpoint, &cache, false).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), *model);
    let repo_dir = cache.join("models--test-org--tiny-gguf");
    assert_eq!(
        path,
        repo_dir.join("snapshots").join(COMMIT).join("model.gguf")
    );
    assert_eq!(
        std::fs::read_to_string(repo_dir.join("refs/main")).unwrap(),
        COMMIT
    );
    assert_eq!(
        std::fs::canonicalize(&path).unwrap(),
        std::fs::canonicalize(repo_dir.join("blobs").join(LFS_ETAG)).unwrap()
    );
    let log = server.requests();
    assert!(
        log.iter()
            .any(|l| l == &format!("GET /{REPO}/resolve/main/model.gguf range=bytes=0-0")),
        "{log:#?}"
    );
    assert!(
        log.iter()
            .any(|l| l.starts_with(&format!("GET /cdn/{LFS_ETAG} range=bytes=0-"))),
        "{log:#?}"
    );

    // 2. Small file answered directly with an etag (no redirect).
    let spec = format!("{DIRECT_REPO}:direct.gguf");
    let p = download::resolve_hf_with(&spec, &endpoint, &cache, true).unwrap();
    assert_eq!(std::fs::read(&p).unwrap(), *direct);
    assert!(p.starts_with(&cache));

    // 3. Missing file: 404 naming file, repo and endpoint.
    let msg = err_text(download::resolve_hf_with(
        &format!("{REPO}:missing.gguf"),
        &endpoint,
        &cache,
        false,
    ));
    assert_mentions(&msg, &["missing.gguf", REPO, &endpoint, "404"]);

    // 4. Unknown repo: the hub's 401 + RepoNotFound becomes "repository ... not found".
    let msg = err_text(download::resolve_hf_with(
        "nobody/nothing:x.gguf",
        &endpoint,
        &cache,
        false,
    ));
    assert_mentions(&msg, &["repository nobody/nothing not found", &endpoint]);

    // 5. No :FILE: the single .gguf of the listing (already cached, so no second download).
    let before = server.requests().len();
    let p = download::resolve_hf_with(REPO, &endpoint, &cache, false).unwrap();
    assert_eq!(p, path);
    let after = server.requests();
    assert_eq!(
        after[before..],
        [format!("GET /api/models/{REPO}/revision/main range=-")]
    );

    // 6. No :FILE and two .gguf files: an error listing both.
    let msg = err_text(download::resolve_hf_with(
        TWO_REPO, &endpoint, &cache, false,
    ));
    assert_mentions(&msg, &["a-q8_0.gguf", "b-i2_s.gguf", ":FILE"]);

    // 7. Through the environment: HF_ENDPOINT and HF_HOME (cache in $HF_HOME/hub).
    let home = tmp.path().join("hf-home");
    std::env::set_var("HF_ENDPOINT", &endpoint);
    std::env::set_var("HF_HOME", &home);
    let p = download::resolve_hf(&format!("{REPO}:model.gguf"), false).unwrap();
    assert!(p.starts_with(home.join("hub")), "{}", p.display());
    assert_eq!(std::fs::read(&p).unwrap(), *model);

    // Server gone: everything below must come from the cache or fail clearly.
    server.stop();
    let served = server.requests().len();

    // 8. Cache hits without the network, with and without :FILE.
    let again =
        download::resolve_hf_with(&format!("{REPO}:model.gguf"), &endpoint, &cache, false).unwrap();
    assert_eq!(again, path);
    assert_eq!(std::fs::read(&again).unwrap(), *model);
    assert_eq!(
        download::resolve_hf_with(REPO, &endpoint, &cache, false).unwrap(),
        path
    );
    assert_eq!(
        download::resolve_hf(&format!("{REPO}:model.gguf"), false).unwrap(),
        p
    );

    // 9. Not cached and the hub unreachable: the message points at -m FILE.
    let msg = err_text(download::resolve_hf_with(
        &format!("{REPO}:other.gguf"),
        &endpoint,
        &cache,
        false,
    ));
    assert_mentions(&msg, &["other.gguf", &endpoint, "-m FILE"]);

    // 10. HF_HUB_OFFLINE: cache only.
    std::env::set_var("HF_HUB_OFFLINE", "1");
    assert_eq!(
        download::resolve_hf_with(&format!("{REPO}:model.gguf"), &endpoint, &cache, false).unwrap(),
        path
    );
    let msg = err_text(download::resolve_hf_with(
        &format!("{DIRECT_REPO}:nope.gguf"),
        &endpoint,
        &cache,
        false,
    ));
    assert_mentions(&msg, &["nope.gguf", "HF_HUB_OFFLINE", "-m FILE"]);
    for k in ["HF_HUB_OFFLINE", "HF_ENDPOINT", "HF_HOME"] {
        std::env::remove_var(k);
    }
    assert_eq!(server.requests().len(), served, "network used after stop");
}

/// Bad `--hf` values are rejected before any network or cache access.
#[test]
fn bad_specs_are_rejected() {
    let cache = Path::new("/nonexistent-bitnet-test-cache");
    // Port 9 on loopback: nothing is contacted, since parsing fails first.
    let endpoint = "http://127.0.0.1:9";
    for spec in [
        "",
        ":x.gguf",
        "a/b/c:x.gguf",
        "owner/na me:x.gguf",
        "owner/..:x.gguf",
        "https://huggingface.co/owner/name",
        "owner/name:",
        "owner/name:../x.gguf",
        "owner/name:/etc/passwd",
        "owner/name:a//b.gguf",
        "owner/name:a\\b.gguf",
    ] {
        let msg = err_text(download::resolve_hf_with(spec, endpoint, cache, false));
        assert_mentions(&msg, &["invalid --hf value", "REPO:FILE"]);
    }
    let msg = err_text(download::resolve_hf_with(
        "owner/name:x.gguf",
        "ftp://example",
        cache,
        false,
    ));
    assert_mentions(&msg, &["ftp://example", "HF_ENDPOINT"]);
}

/// Endpoint and cache directory from the environment, in the hub client's documented order.
#[test]
fn hub_location_from_env() {
    let env = |pairs: &[(&str, &str)]| {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        download::hub_location(move |k| map.get(k).cloned())
    };
    let (e, c) = env(&[("HOME", "/home/u")]).unwrap();
    assert_eq!(e, "https://huggingface.co");
    assert_eq!(e, download::DEFAULT_ENDPOINT);
    assert_eq!(c, Path::new("/home/u/.cache/huggingface/hub"));
    let (_, c) = env(&[("HOME", "/home/u"), ("XDG_CACHE_HOME", "/x")]).unwrap();
    assert_eq!(c, Path::new("/x/huggingface/hub"));
    let (_, c) = env(&[
        ("HOME", "/home/u"),
        ("XDG_CACHE_HOME", "/x"),
        ("HF_HOME", "/h"),
    ])
    .unwrap();
    assert_eq!(c, Path::new("/h/hub"));
    let (e, c) = env(&[
        ("HF_HOME", "/h"),
        ("HF_HUB_CACHE", "/c"),
        ("HF_ENDPOINT", "http://127.0.0.1:1"),
    ])
    .unwrap();
    assert_eq!(
        (e.as_str(), c.as_path()),
        ("http://127.0.0.1:1", Path::new("/c"))
    );
    // Empty values count as unset.
    let (e, c) = env(&[("HF_ENDPOINT", ""), ("HF_HOME", ""), ("HOME", "/home/u")]).unwrap();
    assert_eq!(e, "https://huggingface.co");
    assert_eq!(c, Path::new("/home/u/.cache/huggingface/hub"));
    assert!(env(&[]).is_err());
}

/// The default repo without `:FILE` means the official i2_s file.
#[test]
fn default_repo_means_default_file() {
    assert_eq!(download::DEFAULT_REPO, "microsoft/bitnet-b1.58-2B-4T-gguf");
    assert_eq!(download::DEFAULT_FILE, "ggml-model-i2_s.gguf");
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path();
    // Pre-seed the cache in the hub layout; resolution must find it without any network.
    let snap = cache
        .join("models--microsoft--bitnet-b1.58-2B-4T-gguf")
        .join("snapshots")
        .join(COMMIT);
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::write(snap.join("ggml-model-i2_s.gguf"), b"GGUF").unwrap();
    std::fs::create_dir_all(cache.join("models--microsoft--bitnet-b1.58-2B-4T-gguf/refs")).unwrap();
    std::fs::write(
        cache.join("models--microsoft--bitnet-b1.58-2B-4T-gguf/refs/main"),
        COMMIT,
    )
    .unwrap();
    let p = download::resolve_hf_with(
        "microsoft/bitnet-b1.58-2B-4T-gguf",
        "http://127.0.0.1:9",
        cache,
        false,
    )
    .unwrap();
    assert_eq!(p, snap.join("ggml-model-i2_s.gguf"));
}
