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
//! - `qemu`, `qemu-prealloc`: `qemu-system-x86_64 -M microvm` (its default: the guest faults
//!   its pages in) and with `-mem-prealloc`, the probe booted through PVH;
//! - `qemu-hugetlbfs`, `qemu-hugetlbfs-prealloc`: guest memory on 2 MiB hugepages
//!   (`-object memory-backend-file,mem-path=<hugetlbfs mount>`, `prealloc=off` and `on`;
//!   the pages are taken from the kernel before and given back after each run, outside the
//!   timed part, as for `hugetlb`);
//! - Cloud Hypervisor, when given ([`crate::peers`]): `cloud-hypervisor` (its default,
//!   pages made on first touch), `-prefault` (`prefault=on`), `-hugepages`
//!   (`hugepages=on,hugepage_size=2M`) and `-hugepages-prefault`;
//! - Firecracker, when given: `firecracker` (its default) and `firecracker-hugepages`
//!   (`"huge_pages": "2M"`; it has no prefault option). Both boot the probe through its
//!   PVH note.
//!
//! Every VMM is placed alike ([`crate::placement`]): the guest's vCPU thread on the reserved
//! core and everything else on the housekeeping core, each row saying how. Our ad hoc
//! launches are the exception the product makes: a reserved core is the pool's, so their
//! vCPU shares the housekeeping core (this puts them at a disadvantage, not the peers).
//! A section with a peer's rows but not its default row fails.
//!
//! Time to first byte is measured from `spawn` to the first byte on the VMM's stdout;
//! the memory part comes from our VMM's own report (`--json` timings; QEMU has no such
//! report: null).
//! The VMM's own cost per launch, as Firecracker's specification counts it: at the first
//! byte, the CPU time of all the VMM's threads since exec (`/proc/PID/task/*/schedstat`;
//! its vCPU thread's guest time so far is in it) and its resident set (`VmRSS`; guest
//! memory on hugepages is `HugetlbPages` instead, recorded beside it).
//! One warm-up round is discarded; the sources then alternate, in an order rotated every
//! round.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::doc::memsetup::{
    MemSetupChecks, MemSetupParams, MemSetupRow, MemSetupSection, PEER_GOAL, PeerGoals,
    PoolPreallocation,
};
use crate::head::Head;
use crate::peers::{Peer, PeerBoot, PeerSetup};
use crate::placement::{Pin, Placement};
use crate::stats::summary;
use crate::{Env, HugepageCount, Launch, Microvm, ms, timed_run_with};

/// The sources that are `partition launch`'s own (the rest are peer VMMs').
pub const OURS: [&str; 4] = ["pool", "anon-prefault", "anonymous", "hugetlb"];

/// QEMU's sources: its default (`-M microvm`, anonymous memory the guest faults in), with
/// `-mem-prealloc`, and each from a hugetlbfs mount.
pub const QEMU: [&str; 4] = [
    "qemu",
    "qemu-prealloc",
    "qemu-hugetlbfs",
    "qemu-hugetlbfs-prealloc",
];
const HUGEPAGE: u64 = 2 << 20;

/// The memory sources compared: ours, QEMU's, and every setup of each Rust peer
/// ([`PeerSetup::all_of`], its default first).
pub fn sources() -> Vec<String> {
    let mut out: Vec<String> = OURS.iter().chain(&QEMU).map(|s| s.to_string()).collect();
    for p in Peer::ALL {
        out.extend(PeerSetup::all_of(p).iter().map(PeerSetup::source));
    }
    out
}

/// Sizes measured.
pub fn default_sizes() -> Vec<u64> {
    vec![256 << 20, 1 << 30, 4 << 30, 8 << 30]
}

/// Whether `source` takes its pages from the kernel's free hugepages for each run.
fn takes_hugepages(source: &str) -> bool {
    source == "hugetlb"
        || source.starts_with("qemu-hugetlbfs")
        || PeerSetup::from_source(source).is_some_and(|s| s.hugepages)
}

/// One source's launch: the command, what follows its spawn to place it, what it runs
/// (the options that make the configuration) and where its threads run.
struct Launched {
    cmd: Command,
    /// Where it is spawned from ([`Placement::from_place`]).
    from: Placement,
    pin: Pin,
    config: String,
    placement: String,
}

