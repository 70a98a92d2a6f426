//! The modules of `partition` form no import cycle, and only `partition::kvm` uses
//! kvm-ioctls: read from the source, so a change that breaks either fails here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top-level module name → the source text of its files.
fn modules() -> BTreeMap<String, String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    let mut stack = vec![src.clone()];
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
            let rel = p.strip_prefix(&src).unwrap();
            let first = rel
                .components()
                .next()
                .unwrap()
                .as_os_str()
                .to_string_lossy();
            let name = first.trim_end_matches(".rs").to_string();
            if name == "lib" {
                continue;
            }
            // Code only: a doc link to another module is not a dependency on it.
            let text = std::fs::read_to_string(&p).unwrap();
            let code: String = text
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .map(|l| format!("{l}\n"))
                .collect();
            out.entry(name).or_default().push_str(&code);
        }
    }
    out
}

/// Module → the other top-level modules it names as `crate::X`.
fn graph(mods: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    mods.iter()
        .map(|(name, text)| {
            let deps = text
                .match_indices("crate::")
                .filter_map(|(i, _)| {
                    let rest = &text[i + 7..];
                    let end = rest
                        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .unwrap_or(rest.len());
                    let m = &rest[..end];
                    (m != name && mods.contains_key(m)).then(|| m.to_string())
                })
                .collect();
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
fn modules_form_no_import_cycle() {
    let mods = modules();
    assert!(
        mods.contains_key("launch") && mods.contains_key("kvm"),
        "{:?}",
        mods.keys()
    );
    let g = graph(&mods);
    assert_eq!(
        find_cycle(&g),
        None,
        "import cycle among partition's modules: {g:#?}"
    );
}

#[test]
fn only_the_kvm_module_uses_kvm_ioctls() {
    let outside: Vec<String> = modules()
        .into_iter()
        .filter(|(name, text)| name != "kvm" && text.contains("kvm_ioctls"))
        .map(|(name, _)| name)
        .collect();
    assert!(
        outside.is_empty(),
        "kvm_ioctls used outside partition::kvm: {outside:?}"
    );
}
