//! The module graph of a crate, read off its sources, for the tests that keep its modules in
//! layers (no module reaches, through the `crate::` and `super::` paths of its code, tests
//! excluded, a module that reaches back to it).
//!
//! Nodes are the files under `src/` (lib.rs excluded) by their module path: `model` for
//! `src/model.rs`, and a folder's files together as the folder's module (`attn` for everything
//! under `src/attn/`), except the folders named in `split`, each of whose files is a node of its
//! own (`simd::avx2` for `src/simd/avx2.rs`; its `mod.rs` is `simd`). A name re-exported at the
//! crate root (`crate::Pool`) counts as the module it comes from (read off `lib.rs`); in a split
//! folder's file, `super::x` naming a sibling file is an edge to it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each node's edges: the nodes its code names.
pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// The source with `//` comments and `#[cfg(test)] mod tests` blocks removed.
#[must_use]
pub fn code_of(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line.trim() == "#[cfg(test)]"
            && lines
                .peek()
                .is_some_and(|n| n.trim_start().starts_with("mod tests"))
        {
            // Skip the test module: to its closing brace at the same indentation.
            let indent = line.len() - line.trim_start().len();
            let close = format!("{}}}", " ".repeat(indent));
            for l in lines.by_ref() {
                if l == close {
                    break;
                }
            }
            continue;
        }
        out.push_str(line.find("//").map_or(line, |i| &line[..i]));
        out.push('\n');
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|e| {
            e.unwrap_or_else(|e| panic!("a directory entry: {e}"))
                .path()
        })
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn node_of(src: &Path, file: &Path, split: &[&str]) -> String {
    let rel = file
        .strip_prefix(src)
        .unwrap_or_else(|_| panic!("{} is not under {}", file.display(), src.display()));
    let parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    match parts.as_slice() {
        [dir, f] if split.contains(&dir.as_str()) && f != "mod" => format!("{dir}::{f}"),
        [one] => one.clone(),
        [dir, ..] => dir.clone(),
        [] => panic!("an empty path under {}", src.display()),
    }
}

fn ident(s: &str) -> String {
    s.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// Identifiers at the start of each comma-separated entry of a `{...}` use group.
fn group_heads(group: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    for ch in group.chars() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                heads.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(ch);
    }
    heads.push(cur);
    heads
        .iter()
        .map(|h| h.trim().split("::").next().unwrap_or("").trim().to_string())
        .filter(|h| !h.is_empty())
        .collect()
}

/// The `(first, second)` segments after each `prefix` (`crate::`, `super::`) in `code`, and
/// the first segment of each entry of a `{...}` group there.
#[must_use]
pub fn paths_after(code: &str, prefix: &str) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find(prefix) {
        let before = rest[..i].chars().last();
        rest = &rest[i + prefix.len()..];
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        if let Some(g) = rest.strip_prefix('{') {
            // The group may nest: its matching brace.
            let mut depth = 1;
            let mut end = g.len();
            for (k, ch) in g.char_indices() {
                match ch {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = k;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            out.extend(group_heads(&g[..end]).into_iter().map(|h| (h, None)));
            continue;
        }
        let first = ident(rest);
        let second = rest[first.len()..]
            .strip_prefix("::")
            .map(ident)
            .filter(|s| !s.is_empty());
        out.push((first, second));
    }
    out
}

/// Names the crate root re-exports, with the module each comes from (`pub use m::{A, b};`).
#[must_use]
pub fn root_exports(lib: &str) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    for stmt in code_of(lib).split(';') {
        let Some(path) = stmt.trim().strip_prefix("pub use ") else {
            continue;
        };
        let Some((module, names)) = path.split_once("::") else {
            continue;
        };
        let names = names.trim().trim_start_matches('{').trim_end_matches('}');
        for n in names.split(',') {
            let n = n.trim().split(" as ").next().unwrap_or("").trim();
            if !n.is_empty() {
                map.insert(n.to_string(), module.trim().to_string());
            }
        }
    }
    map
}

/// The graph of the crate whose sources are in `src` (see the module's doc).
#[must_use]
pub fn read(src: &Path, split: &[&str]) -> Graph {
    let lib = std::fs::read_to_string(src.join("lib.rs"))
        .unwrap_or_else(|e| panic!("{}: {e}", src.join("lib.rs").display()));
    let exports = root_exports(&lib);
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let nodes: BTreeSet<String> = files.iter().map(|f| node_of(src, f, split)).collect();
    let mut g = Graph::new();
    for f in &files {
        let node = node_of(src, f, split);
        if node == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let code = code_of(&text);
        let mut targets = Vec::new();
        for (first, second) in paths_after(&code, "crate::") {
            targets.push(if split.contains(&first.as_str()) {
                second
                    .map(|s| format!("{first}::{s}"))
                    .filter(|n| nodes.contains(n))
                    .unwrap_or(first)
            } else if let Some(m) = exports.get(&first) {
                m.clone()
            } else {
                first
            });
        }
        if let Some((dir, _)) = node.split_once("::") {
            for (s, _) in paths_after(&code, "super::") {
                targets.push(format!("{dir}::{s}"));
            }
        }
        let edges = g.entry(node.clone()).or_default();
        for t in targets {
            if t != node && nodes.contains(&t) {
                edges.insert(t);
            }
        }
    }
    g
}