fn launch_cmd(
    env: &Env,
    state: &Path,
    source: &str,
    size: u64,
    probe: &Path,
    hugetlbfs: &Path,
    join: Option<&Path>,
) -> Option<Launched> {
    let mb = (size >> 20).to_string();
    // The guest's vCPU on the reserved core, the rest on the housekeeping core; a peer's
    // process joins `join` so that it may use the reserved core at all.
    let split = Placement::one(env.core, env.host_core);
    let peer_split = split.clone().joining(join.map(Path::to_path_buf));
    if let Some(setup) = PeerSetup::from_source(source) {
        let boot = PeerBoot {
            setup,
            placement: Some(peer_split.clone()),
            vcpus: 1,
            mb: size >> 20,
            probe,
            cmdline: "probe.memtest=0",
            disk: None,
        };
        let (cmd, pin) = boot.command(env, &env.work)?;
        // Its options, the run's scratch directory (where the probe and Firecracker's
        // configuration are) named as such.
        let config = crate::pretty(&cmd).replace(&env.work.display().to_string(), "<scratch>");
        let config = match setup.peer {
            Peer::Firecracker => format!(
                "{} ({})",
                config.split_once(' ').map_or("", |(_, a)| a),
                boot.firecracker_config()["machine-config"]
            ),
            Peer::CloudHypervisor => config
                .split_once(' ')
                .map_or(String::new(), |(_, a)| a.to_string()),
        };
        return Some(Launched {
            from: peer_split,
            config,
            placement: boot.placement_note(),
            cmd,
            pin,
        });
    }
    if QEMU.contains(&source) {
        let hugepages = source.starts_with("qemu-hugetlbfs");
        let prealloc = source.ends_with("-prealloc");
        let mut c = Microvm {
            pin: None,
            smp: 1,
            mb: size >> 20,
            acpi: true,
            prealloc: prealloc && !hugepages,
            probe,
            cmdline: "probe.memtest=0",
        }
        .command(env);
        let mut config = String::from("-M microvm");
        if hugepages {
            let backend = format!(
                "memory-backend-file,id=ram,size={mb}M,mem-path={},prealloc={},share=off",
                hugetlbfs.display(),
                if prealloc { "on" } else { "off" }
            );
            c.args(["-object", &backend, "-machine", "memory-backend=ram"]);
            config.push_str(&format!(
                " -object {}",
                backend.replace(&env.work.display().to_string(), "<scratch>")
            ));
        } else if prealloc {
            config.push_str(" -mem-prealloc");
        }
        let pin = peer_split.qemu(&mut c, "memsetup", &env.work.join("memsetup-qmp.sock"));
        return Some(Launched {
            cmd: c,
            from: peer_split,
            pin,
            config,
            placement: format!(
                "{} (started paused, vCPU pinned over QMP, then cont: the QMP round trips \
                 are in its times)",
                split.describe()
            ),
        });
    }
    let memory = format!("{mb}M");
    // An ad hoc launch may not take a reserved core: its vCPU shares the housekeeping one.
    let (cores, placement) = if source == "pool" {
        (env.core, split.clone())
    } else {
        (env.host_core, Placement::one(env.host_core, env.host_core))
    };
    let l = Launch::new(env, state, &cores.to_string(), &memory);
    let (l, config) = match source {
        "pool" => (l.name("memsetup"), "--name (a pool extent)"),
        "anon-prefault" => (l.backing("prefault"), "--backing prefault"),
        "anonymous" => (l.backing("anonymous"), "--backing anonymous (the default)"),
        _ => (l.backing("hugetlb"), "--backing hugetlb"),
    };
    let cmd = l.probe().cmdline("probe.memtest=0").json().command();
    Some(Launched {
        cmd,
        // Spawned from the housekeeping core, in the cpuset a user's shell is in.
        from: Placement::one(env.host_core, env.host_core),
        pin: Pin::Nothing,
        config: config.into(),
        placement: if source == "pool" {
            format!("{} (its own --cores)", placement.describe())
        } else {
            format!(
                "{} (an ad hoc launch may not take the reserved core)",
                placement.describe()
            )
        },
    })
}

