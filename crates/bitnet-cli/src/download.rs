//! `--hf REPO[:FILE]`: fetch a model file from a Hugging Face hub into the local hub cache.
//!
//! The cache uses the hub's own layout (`models--OWNER--NAME/{blobs,refs,snapshots}`), so files
//! fetched by other hub clients are reused and the other way round. A file already in the cache
//! is returned without touching the network.
//!
//! Environment, read by [`resolve_hf`]:
//! - `HF_ENDPOINT`: hub base URL (default `https://huggingface.co`).
//! - `HF_HUB_CACHE`: cache directory; else `$HF_HOME/hub`; else
//!   `$XDG_CACHE_HOME/huggingface/hub`; else `~/.cache/huggingface/hub`.
//!
//! and by both [`resolve_hf`] and [`resolve_hf_with`]:
//! - `HF_TOKEN`: access token for gated or private repos (else the `token` file next to the
//!   cache, as written by `huggingface-cli login`).
//! - `HF_HUB_OFFLINE=1`: use the cache only, never the network.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use hf_hub::api::sync::{ApiBuilder, ApiError, ApiRepo};
use hf_hub::api::Progress;
use hf_hub::{Cache, Repo};

/// The official BitNet b1.58 2B4T GGUF repository.
pub const DEFAULT_REPO: &str = "microsoft/bitnet-b1.58-2B-4T-gguf";
/// The file taken from [`DEFAULT_REPO`] when `--hf` names the repo without `:FILE`.
pub const DEFAULT_FILE: &str = "ggml-model-i2_s.gguf";
/// The hub used when `HF_ENDPOINT` is not set.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Retries of an interrupted transfer; each retry resumes from the bytes already on disk.
const DOWNLOAD_RETRIES: usize = 3;
/// How many candidate file names an ambiguity error lists.
const MAX_LISTED: usize = 8;

/// The local path of `spec` ("REPO" or "REPO:FILE"), downloading it into the hub cache first
/// when it is not there yet. The hub and the cache come from the environment (module docs).
///
/// Without `:FILE`, [`DEFAULT_REPO`] means [`DEFAULT_FILE`]; any other repo must hold exactly
/// one `.gguf` file, found from the hub's file listing (or, offline, from the cached snapshot).
pub fn resolve_hf(spec: &str, show_progress: bool) -> Result<PathBuf> {
    let (endpoint, cache_dir) = hub_location(|k| std::env::var(k).ok())?;
    resolve_hf_with(spec, &endpoint, &cache_dir, show_progress)
}

