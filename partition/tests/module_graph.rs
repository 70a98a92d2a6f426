//! The house keeps its plan, read from the source so that a change that breaks it fails here:
//!
//! - `partition`'s rooms (its top-level modules) depend only on rooms before them in
//!   [`ROOMS`]: what the user wrote, the OS seams, the CPU, the guest's memory, KVM, the host's
//!   reservation, the board (device placement and wiring), the local API, and last the
//!   launch pipeline;
//! - no file of `partition`, `benchmarks` or the probe guest imports another that imports it
//!   back (no circle, at file granularity);
//! - only `partition::kvm` uses kvm-ioctls.
//!
//! A file's dependencies are the modules it names by `crate::…` (anywhere, tests included)
//! and by `super::…` outside its `mod tests` (inside, `super` is the file itself). A path
//! names the longest module it starts with; one naming no module (`crate::Env`) names the
//! crate's root file. A parent's `mod child;` and `pub use child::…` are structure, not a
//! dependency.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// `partition`'s rooms, each allowed to depend on the ones before it.
const ROOMS: [&str; 9] = [
    "config", "sys", "cpu", "memory", "kvm", "host", "board", "api", "machine",
];

/// Module path ("host::ledger::lock", "" for the root) → its file's code (comment lines
/// dropped: a doc link to another module is not a dependency on it).
fn modules(src: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            if p.extension().and_then(|x| x.to_str()) != Some("rs") {
                continue;
            }
            let rel = p.strip_prefix(src).unwrap().with_extension("");
            let mut parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(
                parts.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                parts.pop();
            }
            let text = std::fs::read_to_string(&p).unwrap();
            let code: String = text
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .map(|l| format!("{l}\n"))
                .collect();
            out.insert(parts.join("::"), code);
        }
    }
    out
}

/// The paths written after `prefix` ("crate::" or "super::"): `a::b::C` and each element
/// of a `{x, y::z}` group, as segment lists.
fn paths_after(text: &str, prefix: &str) -> Vec<Vec<String>> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = Vec::new();
    for (i, _) in text.match_indices(prefix) {
        if i > 0 && text[..i].ends_with(ident) {
            continue;
        }
        let rest = &text[i + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let segs: Vec<String> = item
                    .trim()
                    .split("::")
                    .map(|s| s.trim().trim_matches(|c: char| !ident(c)).to_string())
                    .filter(|s| !s.is_empty() && s != "self")
                    .collect();
                if !segs.is_empty() {
                    out.push(segs);
                }
            }
            continue;
        }
        let mut segs = Vec::new();
        let mut r = rest;
        loop {
            let end = r.find(|c: char| !ident(c)).unwrap_or(r.len());
            if end == 0 {
                break;
            }
            segs.push(r[..end].to_string());
            r = &r[end..];
            match r.strip_prefix("::") {
                Some(next) if !next.starts_with('{') => r = next,
                _ => break,
            }
        }
        out.push(segs);
    }
    out
}

/// The longest module `base::segs…` starts with ("" when none: the root).
fn resolve(mods: &BTreeMap<String, String>, base: &[String], segs: &[String]) -> String {
    let mut best = base.join("::");
    let mut cur: Vec<String> = base.to_vec();
    for s in segs {
        cur.push(s.clone());
        let name = cur.join("::");
        if mods.contains_key(&name) {
            best = name;
        } else {
            break;
        }
    }
    best
}

/// Module → the other modules it depends on.
fn graph(mods: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    mods.iter()
        .map(|(name, text)| {
            let mut deps = BTreeSet::new();
            for segs in paths_after(text, "crate::") {
                deps.insert(resolve(mods, &[], &segs));
            }
            let top = text
                .find("#[cfg(test)]\nmod tests")
                .map_or(text.as_str(), |i| &text[..i]);
            let me: Vec<String> = if name.is_empty() {
                vec![]
            } else {
                name.split("::").map(String::from).collect()
            };
            if let Some((_, parent)) = me.split_last() {
                for segs in paths_after(top, "super::") {
                    deps.insert(resolve(mods, parent, &segs));
                }
            }
            deps.remove(name);
            (name.clone(), deps)
        })
        .collect()
}