fn ok(source: &str, status: std::process::ExitStatus) -> bool {
    match source {
        // isa-debug-exit: status s exits with (s << 1) | 1.
        s if QEMU.contains(&s) => status.code() == Some(1),
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
            sources: sources(),
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

    let all = sources();
    let mut sources: Vec<&str> = all
        .iter()
        .map(String::as_str)
        .filter(|s| !QEMU.contains(s) || env.qemu.is_some())
        .filter(|s| Peer::from_source(s).is_none_or(|p| p.binary(env).is_some()))
        .collect();
    if env.qemu.is_none() {
        section.qemu_note = Some("qemu-system-x86_64 not found: no peer rows".into());
    }
    // QEMU's hugepage backend needs a hugetlbfs mount of its own (in the scratch directory,
    // which the bench supervisor unmounts if this run dies).
    let hugetlbfs = env.work.join("qemu-hugetlbfs");
    let mounted = sources.iter().any(|s| s.starts_with("qemu-hugetlbfs")) && {
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
        sources.retain(|s| !s.starts_with("qemu-hugetlbfs"));
    }
    section.params.sources = sources.iter().map(|s| s.to_string()).collect();
    let mut failures = Vec::new();
    // Where a peer's process goes for its vCPU to be placed on the reserved core.
    let join = crate::placement::reservation_cpuset(&state).unwrap_or_else(|e| {
        failures.push(e);
        None
    });
    let base = HugepageCount::read();
    // Puts the count back to `base` (the pool's own pages) however the loop ends; it must
    // go before unreserve, which gives the pool's pages back.
    let restore = HugepageCount(base.to_string());
    // (source, size) -> per-run values
    let mut samples: BTreeMap<(String, u64), Samples> = BTreeMap::new();
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
                let Some(Launched {
                    mut cmd,
                    from,
                    pin,
                    config,
                    placement,
                }) = launch_cmd(
                    env,
                    &state,
                    source,
                    size,
                    &probe,
                    &hugetlbfs,
                    join.as_deref(),
                )
                else {
                    HugepageCount::set(base);
                    continue;
                };
                if OURS.contains(&source) {
                    // The timeline then starts at the spawn: exec and loading are a phase.
                    cmd.env(
                        partition::sys::timeline::EXEC_ENV,
                        partition::sys::timeline::monotonic_ns().to_string(),
                    );
                }
                let r = from
                    .from_place(|| {
                        timed_run_with(cmd, Duration::from_secs(300), |pid| pin.apply(pid))
                    })
                    .unwrap_or_else(|e| Err(std::io::Error::other(e)));
                if source.starts_with("qemu-hugetlbfs") {
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
                        e.config = config;
                        e.placement = placement;
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
            config: Some(v.config.clone()),
            placement: Some(v.placement.clone()),
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
    let missing = crate::peers::missing_defaults(rows.iter().map(|r| r.source.as_str()));
    if !missing.is_empty() {
        failures.push(format!(
            "no default row of {}: a peer's best alone says nothing of what its users get",
            missing.join(", ")
        ));
    }
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
    let complete = samples.len() == expected && full == samples.len() && missing.is_empty();
    section.head.finish(complete, || {
        format!("{full} of {expected} configurations measured fully; failures: {failures:?}")
    });
    section.failures = Some(failures);
    section
}

/// Our pool and ad hoc (`anonymous`) launches against the peers' best, at every size where
/// both ours and a peer have a median: the fastest and the lowest-CPU row of any peer
/// (QEMU, Cloud Hypervisor, Firecracker, in any configuration), and Firecracker's lowest
/// resident set.
fn peer_goals(rows: &[MemSetupRow]) -> Vec<PeerGoals> {
    let mut out = Vec::new();
    for ours in ["pool", "anonymous"] {
        for r in rows.iter().filter(|r| r.source == ours) {
            let peers: Vec<&MemSetupRow> = rows
                .iter()
                .filter(|p| p.size_bytes == r.size_bytes && !OURS.contains(&p.source.as_str()))
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
    /// What it ran and where (the same every run).
    config: String,
    placement: String,
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
            config: None,
            placement: None,
        }
    }

    #[test]
    fn ours_are_weighed_against_the_fastest_row_of_any_peer() {
        let rows = [
            row("pool", 5.0, 4.0, 3000.0),
            row("anonymous", 6.0, 6.0, 4200.0),
            row("hugetlb", 1.0, 1.0, 1.0),
            row("qemu", 900.0, 50.0, 20000.0),
            row("cloud-hypervisor-hugepages", 40.0, 5.0, 6500.0),
            row("firecracker", 15.0, 10.0, 4000.0),
            row("firecracker-hugepages", 12.0, 7.0, 3900.0),
        ];
        let g = peer_goals(&rows);
        assert_eq!(g.len(), 2);
        // Our own rows are never a peer's; each ratio is over the best row of any peer.
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
        // QEMU is a peer too: where its row is the fastest, it is the one named.
        let mut with_qemu = rows.to_vec();
        with_qemu[3] = row("qemu", 2.0, 3.0, 20000.0);
        let g = peer_goals(&with_qemu);
        assert_eq!(
            (g[0].fastest_peer.as_str(), g[0].lowest_cpu_peer.as_str()),
            ("qemu", "qemu")
        );
        // Firecracker's resident set stays the one the RSS goal names.
        assert!((g[0].rss_over_firecracker.unwrap() - 3000.0 / 3900.0).abs() < 1e-9);
    }

    #[test]
    fn each_qemu_setup_is_its_own_row_and_every_vmm_is_placed_alike() {
        let env = crate::Env {
            qemu: Some("/bin/qemu".into()),
            qemu_left_out: false,
            ..crate::Env::for_tests()
        };
        let dir = Path::new("/mnt/h");
        let args_of = |source: &str| {
            let l = launch_cmd(
                &env,
                Path::new("/s"),
                source,
                256 << 20,
                Path::new("/p"),
                dir,
                Some(Path::new("/cg/tasks")),
            )
            .unwrap();
            let a: Vec<String> = l
                .cmd
                .get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            (a, l)
        };
        let (args, l) = args_of("qemu-hugetlbfs-prealloc");
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
        // QEMU starts paused and is pinned over QMP: the vCPU on the reserved core.
        assert!(args.contains(&"-S".to_string()));
        assert!(
            matches!(&l.pin, Pin::QemuPaused { placement, .. }
                if placement.vcpus == [env.core] && placement.other == env.host_core
                    && placement.join.as_deref() == Some(Path::new("/cg/tasks"))),
            "{:?}",
            l.pin
        );
        let (args, _) = args_of("qemu-hugetlbfs");
        assert!(
            args.iter()
                .any(|a| a.contains("mem-path=/mnt/h,prealloc=off"))
        );
        // QEMU's default: no preallocation at all.
        let (args, l) = args_of("qemu");
        assert!(!args.contains(&"-mem-prealloc".to_string()) && !args.contains(&"-object".into()));
        assert_eq!(l.config, "-M microvm");
        let (args, l) = args_of("qemu-prealloc");
        assert!(args.contains(&"-mem-prealloc".to_string()));
        assert_eq!(l.config, "-M microvm -mem-prealloc");
        // The ad hoc launch's default memory, asked for by name, on the housekeeping core.
        let (args, l) = args_of("anonymous");
        assert!(args.windows(2).any(|w| w == ["--backing", "anonymous"]));
        assert!(
            args.windows(2)
                .any(|w| w == ["--cores", &env.host_core.to_string()])
        );
        assert!(!args.contains(&"--name".to_string()), "{args:?}");
        assert!(l.placement.contains("may not take the reserved core"));
        let (args, _) = args_of("pool");
        assert!(
            args.windows(2)
                .any(|w| w == ["--cores", &env.core.to_string()])
        );
        assert!(takes_hugepages("qemu-hugetlbfs") && takes_hugepages("hugetlb"));
        assert!(takes_hugepages("qemu-hugetlbfs-prealloc") && !takes_hugepages("qemu-prealloc"));
        assert!(!takes_hugepages("pool"));
        // The peers' sources: hugepages by name; a peer not given has no command.
        assert!(takes_hugepages("firecracker-hugepages") && !takes_hugepages("firecracker"));
        assert!(takes_hugepages("cloud-hypervisor-hugepages-prefault"));
        assert!(!takes_hugepages("cloud-hypervisor-prefault"));
        assert!(
            launch_cmd(
                &env,
                Path::new("/s"),
                "firecracker",
                256 << 20,
                Path::new("/p"),
                dir,
                None
            )
            .is_none()
        );
        // Every source the section names is one it can launch (or a peer not given).
        let all = sources();
        assert_eq!(all.len(), 4 + 4 + 4 + 2);
        assert!(all.iter().all(|s| OURS.contains(&s.as_str())
            || QEMU.contains(&s.as_str())
            || PeerSetup::from_source(s).is_some()));
        assert!(crate::peers::missing_defaults(all.iter().map(String::as_str)).is_empty());
    }
}
