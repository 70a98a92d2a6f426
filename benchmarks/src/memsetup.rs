//! `memsetup`: how long from launch to the guest's first serial byte, and how much of that is
//! getting the guest's memory, for memory from the reserved pool against fresh memory.
//!
//! Sources, all booting the same probe guest with `probe.memtest=0` (it speaks as soon as it
//! has parsed its boot information):
//! - `pool`: `partition launch --name` on a pool extent (mmap + MAP_POPULATE of pages that
//!   already exist);
//! - `anon-prefault`: fresh anonymous memory with MAP_POPULATE (`--backing prefault`);
//! - `anonymous`: fresh anonymous memory the guest faults in as it touches it (the ad hoc
//!   launch's default, `--backing anonymous`; Firecracker's way without hugepages);
//! - `hugetlb`: fresh MAP_HUGETLB | MAP_POPULATE from the kernel's free hugepages (grown
//!   before and shrunk after each run, outside the timed part);
//! - `qemu`: `qemu-system-x86_64 -M microvm -mem-prealloc`, the probe booted through PVH;
//! - `qemu-hugetlbfs`: the strongest QEMU setup for the same job, guest memory from
//!   preallocated 2 MiB hugepages (`-object memory-backend-file,mem-path=<hugetlbfs
//!   mount>,prealloc=on`; the pages are taken from the kernel before and given back after
//!   each run, outside the timed part, as for `hugetlb`);
//! - `cloud-hypervisor`, `cloud-hypervisor-hugepages`: Cloud Hypervisor (`--memory
//!   size=..,prefault=on`, and `hugepages=on,hugepage_size=2M`), when given ([`crate::peers`]);
//! - `firecracker`, `firecracker-hugepages`: Firecracker (`--no-api --config-file`, and
//!   `"huge_pages": "2M"`), when given. Both boot the probe through its PVH note.
//!
//! Time to first byte is measured from `spawn` to the first byte on the VMM's stdout;
//! the memory part comes from our VMM's own report (`--json` timings; QEMU has no such
//! report: null).
//! The VMM's own cost per launch, as Firecracker's specification counts it: at the first
//! byte, the CPU time of all the VMM's threads since exec (`/proc/PID/task/*/schedstat`;
//! its vCPU thread's guest time so far is in it) and its resident set (`VmRSS`; guest
//! memory on hugepages is `HugetlbPages` instead, recorded beside it).
//! One warm-up round is discarded; the sources then alternate, in an order rotated every
//! round. Every launcher runs on the host core; the pool partition's vCPU runs on the
//! reserved core (a pool partition can run nowhere else), the others' on the host core.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::doc::memsetup::{
    MemSetupChecks, MemSetupParams, MemSetupRow, MemSetupSection, PEER_GOAL, PeerGoals,
    PoolPreallocation,
};
use crate::head::Head;
use crate::peers::{Peer, PeerBoot};
use crate::stats::summary;
use crate::{Env, HugepageCount, Launch, Microvm, ms, timed_run};

/// The sources that are `partition launch`'s own (the rest are peer VMMs').
pub const OURS: [&str; 4] = ["pool", "anon-prefault", "anonymous", "hugetlb"];

/// The memory sources compared.
pub const SOURCES: [&str; 10] = [
    "pool",
    "anon-prefault",
    "anonymous",
    "hugetlb",
    "qemu",
    "qemu-hugetlbfs",
    "cloud-hypervisor",
    "cloud-hypervisor-hugepages",
    "firecracker",
    "firecracker-hugepages",
];
const HUGEPAGE: u64 = 2 << 20;

/// Sizes measured.
pub fn default_sizes() -> Vec<u64> {
    vec![256 << 20, 1 << 30, 4 << 30, 8 << 30]
}

/// Whether `source` takes its pages from the kernel's free hugepages for each run.
fn takes_hugepages(source: &str) -> bool {
    matches!(source, "hugetlb" | "qemu-hugetlbfs") || source.ends_with("-hugepages")
}

