//! The kernel crate's modules form layers: no module reaches, through the `crate::` and
//! `super::` paths of its code (tests excluded), a module that reaches back to it; the tiers
//! (`simd::*`) and their shared types (`tier`, `cpu`) never name the dispatch table that
//! names them.
//!
//! Nodes are the top-level modules, except that each file under `src/simd/` is a node of its
//! own (the tiers); the files of `layout/` and `attn/` belong to their module. A name re-exported
//! at the crate root (`crate::Pool`) counts as the module it comes from (read off `lib.rs`).
#![allow(clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The source with comments and `#[cfg(test)]` modules removed.
fn code_of(text: &str) -> String {
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
        let code = match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        };
        out.push_str(code);
        out.push('\n');
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
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

/// The node a file belongs to: `simd::avx2` for `src/simd/avx2.rs`, `simd` for
/// `src/simd/mod.rs`, `attn` for everything under `src/attn/`, `dispatch` for `src/dispatch.rs`.
fn node_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("under src");
    let parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    match parts.as_slice() {
        [dir, f] if dir == "simd" && f != "mod" => format!("simd::{f}"),
        [one] => one.clone(),
        [dir, ..] => dir.clone(),
        [] => unreachable!(),
    }
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

/// The `(first, second)` path segments after each `crate::` in `code` (the second when the
/// first is `simd`), and the same for each `{...}` group after `crate::`.
fn crate_paths(code: &str) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().last();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        if let Some(g) = rest.strip_prefix('{') {
            let end = g.find('}').map_or(g.len(), |e| {
                // The group may nest: find its matching brace.
                let mut depth = 1;
                let mut at = e;
                for (k, ch) in g.char_indices() {
                    match ch {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                at = k;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                at
            });
            for h in group_heads(&g[..end]) {
                out.push((h, None));
            }
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

/// `super::x` paths in a file under `src/simd/`: the sibling tiers it names.
fn simd_siblings(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("super::") {
        rest = &rest[i + "super::".len()..];
        if let Some(g) = rest.strip_prefix('{') {
            let end = g.find('}').unwrap_or(g.len());
            out.extend(group_heads(&g[..end]));
        } else {
            let id: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            out.push(id);
        }
    }
    out
}

/// Names the crate root re-exports, with the module each comes from (`pub use m::{A, b};`).
fn root_exports(lib: &str) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    let code = code_of(lib);
    for stmt in code.split(';') {
        let s = stmt.trim();
        let Some(path) = s.strip_prefix("pub use ") else {
            continue;
        };
        let Some((module, names)) = path.split_once("::") else {
            continue;
        };
        let names = names.trim().trim_start_matches('{').trim_end_matches('}');
        for n in names.split(',') {
            let n = n.trim();
            if !n.is_empty() {
                map.insert(n.to_string(), module.trim().to_string());
            }
        }
    }
    map
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs");
    let exports = root_exports(&lib);
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let node = node_of(&src, f);
        if node == "lib" {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(f).expect("source file"));
        let edges = g.entry(node.clone()).or_default();
        for (first, second) in crate_paths(&code) {
            let target = if first == "simd" {
                match second {
                    Some(s) if s != "mod" => format!("simd::{s}"),
                    _ => "simd".to_string(),
                }
            } else if let Some(m) = exports.get(&first) {
                m.clone()
            } else {
                first
            };
            if target != node {
                edges.insert(target);
            }
        }
        if node.starts_with("simd::") {
            for s in simd_siblings(&code) {
                let target = format!("simd::{s}");
                if target != node && files.iter().any(|p| node_of(&src, p) == target) {
                    edges.insert(target);
                }
            }
        }
    }
    g
}

/// A cycle through `start`, if there is one (depth-first search).
fn find_cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        g: &BTreeMap<String, BTreeSet<String>>,
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
    for n in g.keys() {
        if let Some(c) = visit(g, n, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

/// Each node's layer: 0 for a node that names no other, else one more than the highest
/// layer it names.
fn layers(g: &BTreeMap<String, BTreeSet<String>>) -> BTreeMap<String, usize> {
    fn layer(
        g: &BTreeMap<String, BTreeSet<String>>,
        n: &str,
        memo: &mut BTreeMap<String, usize>,
    ) -> usize {
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

#[test]
fn modules_form_layers_without_a_circle() {
    let g = graph();
    // The parser sees the modules it must see: a broken reader would find no edges at all.
    for (from, to) in [
        ("dispatch", "simd::avx2"),
        ("dispatch", "tier"),
        ("simd::avx2", "tier"),
        ("simd::avx512", "simd::avx2"),
        ("ternary", "dispatch"),
        ("error", "formats"),
    ] {
        assert!(
            g.get(from).is_some_and(|e| e.contains(to)),
            "expected {from} → {to}; the graph read: {g:#?}"
        );
    }
    if let Some(c) = find_cycle(&g) {
        panic!("import circle: {}\n{g:#?}", c.join(" → "));
    }
    let l = layers(&g);
    let mut by_layer: BTreeMap<usize, Vec<&str>> = BTreeMap::new();
    for (n, &k) in &l {
        by_layer.entry(k).or_default().push(n);
    }
    for (k, ns) in by_layer {
        println!("layer {k}: {}", ns.join(", "));
    }
}

#[test]
fn tiers_and_their_types_never_name_the_dispatch() {
    let g = graph();
    for (n, edges) in &g {
        if n.starts_with("simd") || n == "tier" || n == "cpu" || n == "formats" {
            assert!(
                !edges.contains("dispatch"),
                "{n} names the dispatch table: {edges:?}"
            );
        }
    }
    // The leaves name nothing above them.
    for leaf in ["cpu", "formats", "aligned"] {
        let e = g.get(leaf).expect("leaf module present");
        assert!(e.is_empty(), "{leaf} should be a leaf, names {e:?}");
    }
}

#[test]
fn the_reader_finds_a_circle_where_there_is_one() {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    g.entry("a".into()).or_default().insert("b".into());
    g.entry("b".into()).or_default().insert("c".into());
    g.entry("c".into()).or_default().insert("a".into());
    g.entry("d".into()).or_default().insert("a".into());
    let c = find_cycle(&g).expect("a circle");
    assert_eq!(c.first(), c.last());
    assert_eq!(c.len(), 4);
    let code = "use crate::{dispatch::{kernels, Isa}, pool::Pool};\nlet x = crate::simd::avx2::f();\n// crate::hidden\n#[cfg(test)]\nmod tests {\n    use crate::ternary;\n}\n";
    let paths = crate_paths(&code_of(code));
    let firsts: Vec<&str> = paths.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(firsts, ["dispatch", "pool", "simd"]);
    assert_eq!(paths[2].1.as_deref(), Some("avx2"));
}
