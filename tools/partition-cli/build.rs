//! Builds the two programs the CLI embeds, each a separate cargo workspace with its own
//! profile, by a nested cargo: the probe guest (tools/probe-guest, freestanding, its own
//! linker script) and hotpaths (benchmarks/hotpaths, a static binary for hosts and Linux
//! guests). The probe shares hotpaths' memory chase (`src/chase.rs`).

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

/// `cargo build --release` in `dir` into `target` for `triple`, in a clean environment:
/// the outer build's flags, wrappers (clippy) and target directory must not leak in. The
/// target is named explicitly (as the repository's .cargo/config.toml names it, so that
/// its flags stay off build scripts): the binaries are under `target/triple/release/`.
fn nested_build(dir: &Path, target: &Path, triple: &str, offline: bool) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(dir)
        .args([
            "build",
            "--release",
            "--locked",
            "--target",
            triple,
            "--target-dir",
        ])
        .arg(target)
        .env_clear();
    if offline {
        cmd.arg("--offline");
    }
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
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("running cargo in {}: {e}", dir.display()));
    assert!(status.success(), "building {} failed", dir.display());
}

/// How the `partition` binary is linked, for a lean start (docs/architecture.md, "Building"):
/// `launch-order.ld` gathers the functions a launch runs ahead of the rest of `.text`, so
/// they fill a few pages instead of touching most of them; relative relocations are packed
/// (RELR), so the start-up relocates from a 2.6 KiB bitmap instead of a 228 KiB table.
fn link_args(manifest: &Path) {
    let order = manifest.join("launch-order.ld");
    println!("cargo:rerun-if-changed={}", order.display());
    println!("cargo:rustc-link-arg-bins=-Wl,-T,{}", order.display());
    println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
}

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    link_args(&manifest);
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    // What this crate is built for, so what the programs it embeds are built for.
    let triple = std::env::var("TARGET").expect("TARGET");
    let probe = manifest.join("../probe-guest");
    let hotpaths = manifest.join("../../benchmarks/hotpaths");
    watch(&probe);
    watch(&hotpaths);

    let target = out.join("probe-target");
    nested_build(&probe, &target, &triple, true);
    std::fs::copy(
        target.join(&triple).join("release/probe-guest"),
        out.join("probe-guest.elf"),
    )
    .expect("copying the probe guest ELF");

    // hotpaths depends on libc from crates.io: not offline.
    let target = out.join("hotpaths-target");
    nested_build(&hotpaths, &target, &triple, false);
    std::fs::copy(
        target.join(&triple).join("release/hotpaths"),
        out.join("hotpaths"),
    )
    .expect("copying the hotpaths binary");
}
