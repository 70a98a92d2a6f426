//! Builds the probe guest (tools/probe-guest, a freestanding crate with its own profile and
//! linker script) with a nested cargo and hands its ELF to the CLI, which embeds it.

use std::path::{Path, PathBuf};
use std::process::Command;

fn watch(dir: &Path) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = entry.path();
        if p.file_name().is_some_and(|n| n == "target") {
            continue;
        }
        if p.is_dir() {
            watch(&p);
        } else {
            println!("cargo:rerun-if-changed={}", p.display());
        }
    }
}

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let probe = manifest.join("../probe-guest");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let target = out.join("probe-target");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    watch(&probe);

    let mut cmd = Command::new(cargo);
    cmd.current_dir(&probe)
        .args([
            "build",
            "--release",
            "--offline",
            "--locked",
            "--target-dir",
        ])
        .arg(&target)
        // A clean environment: the outer build's flags, wrappers (clippy) and target
        // directory must not leak into the freestanding build.
        .env_clear();
    for var in [
        "PATH",
        "HOME",
        "CARGO_HOME",
        "RUSTUP_HOME",
        "RUSTUP_TOOLCHAIN",
        "RUSTC",
    ] {
        if let Ok(v) = std::env::var(var) {
            cmd.env(var, v);
        }
    }
    let status = cmd.status().expect("running cargo for the probe guest");
    assert!(status.success(), "building tools/probe-guest failed");
    let elf = target.join("release/probe-guest");
    std::fs::copy(&elf, out.join("probe-guest.elf")).expect("copying the probe guest ELF");
}