/// [`resolve_hf`] against an explicit hub `endpoint` and cache directory (the directory that
/// holds `models--OWNER--NAME`, i.e. `$HF_HOME/hub`).
pub fn resolve_hf_with(
    spec: &str,
    endpoint: &str,
    cache_dir: &Path,
    show_progress: bool,
) -> Result<PathBuf> {
    let endpoint = check_endpoint(endpoint)?;
    let (repo_id, file) = parse_spec(spec)?;
    let offline = env_flag("HF_HUB_OFFLINE");
    let token = std::env::var("HF_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty());
    let hub = Hub {
        endpoint,
        cache_dir,
        repo_id: &repo_id,
    };

    let cache = Cache::new(cache_dir.to_path_buf());
    let mut builder = ApiBuilder::from_cache(cache.clone())
        .with_endpoint(endpoint.to_string())
        .with_progress(false)
        .with_retries(DOWNLOAD_RETRIES);
    if let Some(t) = token {
        builder = builder.with_token(Some(t.trim().to_string()));
    }
    let api = builder
        .build()
        .map_err(|e| anyhow!("cannot set up the HTTP client for {endpoint}: {e}"))?;
    let api_repo = api.model(repo_id.clone());

    let file = match file {
        Some(f) => f,
        None => hub.pick_gguf(&api_repo, offline)?,
    };

    if let Some(path) = cache.model(repo_id.clone()).get(&file) {
        return Ok(path);
    }
    if offline {
        bail!(
            "{file} from {repo_id} is not in the cache {} and HF_HUB_OFFLINE is set; \
             unset it to download, or pass -m FILE to use a local model",
            cache_dir.display()
        );
    }

    if show_progress {
        eprintln!(
            "downloading {repo_id}:{file} from {endpoint} into {}",
            cache_dir.display()
        );
        api_repo.download_with_progress(&file, Bar::new())
    } else {
        api_repo.download_with_progress(&file, ())
    }
    .map_err(|e| hub.explain(e, &file))
}

/// `(endpoint, cache_dir)` from environment variables looked up through `var` (see the module
/// docs for the order). Empty values count as unset.
pub fn hub_location(var: impl Fn(&str) -> Option<String>) -> Result<(String, PathBuf)> {
    let var = |k: &str| var(k).filter(|v| !v.trim().is_empty());
    let endpoint = var("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
    let cache_dir = if let Some(dir) = var("HF_HUB_CACHE") {
        PathBuf::from(dir)
    } else if let Some(home) = var("HF_HOME") {
        PathBuf::from(home).join("hub")
    } else if let Some(xdg) = var("XDG_CACHE_HOME") {
        PathBuf::from(xdg).join("huggingface").join("hub")
    } else if let Some(home) = var("HOME").or_else(|| var("USERPROFILE")) {
        PathBuf::from(home)
            .join(".cache")
            .join("huggingface")
            .join("hub")
    } else {
        bail!("cannot find a cache directory for downloads: set HF_HOME (or pass -m FILE)");
    };
    Ok((endpoint, cache_dir))
}

/// Where one resolution talks to, for error messages and the offline fallback.
struct Hub<'a> {
    endpoint: &'a str,
    cache_dir: &'a Path,
    repo_id: &'a str,
}

impl Hub<'_> {
    /// The single `.gguf` file of the repo: from the hub's listing, or, when the hub cannot be
    /// reached (or `offline`), from the cached snapshot of the repo's main revision.
    fn pick_gguf(&self, api_repo: &ApiRepo, offline: bool) -> Result<String> {
        let repo_id = self.repo_id;
        let listed = if offline {
            None
        } else {
            match api_repo.info() {
                Ok(info) => Some(info.siblings.into_iter().map(|s| s.rfilename).collect()),
                Err(e) => {
                    let err = self.explain(e, "(file listing)");
                    match self.cached_ggufs() {
                        Some(cached) if cached.len() == 1 => Some(cached),
                        _ => return Err(err),
                    }
                }
            }
        };
        let names: Vec<String> = match listed {
            Some(names) => names,
            None => self.cached_ggufs().unwrap_or_default(),
        };
        let mut ggufs: Vec<String> = names.into_iter().filter(|n| is_gguf(n)).collect();
        ggufs.sort();
        match ggufs.len() {
            1 => {
                let file = ggufs.remove(0);
                check_file(&file).with_context(|| format!("file listing of {repo_id}"))?;
                Ok(file)
            }
            0 if offline => bail!(
                "no .gguf file of {repo_id} is in the cache {} and HF_HUB_OFFLINE is set; \
                 name the file with --hf {repo_id}:FILE, or pass -m FILE",
                self.cache_dir.display()
            ),
            0 => bail!(
                "repository {repo_id} on {} has no .gguf file; name one with --hf {repo_id}:FILE",
                self.endpoint
            ),
            n => {
                let shown: Vec<&str> = ggufs.iter().take(MAX_LISTED).map(String::as_str).collect();
                let more = if n > MAX_LISTED { ", ..." } else { "" };
                bail!(
                    "repository {repo_id} has {n} .gguf files ({}{more}); choose one with \
                     --hf {repo_id}:FILE",
                    shown.join(", ")
                )
            }
        }
    }

    /// `.gguf` files (paths relative to the snapshot) in the cached snapshot of `main`, if the
    /// repo has been cached before.
    fn cached_ggufs(&self) -> Option<Vec<String>> {
        let repo_dir = self
            .cache_dir
            .join(Repo::model(self.repo_id.to_string()).folder_name());
        let commit = std::fs::read_to_string(repo_dir.join("refs").join("main")).ok()?;
        let commit = commit.trim();
        if commit.is_empty() || commit.contains(['/', '\\']) || commit.contains("..") {
            return None;
        }
        let snapshot = repo_dir.join("snapshots").join(commit);
        let mut found = Vec::new();
        collect_ggufs(&snapshot, &snapshot, 0, &mut found);
        Some(found)
    }

    /// A hub failure as a message naming the repo, the file and the endpoint.
    fn explain(&self, e: ApiError, file: &str) -> anyhow::Error {
        let Hub {
            endpoint, repo_id, ..
        } = *self;
        match e {
            ApiError::RequestError(err) => match *err {
                ureq::Error::Status(code, resp) => {
                    let hub_code = resp.header("x-error-code").unwrap_or_default().to_string();
                    let hub_msg = resp
                        .header("x-error-message")
                        .map(|m| format!(": {m}"))
                        .unwrap_or_default();
                    match (code, hub_code.as_str()) {
                        (_, "RepoNotFound") => anyhow!(
                            "repository {repo_id} not found on {endpoint} (HTTP {code}) while \
                             fetching {file}; check the name, or set HF_TOKEN if it is private"
                        ),
                        (_, "RevisionNotFound") => anyhow!(
                            "repository {repo_id} on {endpoint} has no main revision (HTTP {code}) \
                             while fetching {file}"
                        ),
                        (401 | 403, _) => anyhow!(
                            "{endpoint} refused access to {file} in {repo_id} (HTTP {code}{hub_msg}): \
                             the repository may not exist, or it is gated or private (set HF_TOKEN \
                             to a token with access)"
                        ),
                        (404, _) => anyhow!(
                            "file {file} not found in repository {repo_id} on {endpoint} \
                             (HTTP 404{hub_msg})"
                        ),
                        _ => anyhow!(
                            "{endpoint} answered HTTP {code}{hub_msg} for {file} in {repo_id}"
                        ),
                    }
                }
                ureq::Error::Transport(t) => anyhow!(
                    "cannot reach {endpoint} to fetch {file} from {repo_id}: {t}; check the \
                     network (and HF_ENDPOINT), or pass -m FILE to use a local model"
                ),
            },
            ApiError::TooManyRetries(inner) => {
                let inner = self.explain(*inner, file);
                anyhow!("download of {file} from {repo_id} kept failing after {DOWNLOAD_RETRIES} retries: {inner:#}")
            }
            ApiError::MissingHeader(h) | ApiError::InvalidHeader(h) => anyhow!(
                "{endpoint} does not answer like a Hugging Face hub: its reply for {file} in \
                 {repo_id} lacks a valid {h} header"
            ),
            ApiError::IoError(io) => anyhow!(
                "cannot store {file} from {repo_id} in the cache {}: {io}",
                self.cache_dir.display()
            ),
            ApiError::LockAcquisition(lock) => anyhow!(
                "another process is downloading {file} from {repo_id} (lock {} is held); try \
                 again when it is done",
                lock.display()
            ),
            other => anyhow!("cannot fetch {file} from {repo_id} on {endpoint}: {other}"),
        }
    }
}