/// A cycle in `g`, if there is one (as the path around it).
fn find_cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut c = path[i..].to_vec();
            c.push(n.to_string());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for d in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(d, g, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for n in g.keys() {
        if let Some(c) = visit(n, g, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

fn crate_src(rel: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn assert_no_circle(rel: &str, must_have: &[&str]) {
    let mods = modules(&crate_src(rel));
    for m in must_have {
        assert!(
            mods.contains_key(*m),
            "{rel}: no module {m} in {:?}",
            mods.keys()
        );
    }
    let g = graph(&mods);
    let cycle = find_cycle(&g);
    assert_eq!(
        cycle, None,
        "import circle in {rel}: {cycle:?}; the graph: {g:#?}"
    );
}

#[test]
fn the_checker_sees_a_cycle_when_there_is_one() {
    let g: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec![]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(find_cycle(&g).unwrap(), ["a", "b", "c", "a"]);
    let mut acyclic = g.clone();
    acyclic.get_mut("c").unwrap().clear();
    assert_eq!(find_cycle(&acyclic), None);
}

#[test]
fn the_checker_reads_paths_groups_and_super() {
    let mods: BTreeMap<String, String> = [
        ("", "pub fn env() {}\n"),
        (
            "a",
            "use crate::{b::B, env, c};\nfn f() { crate::c::d::x(); }\n",
        ),
        (
            "b",
            "use super::a::f;\n#[cfg(test)]\nmod tests {\n use super::*;\n}\n",
        ),
        ("c", ""),
        ("c::d", "use super::E;\n"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let g = graph(&mods);
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(g["a"], names(&["", "b", "c", "c::d"]));
    // `super` outside the tests names the parent's module; inside, the file itself.
    assert_eq!(g["b"], names(&["a"]));
    assert_eq!(g["c::d"], names(&["c"]));
    assert_eq!(find_cycle(&g).unwrap(), ["a", "b", "a"]);
}

#[test]
fn partition_has_no_import_circle() {
    assert_no_circle(
        "src",
        &["machine::launch", "kvm::vcpu", "cpu::exits", "host::ledger"],
    );
}

#[test]
fn partition_rooms_depend_only_on_the_rooms_before_them() {
    let mods = modules(&crate_src("src"));
    let room = |m: &str| ROOMS.iter().position(|r| m.split("::").next() == Some(*r));
    for r in ROOMS {
        assert!(mods.contains_key(r), "no room {r} in {:?}", mods.keys());
    }
    let mut wrong = Vec::new();
    for (m, deps) in graph(&mods) {
        let Some(mine) = room(&m) else { continue };
        for d in deps {
            if room(&d).is_none_or(|theirs| theirs > mine) {
                wrong.push(format!("{m} -> {d}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "rooms must depend only on rooms before them ({ROOMS:?}): {wrong:#?}"
    );
}

#[test]
fn benchmarks_have_no_import_circle() {
    assert_no_circle(
        "../benchmarks/src",
        &["", "doc", "doc::blk", "head", "host", "blk"],
    );
}

#[test]
fn the_benchmark_sections_types_live_in_doc() {
    // The results file's types in one place: no harness defines a section of its own.
    let outside: Vec<String> = modules(&crate_src("../benchmarks/src"))
        .into_iter()
        .filter(|(name, text)| {
            name.split("::").next() != Some("doc")
                && text.lines().any(|l| {
                    let l = l.trim_start();
                    l.starts_with("pub struct ") && l.contains("Section ")
                })
        })
        .map(|(name, _)| name)
        .collect();
    assert!(
        outside.is_empty(),
        "section types outside doc/: {outside:?}"
    );
    let doc = modules(&crate_src("../benchmarks/src"));
    assert!(doc["doc::memsetup"].contains("pub struct MemSetupSection "));
}

#[test]
fn the_probe_guest_has_no_import_circle() {
    assert_no_circle(
        "../tools/probe-guest/src",
        &["", "engine", "peers", "pcie", "nvme"],
    );
}

#[test]
fn only_the_kvm_module_uses_kvm_ioctls() {
    let outside: Vec<String> = modules(&crate_src("src"))
        .into_iter()
        .filter(|(name, text)| {
            name.split("::").next() != Some("kvm") && text.contains("kvm_ioctls")
        })
        .map(|(name, _)| name)
        .collect();
    assert!(
        outside.is_empty(),
        "kvm_ioctls used outside partition::kvm: {outside:?}"
    );
}

/// The device kinds, a file each in `board/` (docs/architecture.md, "Adding a device kind").
const KINDS: [&str; 4] = [
    "board::console",
    "board::disks",
    "board::engine",
    "board::vfio",
];

#[test]
fn the_generic_device_code_names_no_kind() {
    // One list names the kinds (board::spec, a line each); every other module, the
    // launch's pipeline whole, the PCI root, the placement and the kind's own trait, drives
    // them through `board::kind::Kind` and holds them as `board::device::Device`s.
    let g = graph(&modules(&crate_src("src")));
    let mut wrong = Vec::new();
    for (m, deps) in &g {
        if m == "board::spec" || KINDS.contains(&m.as_str()) {
            continue;
        }
        wrong.extend(
            deps.iter()
                .filter(|d| KINDS.contains(&d.as_str()))
                .map(|d| format!("{m} -> {d}")),
        );
    }
    assert!(
        wrong.is_empty(),
        "a module other than the list of kinds names a kind: {wrong:?}"
    );
    for m in [
        "board::spec",
        "board::kind",
        "machine::devices",
        "board::pci",
    ] {
        assert!(g.contains_key(m), "no module {m}");
    }
    // No kind imports the list or another kind: each stands alone beside the others.
    for k in KINDS {
        let deps = &g[k];
        let others: Vec<&String> = deps
            .iter()
            .filter(|d| {
                d.as_str() == "board::spec" || (KINDS.contains(&d.as_str()) && d.as_str() != k)
            })
            .collect();
        assert!(others.is_empty(), "{k} imports {others:?}");
    }
    // The PCI root takes the kinds' functions as PciAttachments and names none of them,
    // and no kind reaches for the root.
    for k in ["board::engine", "board::vfio"] {
        assert!(!g[k].contains("board::pci"), "{k} imports the PCI root");
    }
}
