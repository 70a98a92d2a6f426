//! `probe`: the VMM's own paths from the probe guest (`probe.bench=paths`): CPUID, the
//! probe's ring-0 trap, a port read (an exit to our userspace serial device), an MMIO read
//! (an exit to our userspace virtio-mmio transport), a doorbell write (answered by an
//! ioeventfd in the kernel, or with `--no-ioeventfd` an exit), and the memory-latency
//! staircase in ring 3 against the same chase (hotpaths' `chase.rs`) on the host.
//!
//! Our partition runs on the benchmark core with 640 MiB of 2 MiB hugetlb pages (the pool's
//! page size) taken from the kernel for the section and given back after it. It is not
//! launched from a reservation: reserving the core would move every other task off it,
//! and the host side must run on that same core between guest runs. The same probe runs
//! under QEMU's microvm as the peer (its vCPU pinned to the same core, its memory
//! preallocated). Rounds alternate host, ours, ours without ioeventfd and QEMU, rotated
//! each round.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::doc::probe::{PathsRun, Peer, ProbeParams, ProbeSection, Stair};
use crate::head::{Cell, Head};

use crate::hotpaths::{self, Series};
use crate::stats::summary;
use crate::{Env, Launch, Microvm, pretty, timed_run, timed_run_with};

const GUEST_MB: u64 = 640;
/// Staircase points: 512 B to 256 MiB, doubling.
const STAIRS: usize = 20;

/// What one probe run reported: test -> median ns, and size -> ns per load.
#[derive(Debug, Default, PartialEq)]
pub struct Paths {
    /// Path timings: name -> (median, min, max) ns over repetitions.
    pub tests: BTreeMap<String, (f64, f64, f64)>,
    /// Working set -> ns per load.
    pub mem: BTreeMap<u64, f64>,
    /// The probe said "paths end" and "result ok".
    pub ok: bool,
}

/// Parses the probe's `paths` lines.
pub fn parse(stdout: &str) -> Paths {
    let mut p = Paths::default();
    let mut ended = false;
    let mut result = false;
    for l in stdout.lines() {
        let Some(rest) = l.strip_prefix("probe: ") else {
            continue;
        };
        let kv = |k: &str| {
            rest.split_whitespace()
                .find_map(|w| w.strip_prefix(k)?.strip_prefix('=')?.parse::<f64>().ok())
        };
        if let Some(t) = rest.strip_prefix("paths test=") {
            let name = t.split_whitespace().next().unwrap_or("").to_string();
            if let (Some(m), Some(a), Some(b)) = (kv("median_ns"), kv("min_ns"), kv("max_ns")) {
                p.tests.insert(name, (m, a, b));
            }
        } else if rest.starts_with("paths mem_lat ") {
            if let (Some(s), Some(ns)) = (kv("size"), kv("ns")) {
                p.mem.insert(s as u64, ns);
            }
        } else if rest.starts_with("paths end") {
            ended = true;
        } else if rest.starts_with("result ok") {
            result = true;
        }
    }
    p.ok = ended && result;
    p
}

#[derive(Default)]
struct Runs {
    tests: BTreeMap<String, Vec<f64>>,
    mem: BTreeMap<u64, Vec<f64>>,
    failures: Vec<String>,
    command: String,
}

impl Runs {
    fn add(&mut self, p: &Paths) {
        for (k, v) in &p.tests {
            self.tests.entry(k.clone()).or_default().push(v.0);
        }
        for (k, v) in &p.mem {
            self.mem.entry(*k).or_default().push(*v);
        }
    }
    fn cells(&self) -> BTreeMap<String, Cell> {
        self.tests
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), Cell::of(&summary(v)?))))
            .collect()
    }
    fn median(&self, k: &str) -> Option<f64> {
        self.tests.get(k).and_then(|v| summary(v)).map(|s| s.median)
    }
}

fn record(s: &mut Runs, r: std::io::Result<crate::Run>, ok_code: i32) {
    match r {
        Ok(r) => {
            let p = parse(&r.stdout);
            if r.status.code() == Some(ok_code) && p.ok {
                s.add(&p);
            } else {
                let tail: Vec<&str> = r
                    .stdout
                    .lines()
                    .chain(r.stderr.lines())
                    .filter(|l| l.contains("FATAL") || l.contains("error") || l.contains("FAILED"))
                    .take(3)
                    .collect();
                s.failures.push(format!(
                    "exit {:?}, paths complete {}: {}",
                    r.status.code(),
                    p.ok,
                    tail.join(" | ")
                ));
            }
        }
        Err(e) => s.failures.push(e.to_string()),
    }
}

