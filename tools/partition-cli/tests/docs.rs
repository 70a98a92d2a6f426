//! What the docs say CI runs is what the scripts run: the rig's default suite in
//! scripts/rig-suite.sh is the list docs/testing.md gives, every name in it a test binary,
//! the binaries it runs under multi-threaded TCG are the ones docs/testing.md names, and
//! scripts/test.sh's header names the stages it has.

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

/// The names in `VAR=(...)` of scripts/rig-suite.sh.
fn rig_list(var: &str) -> Vec<String> {
    let s = read("scripts/rig-suite.sh");
    let start = format!("{var}=(");
    let line = s
        .lines()
        .find(|l| l.starts_with(&start))
        .unwrap_or_else(|| panic!("{start} in scripts/rig-suite.sh"));
    line.trim_start_matches(&start)
        .trim_end_matches(')')
        .split_whitespace()
        .map(String::from)
        .collect()
}

fn rig_default_suite() -> Vec<String> {
    rig_list("suite")
}

/// The binaries rig-suite.sh runs under multi-threaded TCG are the ones docs/testing.md
/// names for it, and each is in the default suite.
#[test]
fn the_tcg_mode_of_each_rig_binary_is_the_one_docs_testing_md_gives() {
    let multi = rig_list("multi_binaries");
    let suite = rig_default_suite();
    let doc = read("docs/testing.md");
    let start = doc
        .find("`rig-suite.sh` picks it per test")
        .expect("docs/testing.md's TCG threading sentence");
    let end = start + doc[start..].find("every other binary").expect("its end");
    let named: Vec<&str> = doc[start..end]
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|w| suite.iter().any(|s| s == w))
        .collect();
    assert!(!multi.is_empty());
    assert_eq!(
        named, multi,
        "docs/testing.md puts {named:?} under multi-threaded TCG; rig-suite.sh puts {multi:?}"
    );
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
        ("guest-image.sh", "build our own guest kernel"),
        (
            "linux_kernel::our_guest_bzimage_reaches_userspace",
            "SYSCALL repair",
        ),
        ("validate-manifests.sh", "Kubernetes schemas"),
        ("PARTITION_MUST_RUN=cri", "containerd's CRI"),
        ("irqbalance_bin", "irqbalance"),
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

/// The pod in docs/deploy/ gets /dev/kvm the way a real node grants it: as the device
/// plugin's resource (a CRI Device), never as a hostPath volume (a plain mount that the
/// runtime's device controller refuses to open), and the plugin offers that resource.
#[test]
fn the_deploy_manifests_grant_kvm_through_the_device_plugin() {
    let pod = read("docs/deploy/partition-pod.yaml");
    let plugin = read("docs/deploy/kvm-device-plugin.yaml");
    for (name, text) in [
        ("partition-pod.yaml", &pod),
        ("kvm-device-plugin.yaml", &plugin),
    ] {
        for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
            assert!(
                !(line.contains("hostPath") && line.contains("/dev/kvm")),
                "{name} mounts /dev/kvm as a hostPath: {line}"
            );
            assert!(
                !line.contains("mountPath: /dev/kvm"),
                "{name} mounts a volume at /dev/kvm: {line}"
            );
        }
    }
    let limits = pod
        .lines()
        .find(|l| l.trim_start().starts_with("limits:"))
        .expect("the pod's limits");
    assert!(limits.contains("squat.ai/kvm: \"1\""), "{limits}");
    // The plugin's default domain is squat.ai; its device is named kvm and is /dev/kvm.
    assert!(
        plugin.contains(
            r#"{"name": "kvm", "groups": [{"count": 64, "paths": [{"path": "/dev/kvm"}]}]}"#
        ),
        "kvm-device-plugin.yaml does not offer /dev/kvm as kvm"
    );
    assert!(
        !plugin.contains("--domain"),
        "the resource name would not be squat.ai/kvm"
    );
    // The flags the pod passes are the ones tests/cri.rs ran through containerd.
    for flag in [
        "--cores=from-cgroup",
        "--kubelet-cpu-state=/var/lib/kubelet/cpu_manager_state",
        "--memory-from=/hugepages",
        "--api-socket=/run/partition-api/api.sock",
        "--state-dir=/run/partition-state",
    ] {
        assert!(pod.contains(flag), "the pod no longer passes {flag}");
    }
    let cri = read("tools/partition-cli/tests/cri.rs");
    assert!(
        cri.contains(r#"["SETUID", "SETGID", "CHOWN", "DAC_OVERRIDE"]"#)
            && pod.contains(r#"add: ["SETUID", "SETGID", "CHOWN", "DAC_OVERRIDE"]"#),
        "the pod's capabilities differ from those the CRI test ran with"
    );
}