fn launch_cmd(
    env: &Env,
    state: &Path,
    source: &str,
    size: u64,
    probe: &Path,
    hugetlbfs: &Path,
) -> Option<Command> {
    let mb = (size >> 20).to_string();
    if let Some(peer) = Peer::from_source(source) {
        return PeerBoot {
            peer,
            pin: Some(env.host_core.to_string()),
            vcpus: 1,
            mb: size >> 20,
            hugepages: takes_hugepages(source),
            probe,
            cmdline: "probe.memtest=0",
            disk: None,
        }
        .command(env, &env.work);
    }
    Some(match source {
        "qemu" | "qemu-hugetlbfs" => {
            let hugepages = source == "qemu-hugetlbfs";
            let mut c = Microvm {
                pin: Some(env.host_core.to_string()),
                smp: 1,
                mb: size >> 20,
                acpi: true,
                prealloc: !hugepages,
                probe,
                cmdline: "probe.memtest=0",
            }
            .command(env);
            if hugepages {
                c.args([
                    "-object",
                    &format!(
                        "memory-backend-file,id=ram,size={mb}M,mem-path={},prealloc=on,share=off",
                        hugetlbfs.display()
                    ),
                    "-machine",
                    "memory-backend=ram",
                ]);
            }
            c
        }
        _ => {
            let memory = format!("{mb}M");
            let l = match source {
                "pool" => Launch::new(env, state, &env.core.to_string(), &memory).name("memsetup"),
                "anon-prefault" => {
                    Launch::new(env, state, &env.host_core.to_string(), &memory).backing("prefault")
                }
                "anonymous" => Launch::new(env, state, &env.host_core.to_string(), &memory)
                    .backing("anonymous"),
                _ => {
                    Launch::new(env, state, &env.host_core.to_string(), &memory).backing("hugetlb")
                }
            };
            l.probe().cmdline("probe.memtest=0").json().command()
        }
    })
}

fn ok(source: &str, status: std::process::ExitStatus) -> bool {
    match source {
        // isa-debug-exit: status s exits with (s << 1) | 1.
        "qemu" | "qemu-hugetlbfs" => status.code() == Some(1),
        // Ours, and the peers, which exit 0 when the probe powers off.
        _ => status.success(),
    }
}