/// A circle of the graph (its first node repeated at the end), if there is one.
#[must_use]
pub fn find_cycle(g: &Graph) -> Option<Vec<String>> {
    fn visit(
        g: &Graph,
        n: &str,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = stack.iter().position(|s| s == n) {
            let mut c = stack[i..].to_vec();
            c.push(n.to_string());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        stack.push(n.to_string());
        for m in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(g, m, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    g.keys()
        .find_map(|n| visit(g, n, &mut Vec::new(), &mut done))
}

/// Each node's layer: 0 for a node that names no other, else one more than the highest
/// layer it names (the graph must have no circle).
#[must_use]
pub fn layers(g: &Graph) -> BTreeMap<String, usize> {
    fn layer(g: &Graph, n: &str, memo: &mut BTreeMap<String, usize>) -> usize {
        if let Some(&l) = memo.get(n) {
            return l;
        }
        let l = g
            .get(n)
            .into_iter()
            .flatten()
            .map(|m| layer(g, m, memo) + 1)
            .max()
            .unwrap_or(0);
        memo.insert(n.to_string(), l);
        l
    }
    let mut memo = BTreeMap::new();
    for n in g.keys() {
        layer(g, n, &mut memo);
    }
    memo
}

/// Panics naming the circle when `g` has one; otherwise prints its layers.
pub fn assert_layered(what: &str, g: &Graph) {
    if let Some(c) = find_cycle(g) {
        panic!("{what}: import circle {}\n{g:#?}", c.join(" → "));
    }
    let mut by_layer: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for (n, k) in layers(g) {
        by_layer.entry(k).or_default().push(n);
    }
    for (k, ns) in by_layer {
        println!("{what} layer {k}: {}", ns.join(", "));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every library crate of the workspace, its modules in layers (the kernel crate's
    /// `simd/` and `attn/` files each a node; the kernel, GPU and server crates' own
    /// `tests/layers.rs` check more of their shape).
    #[test]
    fn no_crate_of_the_workspace_has_an_import_circle() {
        let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut read_crates = 0;
        let mut entries: Vec<PathBuf> = std::fs::read_dir(&crates)
            .unwrap_or_else(|e| panic!("{}: {e}", crates.display()))
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        entries.sort();
        for dir in entries {
            let src = dir.join("src");
            if !src.join("lib.rs").exists() {
                continue;
            }
            let name = dir.file_name().map(|n| n.to_string_lossy().into_owned());
            let split: &[&str] = if name.as_deref() == Some("bitnet-kernels") {
                &["simd", "attn"]
            } else {
                &[]
            };
            let g = read(&src, split);
            if let Some(c) = find_cycle(&g) {
                panic!("{}: import circle {}", dir.display(), c.join(" → "));
            }
            read_crates += 1;
        }
        assert!(read_crates >= 10, "crates read: {read_crates}");
    }

    #[test]
    fn the_reader_finds_a_circle_and_the_paths() {
        let mut g = Graph::new();
        g.entry("a".into()).or_default().insert("b".into());
        g.entry("b".into()).or_default().insert("c".into());
        g.entry("c".into()).or_default().insert("a".into());
        g.entry("d".into()).or_default().insert("a".into());
        let c = find_cycle(&g).unwrap_or_default();
        assert_eq!(c.first(), c.last());
        assert_eq!(c.len(), 4);
        if let Some(e) = g.get_mut("c") {
            e.clear();
        }
        assert_eq!(find_cycle(&g), None);
        assert_eq!(layers(&g)["d"], 3);
        let code = "use crate::{dispatch::{kernels, Isa}, pool::Pool};\nlet x = crate::simd::avx2::f();\nlet y = my_crate::no;\n// crate::hidden\n#[cfg(test)]\nmod tests {\n    use crate::ternary;\n}\n";
        let paths = paths_after(&code_of(code), "crate::");
        let firsts: Vec<&str> = paths.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(firsts, ["dispatch", "pool", "simd"]);
        assert_eq!(paths[2].1.as_deref(), Some("avx2"));
        let sup = paths_after(
            "use super::{kv::Block, LANES};\nsuper::work::run();",
            "super::",
        );
        let heads: Vec<&str> = sup.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(heads, ["kv", "LANES", "work"]);
        let ex = root_exports("pub use cache::{GpuCache, GpuKv};\npub use a::B as C;");
        assert_eq!(ex.get("GpuKv").map(String::as_str), Some("cache"));
        assert_eq!(ex.get("B").map(String::as_str), Some("a"));
    }
}
