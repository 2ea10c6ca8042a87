//! The GPU crate's modules form layers: no module reaches, through the `crate::` paths of its
//! code, a module that reaches back to it. A name re-exported at the crate root
//! (`crate::GpuError`) counts as the module it comes from (read off `lib.rs`).
#![allow(clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The source without `//` comments.
fn code_of(text: &str) -> String {
    text.lines()
        .map(|l| l.find("//").map_or(l, |i| &l[..i]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The identifiers of a `crate::` path's first segment: `crate::model::X` gives `model`,
/// `crate::{GpuError, Result}` gives both names.
fn crate_refs(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for name in group[..end].split(',') {
                let name = name.trim().split("::").next().unwrap_or("").trim();
                if !name.is_empty() {
                    out.push(name.to_string());
                }
            }
        } else {
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            out.push(rest[..end].to_string());
        }
    }
    out
}

/// lib.rs's `pub use module::{names}`: each name's module.
fn reexports(lib: &str) -> BTreeMap<String, String> {
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
            let n = n.trim();
            if !n.is_empty() {
                map.insert(n.to_string(), module.trim().to_string());
            }
        }
    }
    map
}

/// The module graph of the crate's `src/` files (lib.rs excluded).
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs");
    let names = reexports(&lib);
    let mut modules = BTreeSet::new();
    for e in std::fs::read_dir(src).expect("src") {
        let p = e.expect("entry").path();
        if p.extension().is_some_and(|x| x == "rs") && p.file_stem().is_some_and(|s| s != "lib") {
            modules.insert(p.file_stem().expect("stem").to_string_lossy().into_owned());
        }
    }
    let mut g = BTreeMap::new();
    for m in &modules {
        let text = std::fs::read_to_string(src.join(format!("{m}.rs"))).expect("module");
        let mut to = BTreeSet::new();
        for r in crate_refs(&code_of(&text)) {
            let target = if modules.contains(&r) {
                Some(r)
            } else {
                names.get(&r).cloned()
            };
            if let Some(t) = target.filter(|t| t != m) {
                to.insert(t);
            }
        }
        g.insert(m.clone(), to);
    }
    g
}

/// Modules that reach themselves through others.
fn in_cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut stack: Vec<&str> = g
            .get(from)
            .map_or(Vec::new(), |s| s.iter().map(String::as_str).collect());
        while let Some(n) = stack.pop() {
            if seen.insert(n.to_string()) {
                if let Some(s) = g.get(n) {
                    stack.extend(s.iter().map(String::as_str));
                }
            }
        }
        seen
    };
    g.keys()
        .filter(|m| reach(m).contains(*m))
        .cloned()
        .collect()
}

#[test]
fn no_module_reaches_back_to_itself() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let g = graph(&src);
    assert!(g.len() >= 8, "modules read: {g:?}");
    assert!(
        g.get("model").is_some_and(|s| s.contains("kernels")),
        "the reader misses model's imports: {g:?}"
    );
    let cycles = in_cycles(&g);
    assert!(
        cycles.is_empty(),
        "modules in an import circle: {cycles:?}\n{g:#?}"
    );
}

#[test]
fn the_reader_sees_a_circle_and_grouped_imports() {
    assert_eq!(
        crate_refs("use crate::{GpuError, Result};\nlet x = crate::kernels::u32_of(1);"),
        ["GpuError", "Result", "kernels"]
    );
    let mut g = BTreeMap::new();
    g.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    g.insert("b".to_string(), BTreeSet::from(["c".to_string()]));
    g.insert("c".to_string(), BTreeSet::from(["a".to_string()]));
    g.insert("d".to_string(), BTreeSet::from(["a".to_string()]));
    assert_eq!(in_cycles(&g), ["a", "b", "c"]);
}