/// Our launch of the probe for the paths benchmark.
pub fn ours_cmd(env: &Env, state: &Path, disk: &Path, ioeventfd: bool, extra: &str) -> Command {
    Launch::new(env, state, &env.core.to_string(), &format!("{GUEST_MB}M"))
        .backing("hugetlb")
        .probe()
        .disk(disk, "")
        .cmdline(&format!("probe.memtest=0 probe.bench=paths {extra}"))
        .ioeventfd(ioeventfd)
        .command()
}

fn qemu_cmd(env: &Env, probe: &Path, disk: &Path, qmp: &Path) -> Command {
    let mut c = Microvm {
        pin: None,
        smp: 1,
        mb: GUEST_MB,
        acpi: false,
        prealloc: true,
        probe,
        cmdline: "probe.memtest=0 probe.bench=paths",
    }
    .command(env);
    c.args(["-name", "paths,debug-threads=on", "-S", "-qmp"])
        .arg(format!("unix:{},server=on,wait=off", qmp.display()))
        .args(["-global", "virtio-mmio.force-legacy=false"])
        .arg("-drive")
        .arg(format!("id=d0,file={},format=raw,if=none", disk.display()))
        .args(["-device", "virtio-blk-device,drive=d0"]);
    c
}

/// Runs the section.
pub fn run(env: &Env) -> ProbeSection {
    let mut section = ProbeSection {
        head: Head::start(env),
        params: ProbeParams {
            runs: env.runs,
            core: env.core,
            guest_memory_mb: GUEST_MB,
            guest_memory: "2 MiB hugetlb pages".into(),
            host_chase_memory: "transparent huge pages (madvise)".into(),
            calls_per_repetition: 2000,
            repetitions: 11,
        },
        method: "probe.bench=paths: per path, 11 timed repetitions of 2000 calls after a discarded one, median; the memory chase is hotpaths' chase.rs in ring 3 (the host runs hotpaths --only mem_lat on the same core); rows are medians over rounds with min-max spread; rounds alternate the host, ours (ioeventfd), ours --no-ioeventfd and QEMU microvm".into(),
        ours: None,
        ours_no_ioeventfd: None,
        qemu: None,
        pio_note: None,
        mem_lat: None,
        host_failures: None,
        qemu_note: None,
    };
    let fail = |mut s: ProbeSection, why: String| {
        s.head.fail(why);
        s
    };
    let bin = match hotpaths::binary(env) {
        Ok(b) => b,
        Err(e) => return fail(section, format!("writing the hotpaths binary: {e}")),
    };
    let probe = match crate::probe_image(env) {
        Ok(p) => p,
        Err(e) => return fail(section, format!("writing the probe image: {e}")),
    };
    let disk = env.work.join("paths-disk.img");
    if let Err(e) = std::fs::File::create(&disk).and_then(|f| f.set_len(1 << 20)) {
        return fail(section, format!("{}: {e}", disk.display()));
    }
    let state = env.work.join("probe-state");
    let Some(hugepages) = crate::HugepageCount::grow(GUEST_MB / 2) else {
        return fail(
            section,
            format!(
                "the kernel could not find {} free 2 MiB hugepages",
                GUEST_MB / 2
            ),
        );
    };

    let mut host = Series::default();
    let mut ours = Runs::default();
    let mut exit = Runs::default();
    let mut qemu = Runs::default();
    let qmp = env.work.join("paths-qmp.sock");
    let mut jobs = vec!["host", "ours", "ours-exit"];
    if env.qemu.is_some() {
        jobs.push("qemu");
    }
    for round in 0..env.runs {
        let mut order = jobs.clone();
        order.rotate_left(round % jobs.len());
        for job in order {
            match job {
                "host" => {
                    let cpu = env.core.to_string();
                    match hotpaths::run_host(
                        &bin,
                        &["--cpus", &cpu, "--only", "mem_lat", "--runs", "1"],
                        &env.work,
                    ) {
                        Ok(r) => host.add(&r),
                        Err(e) => host.failures.push(e),
                    }
                }
                "ours" => {
                    let c = ours_cmd(env, &state, &disk, true, "");
                    ours.command = pretty(&c);
                    record(&mut ours, timed_run(c, Duration::from_secs(300)), 0);
                }
                "ours-exit" => {
                    let c = ours_cmd(env, &state, &disk, false, "probe.paths_max_mem=0");
                    exit.command = pretty(&c);
                    record(&mut exit, timed_run(c, Duration::from_secs(300)), 0);
                }
                _ => {
                    let _ = std::fs::remove_file(&qmp);
                    let c = qemu_cmd(env, &probe, &disk, &qmp);
                    qemu.command = pretty(&c);
                    let (core, hc) = (env.core, env.host_core);
                    let r = timed_run_with(c, Duration::from_secs(300), |pid| {
                        crate::placement::pin_and_start_qemu(pid, &qmp, core, hc)
                    });
                    record(&mut qemu, r, 1);
                }
            }
        }
    }
    let _ = std::fs::remove_file(&qmp);
    drop(hugepages);

    // The exits, and the staircase against the host.
    let pio = |r: &Runs| {
        r.median("pio_in").or_else(|| {
            Some(r.median("pio_in_service")? - r.median("service")?).map(|d| d.max(0.0))
        })
    };
    let ran = |r: &Runs| PathsRun {
        paths_ns: r.cells(),
        pio_exit_ns: pio(r),
        command: r.command.clone(),
        failures: r.failures.clone(),
    };
    section.ours = Some(ran(&ours));
    section.ours_no_ioeventfd = Some(ran(&exit));
    section.qemu = Some(if env.qemu.is_some() {
        Peer::Ran(ran(&qemu))
    } else {
        Peer::Note(format!("{}: no peer rows", env.qemu_absent()))
    });
    section.pio_note = Some(
        "pio_in is `in` executed in ring 3 (IOPL 3). Where the hypervisor refuses ring-3 port I/O (#GP; the nested kvm_pvm host does), the probe times pio_in_service (the same `in` through its ring-0 service) and pio_exit_ns is pio_in_service - service.".into(),
    );
    let stairs = ours
        .mem
        .iter()
        .map(|(size, v)| {
            let g = summary(v);
            let h = host
                .values
                .get(&format!("mem_lat_{size}"))
                .and_then(|(_, v)| summary(v));
            let q = qemu.mem.get(size).and_then(|v| summary(v));
            Stair {
                bytes: *size,
                guest_ns: g.map(|s| s.median),
                guest_spread: g.map(|s| [s.min, s.max]),
                host_ns: h.map(|s| s.median),
                host_spread: h.map(|s| [s.min, s.max]),
                guest_over_host: match (g, h) {
                    (Some(g), Some(h)) if h.median > 0.0 => Some(g.median / h.median),
                    _ => None,
                },
                qemu_ns: q.map(|s| s.median),
            }
        })
        .collect();
    section.mem_lat = Some(stairs);
    section.host_failures = Some(host.failures.clone());
    let full = |r: &Runs| {
        r.failures.is_empty() && r.tests.get("cpuid").is_some_and(|v| v.len() == env.runs)
    };
    let complete = full(&ours)
        && full(&exit)
        && host.failures.is_empty()
        && host.runs("mem_lat_512") == env.runs
        && ours.mem.len() == STAIRS;
    if !qemu.failures.is_empty() {
        section.qemu_note = Some(format!("QEMU runs failed: {:?}", qemu.failures));
    }
    let _ = std::fs::remove_file(&disk);
    section.head.finish(complete, || {
        format!(
            "ours: {:?}; --no-ioeventfd: {:?}; host: {:?}; staircase points {}",
            ours.failures,
            exit.failures,
            host.failures,
            ours.mem.len()
        )
    });
    section
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_paths_lines() {
        let out = "probe: paths start n=2000 tries=11\n\
                   probe: paths test=cpuid n=2000 median_ns=2980 min_ns=969 max_ns=4219\n\
                   probe: paths test=mmio_read n=2000 median_ns=23163 min_ns=19102 max_ns=39386\n\
                   probe: paths mem_lat size=512 ns=1.232\n\
                   probe: paths mem_lat size=268435456 ns=307.297\n\
                   probe: paths end\nprobe: result ok status=0\n";
        let p = parse(out);
        assert!(p.ok);
        assert_eq!(p.tests["cpuid"], (2980.0, 969.0, 4219.0));
        assert_eq!(p.mem[&512], 1.232);
        assert_eq!(p.mem[&268435456], 307.297);
        assert!(!parse("probe: paths test=cpuid median_ns=1 min_ns=1 max_ns=1\n").ok);
    }
}
