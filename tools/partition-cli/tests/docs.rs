//! What the docs say CI runs is what the scripts run: the rig's default suite in
//! scripts/rig-suite.sh is the list docs/testing.md gives, every name in it a test binary,
//! and scripts/test.sh's header names the stages it has.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap()
        .to_path_buf()
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The names in `suite=(...)` of scripts/rig-suite.sh.
fn rig_default_suite() -> Vec<String> {
    let s = read("scripts/rig-suite.sh");
    let line = s
        .lines()
        .find(|l| l.starts_with("suite=("))
        .expect("suite=( in scripts/rig-suite.sh");
    line.trim_start_matches("suite=(")
        .trim_end_matches(')')
        .split_whitespace()
        .map(String::from)
        .collect()
}

#[test]
fn the_rig_suite_docs_testing_md_lists_is_the_one_rig_suite_sh_runs() {
    let suite = rig_default_suite();
    assert!(!suite.is_empty());
    for name in &suite {
        assert!(
            root()
                .join(format!("tools/partition-cli/tests/{name}.rs"))
                .exists(),
            "rig-suite.sh's default suite names {name}, which is no test binary"
        );
    }
    let doc = read("docs/testing.md");
    let start = doc
        .find("By default the ones")
        .expect("docs/testing.md's default suite sentence");
    let end = start + doc[start..].find("Any other runs there").expect("its end");
    let named: Vec<&str> = doc[start..end]
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|w| {
            root()
                .join(format!("tools/partition-cli/tests/{w}.rs"))
                .exists()
        })
        .collect();
    assert_eq!(
        named, suite,
        "docs/testing.md lists {named:?} as the rig's default suite; rig-suite.sh runs {suite:?}"
    );
}

#[test]
fn scripts_test_sh_says_what_it_runs() {
    let s = read("scripts/test.sh");
    let header: String = s
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    // Each stage the script has, named in its header.
    for (stage, words) in [
        ("cargo fmt", "formatting"),
        ("cargo clippy", "lints"),
        ("--no-default-features", "no_std"),
        ("cargo test --workspace", "every test"),
        ("scripts/rig-suite.sh", "rig-suite.sh"),
        ("PARTITION_LONG_TESTS=1", "--long"),
        ("guest-image.sh", "our own kernel built first"),
    ] {
        assert!(s.contains(stage), "scripts/test.sh has no {stage:?}");
        assert!(
            header.contains(words),
            "scripts/test.sh runs {stage:?}, its header does not say so ({words:?}):\n{header}"
        );
    }
    // `--help` prints the whole header.
    let lines = header.lines().count() + 1;
    assert!(
        s.contains(&format!("sed -n '2,{lines}p'")),
        "--help prints another range than the header's lines 2-{lines}"
    );
}
