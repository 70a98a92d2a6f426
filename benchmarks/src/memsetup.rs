//! `memsetup`: how long from launch to the guest's first serial byte, and how much of that is
//! getting the guest's memory, for memory from the reserved pool against fresh memory.
//!
//! Sources, all booting the same probe guest with `probe.memtest=0` (it speaks as soon as it
//! has parsed its boot information):
//! - `pool`: `partition launch --name` on a pool extent (mmap + MAP_POPULATE of pages that
//!   already exist);
//! - `anon-prefault`: fresh anonymous memory with MAP_POPULATE (`--backing prefault`);
//! - `hugetlb`: fresh MAP_HUGETLB | MAP_POPULATE from the kernel's free hugepages (grown
//!   before and shrunk after each run, outside the timed part);
//! - `qemu`: `qemu-system-x86_64 -M microvm -mem-prealloc`, the probe booted through PVH.
//!
//! Time to first byte is measured from `spawn` to the first byte on the VMM's stdout;
//! the memory part comes from our VMM's own `--timings` (QEMU has no such report: null).
//! One warm-up round is discarded; the sources then alternate, in an order rotated every
//! round. Every launcher runs on the host core; the pool partition's vCPU runs on the
//! reserved core (a pool partition can run nowhere else), the others' on the host core.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::stats::summary;
use crate::{Env, HugepageCount, Microvm, failed, ms, now_utc, provenance, timed_run, timing};

/// The memory sources compared.
pub const SOURCES: [&str; 4] = ["pool", "anon-prefault", "hugetlb", "qemu"];
const HUGEPAGE: u64 = 2 << 20;

/// Sizes measured.
pub fn default_sizes() -> Vec<u64> {
    vec![256 << 20, 1 << 30, 4 << 30, 8 << 30]
}

fn launch_cmd(env: &Env, state: &Path, source: &str, size: u64, probe: &Path) -> Command {
    let mb = (size >> 20).to_string();
    match source {
        "qemu" => Microvm {
            pin: Some(env.host_core.to_string()),
            smp: 1,
            mb: size >> 20,
            acpi: true,
            prealloc: true,
            probe,
            cmdline: "probe.memtest=0",
        }
        .command(env),
        _ => {
            let mut c = Command::new(&env.partition);
            c.env("PARTITION_STATE_DIR", state).arg("launch");
            match source {
                "pool" => c.args(["--name", "memsetup", "--cores", &env.core.to_string()]),
                "anon-prefault" => c.args([
                    "--cores",
                    &env.host_core.to_string(),
                    "--backing",
                    "prefault",
                ]),
                _ => c.args([
                    "--cores",
                    &env.host_core.to_string(),
                    "--backing",
                    "hugetlb",
                ]),
            };
            c.args([
                "--memory",
                &format!("{mb}M"),
                "--probe",
                "--cmdline",
                "probe.memtest=0",
                "--timings",
            ]);
            c
        }
    }
}

fn ok(source: &str, status: std::process::ExitStatus) -> bool {
    match source {
        // isa-debug-exit: status s exits with (s << 1) | 1.
        "qemu" => status.code() == Some(1),
        _ => status.success(),
    }
}