/// Splits "REPO[:FILE]" and checks both parts; the default repo's FILE defaults to
/// [`DEFAULT_FILE`].
fn parse_spec(spec: &str) -> Result<(String, Option<String>)> {
    let spec = spec.trim();
    let (repo, file) = match spec.split_once(':') {
        Some((r, f)) => (r, Some(f)),
        None => (spec, None),
    };
    let usage = || {
        format!(
            "invalid --hf value {spec:?}: expected REPO or REPO:FILE, e.g. {DEFAULT_REPO}:{DEFAULT_FILE}"
        )
    };
    check_repo(repo).with_context(usage)?;
    let file = match file {
        Some(f) => {
            check_file(f).with_context(usage)?;
            Some(f.to_string())
        }
        None if repo == DEFAULT_REPO => Some(DEFAULT_FILE.to_string()),
        None => None,
    };
    Ok((repo.to_string(), file))
}

/// A hub repo id: "NAME" or "OWNER/NAME", each part of ASCII letters, digits, `-`, `_`, `.`.
fn check_repo(repo: &str) -> Result<()> {
    let parts: Vec<&str> = repo.split('/').collect();
    if parts.len() > 2 {
        bail!("repo id {repo:?} has more than one '/'");
    }
    for part in parts {
        let ok_chars = part
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if part.is_empty() || !ok_chars || part == "." || part == ".." {
            bail!("repo id {repo:?} is not OWNER/NAME");
        }
    }
    Ok(())
}