pub fn run(env: &Env, sizes: &[u64]) -> MemSetupSection {
    // Each peer's --version and checkout are read once, for the provenance and the rows.
    let peers = crate::peers::infos(env);
    let mut section = MemSetupSection {
        head: Head::start_with_peers(env, &peers),
        method: "time from spawn to the first byte of the guest's serial output; memory part \
                 from the VMM's --json report (mmap + prefault); at the first byte, the VMM \
                 process's CPU time (all threads, /proc/PID/task/*/schedstat) and its VmRSS \
                 and HugetlbPages; one discarded warm-up round, then rounds alternating the \
                 sources in a rotated order; probe guest with probe.memtest=0"
            .into(),
        params: MemSetupParams {
            sizes_bytes: sizes.to_vec(),
            runs: env.runs,
            sources: SOURCES.iter().map(|s| s.to_string()).collect(),
            reserved_core: env.core,
            host_core: env.host_core,
        },
        pool_preallocation: None,
        qemu_note: None,
        qemu_hugetlbfs_note: None,
        peers,
        rows: None,
        checks: None,
        against_peers: Vec::new(),
        failures: None,
    };
    let probe = match crate::probe_image(env) {
        Ok(p) => p,
        Err(e) => {
            section.head.fail(format!("writing the probe image: {e}"));
            return section;
        }
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
        section.head.fail(format!(
            "reserving a {} MiB pool failed: {}",
            max >> 20,
            reserve_stderr.trim()
        ));
        return section;
    }
    let prealloc_s = reserve_stderr
        .split("preallocated in ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse::<f64>().ok());
    section.pool_preallocation = Some(PoolPreallocation {
        bytes: max,
        seconds: prealloc_s,
    });

    let mut sources: Vec<&str> = SOURCES
        .iter()
        .copied()
        .filter(|s| !s.starts_with("qemu") || env.qemu.is_some())
        .filter(|s| Peer::from_source(s).is_none_or(|p| p.binary(env).is_some()))
        .collect();
    if env.qemu.is_none() {
        section.qemu_note = Some("qemu-system-x86_64 not found: no peer rows".into());
    }
    // QEMU's hugepage backend needs a hugetlbfs mount of its own (in the scratch directory,
    // which the bench supervisor unmounts if this run dies).
    let hugetlbfs = env.work.join("qemu-hugetlbfs");
    let mounted = sources.contains(&"qemu-hugetlbfs") && {
        let _ = std::fs::create_dir_all(&hugetlbfs);
        match mount_hugetlbfs(&hugetlbfs) {
            Ok(()) => true,
            Err(e) => {
                section.qemu_hugetlbfs_note = Some(format!(
                    "mounting hugetlbfs at {}: {e}",
                    hugetlbfs.display()
                ));
                false
            }
        }
    };
    if !mounted {
        sources.retain(|s| *s != "qemu-hugetlbfs");
    }
    section.params.sources = sources.iter().map(|s| s.to_string()).collect();
    let base = HugepageCount::read();
    // Puts the count back to `base` (the pool's own pages) however the loop ends; it must
    // go before unreserve, which gives the pool's pages back.
    let restore = HugepageCount(base.to_string());
    // (source, size) -> per-run values
    let mut samples: BTreeMap<(String, u64), Samples> = BTreeMap::new();
    let mut failures = Vec::new();
    for round in 0..=env.runs {
        let mut order = sources.clone();
        let n = order.len();
        order.rotate_left(round % n);
        for &size in sizes {
            for &source in &order {
                if takes_hugepages(source) {
                    let want = base + size / HUGEPAGE;
                    if HugepageCount::set(want) < want {
                        failures.push(format!(
                            "{source} {size}: the kernel would not give {} more hugepages",
                            size / HUGEPAGE
                        ));
                        HugepageCount::set(base);
                        continue;
                    }
                }
                let Some(mut cmd) = launch_cmd(env, &state, source, size, &probe, &hugetlbfs)
                else {
                    HugepageCount::set(base);
                    continue;
                };
                if !source.starts_with("qemu") && Peer::from_source(source).is_none() {
                    // The timeline then starts at the spawn: exec and loading are a phase.
                    cmd.env(
                        partition::sys::timeline::EXEC_ENV,
                        partition::sys::timeline::monotonic_ns().to_string(),
                    );
                }
                let r = timed_run(cmd, Duration::from_secs(300));
                if source == "qemu-hugetlbfs" {
                    // QEMU unlinks its backing file; whatever is left goes before the pages do.
                    clear_dir(&hugetlbfs);
                }
                if takes_hugepages(source) {
                    HugepageCount::set(base);
                }
                match r {
                    Ok(r) if ok(source, r.status) && r.first_byte.is_some() => {
                        if round == 0 {
                            continue; // warm-up
                        }
                        let e = samples.entry((source.to_string(), size)).or_default();
                        e.first_byte.push(ms(r.first_byte.unwrap_or_default()));
                        if let Ok(j) = crate::LaunchJson::from_stdout(&r.stdout) {
                            e.memory.push(j.timings.memory_ms);
                            e.add_timeline(&j.timings.timeline);
                        }
                        if let Some(p) = r.at_first_byte {
                            e.cpu.push(p.cpu_ns as f64 / 1e6);
                            e.rss.push(p.rss_kib as f64);
                            e.hugetlb.push(p.hugetlb_kib as f64);
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
    if mounted {
        if let Err(e) = umount(&hugetlbfs) {
            failures.push(format!("unmounting {}: {e}", hugetlbfs.display()));
        }
        let _ = std::fs::remove_dir(&hugetlbfs);
    }
    let _ = Command::new(&env.partition)
        .env("PARTITION_STATE_DIR", &state)
        .arg("unreserve")
        .output();

    let rows: Vec<MemSetupRow> = samples
        .iter()
        .map(|((source, size), v)| MemSetupRow {
            source: source.clone(),
            size_bytes: *size,
            first_byte_ms: summary(&v.first_byte),
            memory_ms: summary(&v.memory),
            vmm_cpu_ms_at_first_byte: summary(&v.cpu),
            vmm_rss_kib_at_first_byte: summary(&v.rss),
            vmm_hugetlb_kib_at_first_byte: summary(&v.hugetlb),
            guest_memory_kib: size >> 10,
            runs_first_byte_ms: v.first_byte.clone(),
            runs_memory_ms: v.memory.clone(),
            runs_vmm_cpu_ms: v.cpu.clone(),
            runs_vmm_rss_kib: v.rss.clone(),
            runs_timeline_ms: v.timeline.clone(),
            runs_timeline_cpu_ms: v.timeline_cpu.clone(),
        })
        .collect();
    let med = |source: &str, size: u64, which: usize| {
        samples.get(&(source.to_string(), size)).and_then(|v| {
            summary(if which == 0 { &v.first_byte } else { &v.memory }).map(|s| s.median)
        })
    };
    let small = sizes.iter().copied().min().unwrap_or(0);
    let first_ratio = med("pool", max, 0)
        .zip(med("pool", small, 0))
        .map(|(a, b)| a / b);
    let mem_ratio = med("anon-prefault", max, 1)
        .zip(med("pool", max, 1))
        .map(|(a, b)| a / b);
    section.against_peers = peer_goals(&rows);
    section.rows = Some(rows);
    section.checks = Some(MemSetupChecks {
        pool_first_byte_largest_over_smallest: first_ratio,
        pool_first_byte_within_1_5x: first_ratio.map(|r| r <= 1.5),
        anon_prefault_memory_over_pool_memory_at_largest: mem_ratio,
        pool_memory_at_least_100x_smaller: mem_ratio.map(|r| r >= 100.0),
    });
    let expected = sources.len() * sizes.len();
    let full = samples
        .values()
        .filter(|v| v.first_byte.len() == env.runs)
        .count();
    let complete = samples.len() == expected && full == samples.len();
    section.head.finish(complete, || {
        format!("{full} of {expected} configurations measured fully; failures: {failures:?}")
    });
    section.failures = Some(failures);
    section
}

/// Our pool and ad hoc (`anonymous`) launches against the peers' best, at every size where
/// both ours and a peer (Cloud Hypervisor's or Firecracker's) have a median.
fn peer_goals(rows: &[MemSetupRow]) -> Vec<PeerGoals> {
    let mut out = Vec::new();
    for ours in ["pool", "anonymous"] {
        for r in rows.iter().filter(|r| r.source == ours) {
            let peers: Vec<&MemSetupRow> = rows
                .iter()
                .filter(|p| p.size_bytes == r.size_bytes && Peer::from_source(&p.source).is_some())
                .collect();
            // The peer row with the lowest median of `pick`.
            let best = |pick: fn(&MemSetupRow) -> Option<f64>, among: &[&MemSetupRow]| {
                among
                    .iter()
                    .filter_map(|p| Some((p.source.clone(), pick(p)?)))
                    .min_by(|a, b| a.1.total_cmp(&b.1))
            };
            let first = |r: &MemSetupRow| r.first_byte_ms.map(|s| s.median);
            let cpu = |r: &MemSetupRow| r.vmm_cpu_ms_at_first_byte.map(|s| s.median);
            let rss = |r: &MemSetupRow| r.vmm_rss_kib_at_first_byte.map(|s| s.median);
            let (Some((fastest, peer_first)), Some((lowest, peer_cpu)), Some(f), Some(c)) =
                (best(first, &peers), best(cpu, &peers), first(r), cpu(r))
            else {
                continue;
            };
            let firecracker: Vec<&MemSetupRow> = peers
                .iter()
                .copied()
                .filter(|p| Peer::from_source(&p.source) == Some(Peer::Firecracker))
                .collect();
            let rss_over = best(rss, &firecracker)
                .zip(rss(r))
                .map(|((_, theirs), ours)| ours / theirs);
            let (first_over, cpu_over) = (f / peer_first, c / peer_cpu);
            out.push(PeerGoals {
                ours: ours.into(),
                size_bytes: r.size_bytes,
                fastest_peer: fastest,
                first_byte_over_fastest: first_over,
                lowest_cpu_peer: lowest,
                cpu_over_lowest: cpu_over,
                rss_over_firecracker: rss_over,
                met: first_over <= PEER_GOAL
                    && cpu_over <= PEER_GOAL
                    && rss_over.is_none_or(|x| x <= PEER_GOAL),
            });
        }
    }
    out
}

/// Per-run values of one (source, size).
#[derive(Default)]
struct Samples {
    first_byte: Vec<f64>,
    memory: Vec<f64>,
    cpu: Vec<f64>,
    rss: Vec<f64>,
    hugetlb: Vec<f64>,
    /// Phase → its length per run, in the order the phases ran.
    timeline: Vec<(String, Vec<f64>)>,
    /// Phase → the VMM's CPU time in it per run, the same order.
    timeline_cpu: Vec<(String, Vec<f64>)>,
}

impl Samples {
    /// Adds one run's timeline (a phase missing from a run is not invented).
    fn add_timeline(&mut self, phases: &[crate::PhaseJson]) {
        for p in phases {
            for (list, value) in [
                (&mut self.timeline, p.ms),
                (&mut self.timeline_cpu, p.cpu_ms),
            ] {
                match list.iter_mut().find(|(n, _)| *n == p.phase) {
                    Some((_, v)) => v.push(value),
                    None => list.push((p.phase.clone(), vec![value])),
                }
            }
        }
    }
}

/// Mounts a 2 MiB hugetlbfs at `dir` (the pool crate's mount, as `partition reserve` uses).
fn mount_hugetlbfs(dir: &Path) -> Result<(), pool::hugetlbfs::HugetlbfsError> {
    pool::hugetlbfs::mount(dir, HUGEPAGE)
}

fn umount(dir: &Path) -> Result<(), pool::hugetlbfs::HugetlbfsError> {
    pool::hugetlbfs::umount(dir)
}

/// Removes the files in `dir` (a hugetlbfs mount), so their pages go back.
fn clear_dir(dir: &Path) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let _ = std::fs::remove_file(e.path());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runs_timeline_is_kept_phase_by_phase_in_order() {
        let ph = |n: &str, ms: f64| crate::PhaseJson {
            phase: n.into(),
            ms,
            cpu_ms: ms / 2.0,
        };
        let mut s = Samples::default();
        s.add_timeline(&[ph("args", 0.5), ph("acquire", 3.0), ph("memory", 0.7)]);
        s.add_timeline(&[ph("args", 0.4), ph("acquire", 212.0), ph("memory", 0.8)]);
        assert_eq!(
            s.timeline,
            vec![
                ("args".to_string(), vec![0.5, 0.4]),
                ("acquire".to_string(), vec![3.0, 212.0]),
                ("memory".to_string(), vec![0.7, 0.8]),
            ]
        );
        assert_eq!(s.timeline_cpu[1], ("acquire".to_string(), vec![1.5, 106.0]));
    }

    /// A row with one run of each figure.
    fn row(source: &str, first: f64, cpu: f64, rss_kib: f64) -> MemSetupRow {
        MemSetupRow {
            source: source.into(),
            size_bytes: 256 << 20,
            first_byte_ms: summary(&[first]),
            memory_ms: None,
            vmm_cpu_ms_at_first_byte: summary(&[cpu]),
            vmm_rss_kib_at_first_byte: summary(&[rss_kib]),
            vmm_hugetlb_kib_at_first_byte: None,
            guest_memory_kib: 256 << 10,
            runs_first_byte_ms: vec![first],
            runs_memory_ms: Vec::new(),
            runs_vmm_cpu_ms: vec![cpu],
            runs_vmm_rss_kib: vec![rss_kib],
            runs_timeline_ms: Vec::new(),
            runs_timeline_cpu_ms: Vec::new(),
        }
    }

    #[test]
    fn ours_are_weighed_against_each_peers_best() {
        let rows = [
            row("pool", 5.0, 4.0, 3000.0),
            row("anonymous", 6.0, 6.0, 4200.0),
            row("qemu", 1.0, 1.0, 1.0),
            row("cloud-hypervisor-hugepages", 40.0, 5.0, 6500.0),
            row("firecracker", 15.0, 10.0, 4000.0),
            row("firecracker-hugepages", 12.0, 7.0, 3900.0),
        ];
        let g = peer_goals(&rows);
        assert_eq!(g.len(), 2);
        // QEMU is not a peer here; each ratio is over the best of the Rust peers' rows.
        assert_eq!(
            (g[0].ours.as_str(), g[0].fastest_peer.as_str()),
            ("pool", "firecracker-hugepages")
        );
        assert!((g[0].first_byte_over_fastest - 5.0 / 12.0).abs() < 1e-9);
        assert_eq!(g[0].lowest_cpu_peer, "cloud-hypervisor-hugepages");
        assert!((g[0].cpu_over_lowest - 0.8).abs() < 1e-9);
        assert!((g[0].rss_over_firecracker.unwrap() - 3000.0 / 3900.0).abs() < 1e-9);
        assert!(g[0].met);
        // The ad hoc launch: its CPU is above the goal, so it is not met.
        assert_eq!(g[1].ours, "anonymous");
        assert!((g[1].cpu_over_lowest - 1.2).abs() < 1e-9 && !g[1].met);
        // No peer ran: nothing to weigh.
        assert!(peer_goals(&rows[..3]).is_empty());
    }

    #[test]
    fn qemu_hugetlbfs_takes_its_memory_from_the_mount() {
        let env = crate::Env {
            qemu: Some("/bin/qemu".into()),
            qemu_left_out: false,
            ..crate::Env::for_tests()
        };
        let dir = Path::new("/mnt/h");
        let c = launch_cmd(
            &env,
            Path::new("/s"),
            "qemu-hugetlbfs",
            256 << 20,
            Path::new("/p"),
            dir,
        )
        .unwrap();
        let args: Vec<String> = c
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let obj = args.iter().position(|a| a == "-object").unwrap();
        assert_eq!(
            args[obj + 1],
            "memory-backend-file,id=ram,size=256M,mem-path=/mnt/h,prealloc=on,share=off"
        );
        assert!(
            args.windows(2)
                .any(|w| w == ["-machine", "memory-backend=ram"])
        );
        assert!(!args.contains(&"-mem-prealloc".to_string()), "{args:?}");
        let plain = launch_cmd(
            &env,
            Path::new("/s"),
            "qemu",
            256 << 20,
            Path::new("/p"),
            dir,
        )
        .unwrap();
        let args: Vec<String> = plain
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert!(
            args.contains(&"-mem-prealloc".to_string()) && !args.contains(&"-object".to_string())
        );
        // The ad hoc launch's default memory, asked for by name.
        let anon = launch_cmd(
            &env,
            Path::new("/s"),
            "anonymous",
            256 << 20,
            Path::new("/p"),
            dir,
        )
        .unwrap();
        let args: Vec<String> = anon
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert!(args.windows(2).any(|w| w == ["--backing", "anonymous"]));
        assert!(!args.contains(&"--name".to_string()), "{args:?}");
        assert!(takes_hugepages("qemu-hugetlbfs") && takes_hugepages("hugetlb"));
        assert!(!takes_hugepages("pool"));
        // The peers' sources: hugepages by name; a peer not given has no command.
        assert!(takes_hugepages("firecracker-hugepages") && !takes_hugepages("firecracker"));
        assert_eq!(
            Peer::from_source("cloud-hypervisor-hugepages"),
            Some(Peer::CloudHypervisor)
        );
        assert_eq!(Peer::from_source("firecracker"), Some(Peer::Firecracker));
        assert_eq!(Peer::from_source("qemu"), None);
        assert!(
            launch_cmd(
                &env,
                Path::new("/s"),
                "firecracker",
                256 << 20,
                Path::new("/p"),
                dir
            )
            .is_none()
        );
    }
}