/// Runs the section.
pub fn run(env: &Env, sizes: &[u64]) -> Value {
    let started_at = now_utc();
    let prov = provenance(env);
    let mut section = json!({
        "completed": false,
        "started_at": started_at,
        "provenance": prov,
        "method": "time from spawn to the first byte of the guest's serial output; memory part \
                   from the VMM's --timings (mmap + prefault); one discarded warm-up round, then \
                   rounds alternating the sources in a rotated order; probe guest with \
                   probe.memtest=0",
        "params": { "sizes_bytes": sizes, "runs": env.runs, "sources": SOURCES,
                    "reserved_core": env.core, "host_core": env.host_core },
    });
    let probe = match crate::probe_image(env) {
        Ok(p) => p,
        Err(e) => return failed(section, format!("writing the probe image: {e}")),
    };
    let max = sizes.iter().copied().max().unwrap_or(0);
    let state = env.work.join("state");
    let r = Command::new(&env.partition)
        .env("PARTITION_STATE_DIR", &state)
        .args([
            "reserve",
            "--memory",
            &format!("{}M", max >> 20),
            "--cores",
            &env.core.to_string(),
        ])
        .output();
    let reserve_stderr = r
        .as_ref()
        .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
        .unwrap_or_default();
    if !r.as_ref().is_ok_and(|o| o.status.success()) {
        return failed(
            section,
            format!(
                "reserving a {} MiB pool failed: {}",
                max >> 20,
                reserve_stderr.trim()
            ),
        );
    }
    let prealloc_s = reserve_stderr
        .split("preallocated in ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse::<f64>().ok());
    section["pool_preallocation"] = json!({ "bytes": max, "seconds": prealloc_s });

    let sources: Vec<&str> = SOURCES
        .iter()
        .copied()
        .filter(|s| *s != "qemu" || env.qemu.is_some())
        .collect();
    if env.qemu.is_none() {
        section["qemu_note"] = json!("qemu-system-x86_64 not found: no peer rows");
    }
    let base = HugepageCount::read();
    // Puts the count back to `base` (the pool's own pages) however the loop ends; it must
    // go before unreserve, which gives the pool's pages back.
    let restore = HugepageCount(base.to_string());
    // (source, size) -> (first byte ms, memory ms)
    let mut samples: BTreeMap<(String, u64), (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    let mut failures = Vec::new();
    for round in 0..=env.runs {
        let mut order = sources.clone();
        let n = order.len();
        order.rotate_left(round % n);
        for &size in sizes {
            for &source in &order {
                if source == "hugetlb" {
                    let want = base + size / HUGEPAGE;
                    if HugepageCount::set(want) < want {
                        failures.push(format!(
                            "hugetlb {size}: the kernel would not give {} more hugepages",
                            size / HUGEPAGE
                        ));
                        HugepageCount::set(base);
                        continue;
                    }
                }
                let r = timed_run(
                    launch_cmd(env, &state, source, size, &probe),
                    Duration::from_secs(300),
                );
                if source == "hugetlb" {
                    HugepageCount::set(base);
                }
                match r {
                    Ok(r) if ok(source, r.status) && r.first_byte.is_some() => {
                        if round == 0 {
                            continue; // warm-up
                        }
                        let e = samples.entry((source.to_string(), size)).or_default();
                        e.0.push(ms(r.first_byte.unwrap_or_default()));
                        if let Some(m) = timing(&r.stderr, "memory_ms") {
                            e.1.push(m);
                        }
                    }
                    Ok(r) => failures.push(format!(
                        "{source} {} MiB round {round}: exit {:?}: {}",
                        size >> 20,
                        r.status.code(),
                        r.stderr.lines().last().unwrap_or("")
                    )),
                    Err(e) => failures.push(format!("{source} {} MiB: {e}", size >> 20)),
                }
            }
        }
    }
    drop(restore);
    let _ = Command::new(&env.partition)
        .env("PARTITION_STATE_DIR", &state)
        .arg("unreserve")
        .output();

    let mut rows = Vec::new();
    for ((source, size), (fb, mem)) in &samples {
        rows.push(json!({
            "source": source,
            "size_bytes": size,
            "first_byte_ms": summary(fb),
            "memory_ms": summary(mem),
            "runs_first_byte_ms": fb,
            "runs_memory_ms": mem,
        }));
    }
    let med = |source: &str, size: u64, which: usize| {
        samples
            .get(&(source.to_string(), size))
            .and_then(|(a, b)| summary(if which == 0 { a } else { b }).map(|s| s.median))
    };
    let small = sizes.iter().copied().min().unwrap_or(0);
    let first_ratio = med("pool", max, 0)
        .zip(med("pool", small, 0))
        .map(|(a, b)| a / b);
    let mem_ratio = med("anon-prefault", max, 1)
        .zip(med("pool", max, 1))
        .map(|(a, b)| a / b);
    section["rows"] = json!(rows);
    section["checks"] = json!({
        "pool_first_byte_largest_over_smallest": first_ratio,
        "pool_first_byte_within_1_5x": first_ratio.map(|r| r <= 1.5),
        "anon_prefault_memory_over_pool_memory_at_largest": mem_ratio,
        "pool_memory_at_least_100x_smaller": mem_ratio.map(|r| r >= 100.0),
    });
    section["failures"] = json!(failures);
    let expected = sources.len() * sizes.len();
    section["completed"] =
        json!(samples.len() == expected && samples.values().all(|(a, _)| a.len() == env.runs));
    if section["completed"] == json!(false) {
        section["reason"] = json!(format!(
            "{} of {} configurations measured fully; failures: {:?}",
            samples
                .values()
                .filter(|(a, _)| a.len() == env.runs)
                .count(),
            expected,
            failures
        ));
    }
    section["finished_at"] = json!(now_utc());
    section
}