/// A file path inside a repo: relative, '/'-separated, no empty, `.` or `..` components (it
/// becomes a path under the cache's snapshot directory).
fn check_file(file: &str) -> Result<()> {
    if file.is_empty() {
        bail!("empty file name");
    }
    let bad_part = file
        .split('/')
        .any(|p| p.is_empty() || p == "." || p == "..");
    if bad_part || file.contains(['\\', ':', '\0']) {
        bail!("file name {file:?} is not a relative path inside the repo");
    }
    Ok(())
}

fn check_endpoint(endpoint: &str) -> Result<&str> {
    let trimmed = endpoint.trim().trim_end_matches('/');
    let rest = trimmed
        .strip_prefix("https://")
        .or_else(|| trimmed.strip_prefix("http://"));
    match rest {
        Some(host) if !host.is_empty() => Ok(trimmed),
        _ => bail!("hub endpoint {endpoint:?} (HF_ENDPOINT) is not an http:// or https:// URL"),
    }
}

fn is_gguf(name: &str) -> bool {
    name.len() > 5 && name.to_ascii_lowercase().ends_with(".gguf")
}

/// True when the variable is set to 1/true/yes/on (any case).
fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "on"
        )
    })
}

/// Appends `.gguf` files under `dir` (as '/'-joined paths relative to `root`), a few levels deep.
fn collect_ggufs(root: &Path, dir: &Path, depth: usize, found: &mut Vec<String>) {
    const MAX_DEPTH: usize = 4;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if depth < MAX_DEPTH {
                collect_ggufs(root, &path, depth + 1, found);
            }
        } else if path.is_file() {
            let rel = path.strip_prefix(root).ok().and_then(|r| {
                r.components()
                    .map(|c| c.as_os_str().to_str())
                    .collect::<Option<Vec<_>>>()
            });
            if let Some(parts) = rel {
                let name = parts.join("/");
                if is_gguf(&name) {
                    found.push(name);
                }
            }
        }
    }
}

/// Download progress on stderr (hidden when stderr is not a terminal).
struct Bar(indicatif::ProgressBar);

impl Bar {
    fn new() -> Self {
        let style = indicatif::ProgressStyle::with_template(
            "{msg} [{elapsed_precise}] [{wide_bar}] {bytes}/{total_bytes} {bytes_per_sec} ({eta})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> ");
        Self(indicatif::ProgressBar::new(0).with_style(style))
    }
}

impl Progress for Bar {
    fn init(&mut self, size: usize, filename: &str) {
        // Called again before each resumed attempt, which then reports the bytes already on
        // disk through `update`: restart from zero so they are not counted twice.
        self.0.set_length(u64::try_from(size).unwrap_or(u64::MAX));
        self.0.set_position(0);
        let name = filename.rsplit('/').next().unwrap_or(filename);
        self.0.set_message(name.to_string());
    }

    fn update(&mut self, size: usize) {
        self.0.inc(u64::try_from(size).unwrap_or(u64::MAX));
    }

    fn finish(&mut self) {
        self.0.finish();
    }
}
