//! The engine's modules import one way: no cycle between its top-level modules (the
//! `crate::X` paths each file names), and the on-disk format imports nothing above it.
//! A module's own submodules may call each other; cycles are counted between the modules
//! lib.rs declares.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

type Graph = BTreeMap<String, BTreeSet<String>>;

/// The source of `path`, without its unit tests (a `#[cfg(test)] mod tests` at the end).
fn code_of(path: &Path) -> String {
    let src = fs::read_to_string(path).unwrap();
    match src.find("#[cfg(test)]\nmod tests") {
        Some(at) => src[..at].to_string(),
        None => src,
    }
}

/// The top-level modules each named in a `crate::` path of `src`, including the members of
/// a `crate::{a, b::c}` group.
fn modules_named(src: &str) -> BTreeSet<String> {
    let mut named = BTreeSet::new();
    let ident = |s: &str| s.chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect::<String>();
    for (at, _) in src.match_indices("crate::") {
        let rest = &src[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            named.extend(group.split(',').map(|item| ident(item.trim())).filter(|m| !m.is_empty()));
        } else {
            named.insert(ident(rest));
        }
    }
    named.remove("");
    named
}

fn import_graph(src_dir: &Path) -> Graph {
    let mut graph = Graph::new();
    let mut stack = vec![src_dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let rel = path.strip_prefix(src_dir).unwrap();
            let module = rel.iter().next().unwrap().to_str().unwrap().trim_end_matches(".rs").to_string();
            if path.extension().is_none_or(|e| e != "rs")
                || module == "lib"
                || rel.iter().any(|c| c == "tests.rs" || c == "tests")
            {
                continue;
            }
            let named = modules_named(&code_of(&path));
            graph.entry(module.clone()).or_default().extend(named.into_iter().filter(|m| *m != module));
        }
    }
    graph
}

/// Modules that reach themselves through the graph.
fn modules_in_cycles(graph: &Graph) -> BTreeSet<String> {
    let reaches = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut todo: Vec<&str> = graph.get(from).into_iter().flatten().map(String::as_str).collect();
        while let Some(m) = todo.pop() {
            if seen.insert(m.to_string()) {
                todo.extend(graph.get(m).into_iter().flatten().map(String::as_str));
            }
        }
        seen
    };
    graph.keys().filter(|m| reaches(m).contains(*m)).cloned().collect()
}

#[test]
fn no_import_cycle_between_engine_modules() {
    let graph = import_graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(graph.len() > 10, "the source tree was not found: {graph:?}");
    let cyclic = modules_in_cycles(&graph);
    let edges: Vec<String> = cyclic
        .iter()
        .flat_map(|m| graph[m].iter().filter(|t| cyclic.contains(*t)).map(move |t| format!("{m} -> {t}")))
        .collect();
    assert!(cyclic.is_empty(), "import cycle among {cyclic:?}: {edges:?}");
}

#[test]
fn the_format_imports_nothing_above_it() {
    let graph = import_graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let above: Vec<&String> = graph["format"].iter().filter(|m| *m != "error").collect();
    assert!(above.is_empty(), "format/ imports {above:?}");
}

#[test]
fn a_cycle_is_seen() {
    let graph: Graph = [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")].iter().fold(Graph::new(), |mut g, (f, t)| {
        g.entry(f.to_string()).or_default().insert(t.to_string());
        g
    });
    assert_eq!(modules_in_cycles(&graph), ["a", "b", "c"].iter().map(|s| s.to_string()).collect());
    assert_eq!(
        modules_named("use crate::{buf::Buf, format::{A, B}};\nlet x = crate::dev::x();"),
        ["buf", "dev", "format"].iter().map(|s| s.to_string()).collect()
    );
}
