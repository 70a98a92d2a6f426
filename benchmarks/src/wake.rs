//! `wake`: the price of a fast wakeup, per idle policy, against the bare host.
//!
//! Guest side (the probe guest, `probe.bench=wake`, on a 2-vCPU partition on the two cores):
//! TSC-deadline timer lateness, IPI ping-pong with both vCPUs idling as the policy makes a
//! Linux guest idle, and a shared-memory ping-pong in ring 3 (the no-interrupt floor).
//! Host side, pinned to the same two cores: futex ping-pong (the sleeping case), a
//! ping-pong spinning on a cache line (the polling case), and `clock_nanosleep` lateness.
//! Host cost: the busy share of the two cores (from /proc/stat) while the guest sits idle
//! (`probe.bench=idle`) for a fixed window, and package energy from RAPL where exposed.
//! Peers: the same probe under `qemu-system-x86_64 -M microvm`, default and with
//! `-overcommit cpu-pm=on`, and under Cloud Hypervisor and Firecracker when given
//! ([`crate::peers`]), their vCPU threads on the same two cores.
//!
//! Every round runs the host side, each policy and each peer, in an order rotated per
//! round; the per-run medians are summarised as a median with min-max spread.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::doc::wake::{PolicyRow, WakeHost, WakeMetric, WakeParams, WakeRow, WakeSection};
use crate::head::{Head, Ordering as Claim};
use crate::host::{futex_wait, futex_wake, pin};
use crate::peers::{Peer, PeerBoot, PeerSetup};
use crate::placement::{Pin, Placement};
use crate::stats::{Summary, summary};
use crate::{Env, Launch, Microvm};

/// Policies measured, in the order of the seed's table.
pub const POLICIES: [&str; 5] = ["mwait", "poll", "haltpoll", "hlt", "shared"];
const SAMPLES: usize = 200;
const WARMUP: usize = 20;
const IDLE_SECONDS: u64 = 2;

#[repr(align(64))]
struct Line(AtomicU32);

/// Round trips between two threads on `a` and `b`, sleeping on futexes or spinning.
pub fn host_pingpong(core_a: usize, core_b: usize, n: usize, sleep: bool) -> Vec<f64> {
    let ping = Arc::new((Line(AtomicU32::new(0)), Line(AtomicU32::new(0))));
    let p2 = ping.clone();
    let t = std::thread::spawn(move || {
        pin(core_b);
        let (a, b) = (&p2.0.0, &p2.1.0);
        for i in 1..=n as u32 {
            while a.load(Ordering::Acquire) != i {
                if sleep {
                    futex_wait(a, i - 1);
                } else {
                    std::hint::spin_loop();
                }
            }
            b.store(i, Ordering::Release);
            if sleep {
                futex_wake(b);
            }
        }
    });
    pin(core_a);
    let (a, b) = (&ping.0.0, &ping.1.0);
    let mut out = Vec::with_capacity(n);
    for i in 1..=n as u32 {
        let t0 = Instant::now();
        a.store(i, Ordering::Release);
        if sleep {
            futex_wake(a);
        }
        while b.load(Ordering::Acquire) != i {
            if sleep {
                futex_wait(b, i - 1);
            } else {
                std::hint::spin_loop();
            }
        }
        out.push(t0.elapsed().as_secs_f64() * 1e9);
    }
    let _ = t.join();
    out
}

/// How late `clock_nanosleep(TIMER_ABSTIME)` wakes, `interval` ahead, on `core`.
pub fn host_timer(core: usize, n: usize, interval: Duration) -> Vec<f64> {
    let h = std::thread::spawn(move || {
        pin(core);
        let now = || {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: writes one timespec.
            unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
            ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
        };
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let deadline = now() + interval.as_nanos() as i128;
            let ts = libc::timespec {
                tv_sec: (deadline / 1_000_000_000) as libc::time_t,
                tv_nsec: (deadline % 1_000_000_000) as libc::c_long,
            };
            // SAFETY: sleeps until an absolute time; reads one timespec.
            unsafe {
                libc::clock_nanosleep(
                    libc::CLOCK_MONOTONIC,
                    libc::TIMER_ABSTIME,
                    &ts,
                    std::ptr::null_mut(),
                )
            };
            out.push((now() - deadline) as f64);
        }
        out
    });
    h.join().unwrap_or_default()
}

/// (busy, total) jiffies per core from /proc/stat.
fn cpu_times(cores: &[usize]) -> Vec<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    cores
        .iter()
        .map(|c| {
            let prefix = format!("cpu{c} ");
            stat.lines()
                .find(|l| l.starts_with(&prefix))
                .map(|l| {
                    let v: Vec<u64> = l
                        .split_whitespace()
                        .skip(1)
                        .filter_map(|x| x.parse().ok())
                        .collect();
                    let total: u64 = v.iter().take(8).sum();
                    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
                    (total - idle, total)
                })
                .unwrap_or((0, 0))
        })
        .collect()
}

fn busy_share(before: &[(u64, u64)], after: &[(u64, u64)]) -> Vec<f64> {
    before
        .iter()
        .zip(after)
        .map(|(b, a)| {
            let total = a.1.saturating_sub(b.1);
            if total == 0 {
                0.0
            } else {
                a.0.saturating_sub(b.0) as f64 / total as f64
            }
        })
        .collect()
}

/// Package energy in joules from RAPL, if exposed.
fn rapl_joules() -> Option<f64> {
    let mut total = None;
    for dir in [
        "/sys/class/powercap/intel-rapl:0",
        "/sys/class/powercap/amd-rapl:0",
    ] {
        if let Ok(s) = std::fs::read_to_string(format!("{dir}/energy_uj")) {
            if let Ok(v) = s.trim().parse::<f64>() {
                *total.get_or_insert(0.0) += v / 1e6;
            }
        }
    }
    total
}

/// A measured idle window.
struct Idle {
    busy: Vec<f64>,
    energy_j: Option<f64>,
}

/// Spawns a guest that idles (its console on stdout) and measures the cores while it says
/// it idles.
fn guest_idle((mut cmd, pin): Placed, cores: &[usize]) -> Result<Idle, String> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| e.to_string())?;
    if let Err(e) = pin.apply(child.id()) {
        let _ = child.kill();
        let _ = child.wait();
        return Err(e);
    }
    let out = child.stdout.take().ok_or("no stdout")?;
    let mut before = None;
    let mut e0 = None;
    let mut result = Err("the guest never said 'idle end'".to_string());
    let deadline = Instant::now() + Duration::from_secs(IDLE_SECONDS + 60);
    for line in BufReader::new(out).lines() {
        let Ok(line) = line else { break };
        if line.contains("probe: idle start") {
            before = Some(cpu_times(cores));
            e0 = rapl_joules();
        } else if line.contains("probe: idle end") {
            if let Some(b) = &before {
                result = Ok(Idle {
                    busy: busy_share(b, &cpu_times(cores)),
                    energy_j: rapl_joules().zip(e0).map(|(a, b)| a - b),
                });
            }
            break;
        }
        if Instant::now() > deadline {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    result
}

/// A probe guest's wake lines: test -> (median, p99) ns.
pub fn parse_wake(stdout: &str) -> BTreeMap<String, (f64, f64, String)> {
    let mut out = BTreeMap::new();
    for l in stdout.lines() {
        let Some(rest) = l.strip_prefix("probe: wake test=") else {
            continue;
        };
        let f = |k: &str| {
            rest.split_whitespace()
                .find_map(|w| w.strip_prefix(k)?.strip_prefix('=')?.parse::<f64>().ok())
        };
        let test = rest.split_whitespace().next().unwrap_or("").to_string();
        let mode = rest
            .split_whitespace()
            .find_map(|w| w.strip_prefix("mode="))
            .unwrap_or("")
            .to_string();
        if let (Some(m), Some(p)) = (f("median_ns"), f("p99_ns")) {
            out.insert(test, (m, p, mode));
        }
    }
    out
}

#[derive(Default)]
struct Series {
    medians: BTreeMap<String, Vec<f64>>,
    p99s: BTreeMap<String, Vec<f64>>,
    modes: BTreeMap<String, String>,
    busy: Vec<f64>,
    energy: Vec<f64>,
    readback: Option<Value>,
    failures: Vec<String>,
    /// What it ran and where, as its row says it.
    placement: String,
}

impl Series {
    fn add(&mut self, key: &str, median: f64, p99: f64) {
        self.medians.entry(key.into()).or_default().push(median);
        self.p99s.entry(key.into()).or_default().push(p99);
    }
    fn metric(&self, key: &str) -> Option<WakeMetric> {
        let m = self.medians.get(key).and_then(|v| summary(v))?;
        let p = self.p99s.get(key).and_then(|v| summary(v));
        Some(WakeMetric {
            median_ns: m.median,
            spread_ns: [m.min, m.max],
            runs: m.n,
            p99_ns: p.map(|p| p.median),
            per_run_median_ns: self.medians.get(key).cloned().unwrap_or_default(),
        })
    }
    fn summary(&self, key: &str) -> Option<Summary> {
        self.medians.get(key).and_then(|v| summary(v))
    }
}

fn guest_cmd(env: &Env, policy: &str, cmdline: &str) -> Command {
    // Under `hlt` the guest should halt without polling first (a Linux guest would be given
    // idle=halt): KVM_HINTS_REALTIME alone would make it haltpoll.
    let cmdline = if policy == "hlt" {
        format!("{cmdline} probe.idle=hlt")
    } else {
        cmdline.to_string()
    };
    Launch::new(
        env,
        &env.work.join("wake-state"),
        &format!("{},{}", env.host_core, env.core),
        "64M",
    )
    .probe()
    .idle(policy)
    .cmdline(&cmdline)
    .json()
    .command()
}

fn qemu_cmd(
    env: &Env,
    probe: &Path,
    cpu_pm: bool,
    cmdline: &str,
    placement: &Placement,
    job: &str,
) -> Placed {
    let mut c = Microvm {
        pin: None,
        smp: 2,
        mb: 64,
        acpi: true,
        prealloc: false,
        probe,
        cmdline,
    }
    .command(env);
    if cpu_pm {
        c.args(["-overcommit", "cpu-pm=on"]);
    }
    let pin = placement.qemu(
        &mut c,
        "wake",
        &env.work.join(format!("wake-qmp-{job}.sock")),
    );
    (c, pin)
}

/// A command and what must follow its spawn to place its threads.
type Placed = (Command, Pin);

/// One launch of the wake guest under `policy` (2 vCPUs: the housekeeping core and the
/// measured one, as this section's, with its command line): test -> (median, p99, the mode
/// it waited in), ns. The noise section runs it quiet and beside its neighbour.
pub(crate) fn guest_once(
    env: &Env,
    policy: &str,
) -> Result<BTreeMap<String, (f64, f64, String)>, String> {
    let r = crate::timed_run(
        guest_cmd(env, policy, &wake_cmdline()),
        Duration::from_secs(180),
    )
    .map_err(|e| e.to_string())?;
    let lines = parse_wake(&r.stdout);
    if !r.status.success() || lines.is_empty() {
        return Err(format!(
            "exit {:?}, {} wake lines; {}",
            r.status.code(),
            lines.len(),
            r.stderr.lines().last().unwrap_or("")
        ));
    }
    Ok(lines)
}

fn wake_cmdline() -> String {
    format!("probe.memtest=0 probe.bench=wake probe.wake_n={SAMPLES} probe.wake_warmup={WARMUP}")
}

fn idle_cmdline() -> String {
    format!("probe.memtest=0 probe.bench=idle probe.idle_seconds={IDLE_SECONDS}")
}

fn ratio(a: Option<Summary>, b: Option<Summary>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b.median > 0.0 => Some(a.median / b.median),
        _ => None,
    }
}

/// Runs the section.
pub fn run(env: &Env) -> WakeSection {
    let mut section = WakeSection {
        head: Head::start_with_peers(env, &crate::peers::infos(env)),
        params: WakeParams {
            runs: env.runs,
            samples_per_run: SAMPLES,
            discarded_warmup_samples: WARMUP,
            guest_cores: vec![env.host_core, env.core],
            timer_interval_us: 1000,
            idle_window_s: IDLE_SECONDS,
            guest: "probe guest, 2 vCPUs, 64 MiB, anonymous memory".into(),
        },
        method: "per round: the host side (futex ping-pong, spin ping-pong, clock_nanosleep \
                 lateness, all pinned to the guest's two cores), then for each idle policy \
                 the probe guest's wake tests and its idle window, then QEMU; order rotated \
                 each round. Each run reports medians after discarding warm-up samples; rows \
                 give the median of the per-run medians with their min-max spread."
            .into(),
        host_caps: None,
        host: None,
        policies: None,
        peers: None,
        orderings: None,
    };
    let caps = crate::caps(env);
    section.host_caps = Some(caps.clone());
    let offered = |p: &str| {
        caps["policies"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["policy"] == p))
            .map(|x| {
                (
                    x["offered"] == true,
                    x["why"].as_str().unwrap_or("").to_string(),
                )
            })
            .unwrap_or((false, "partition caps failed".into()))
    };
    let probe = match crate::probe_image(env) {
        Ok(p) => p,
        Err(e) => {
            section.head.fail(format!("writing the probe image: {e}"));
            return section;
        }
    };

    let cores = [env.host_core, env.core];
    // vCPU n on cores[n], every VMM's other threads on the housekeeping core.
    let placement = Placement {
        vcpus: cores.to_vec(),
        other: env.host_core,
        join: None,
    };
    let mut host = Series::default();
    let mut guests: BTreeMap<String, Series> = BTreeMap::new();
    let mut refused: BTreeMap<String, String> = BTreeMap::new();
    for p in POLICIES {
        let (ok, why) = offered(p);
        if ok {
            guests.insert(p.to_string(), Series::default());
        } else {
            // Show the refusal exactly as a user would meet it.
            let out = guest_cmd(env, p, "probe.memtest=0").output();
            let msg = out
                .ok()
                .map(|o| String::from_utf8_lossy(&o.stderr).trim().to_string())
                .filter(|s| !s.is_empty())
                .unwrap_or(why);
            refused.insert(p.to_string(), msg);
        }
    }
    let mut peers = if env.qemu.is_some() {
        vec!["qemu-default", "qemu-cpu-pm"]
    } else {
        vec![]
    };
    peers.extend(
        Peer::ALL
            .iter()
            .filter(|p| p.binary(env).is_some())
            .map(|p| p.name()),
    );
    let mut peer_series: BTreeMap<String, Series> = BTreeMap::new();
    let mut baseline_busy = Vec::new();

    let mut jobs: Vec<String> = vec!["host".into()];
    jobs.extend(guests.keys().cloned());
    jobs.extend(peers.iter().map(|s| s.to_string()));
    for round in 0..env.runs {
        let mut order = jobs.clone();
        let n = order.len();
        order.rotate_left(round % n);
        for job in order {
            match job.as_str() {
                "host" => {
                    let f = host_pingpong(cores[0], cores[1], SAMPLES + WARMUP, true);
                    let s = host_pingpong(cores[0], cores[1], SAMPLES + WARMUP, false);
                    let t = host_timer(cores[1], SAMPLES + WARMUP, Duration::from_millis(1));
                    for (k, v) in [
                        ("futex_pingpong", f),
                        ("spin_pingpong", s),
                        ("timer_lateness", t),
                    ] {
                        if let Some(sm) = summary(&v[WARMUP.min(v.len())..]) {
                            host.add(k, sm.median, sm.p99);
                        }
                    }
                    let b = cpu_times(&cores);
                    std::thread::sleep(Duration::from_secs(IDLE_SECONDS));
                    baseline_busy
                        .push(busy_share(&b, &cpu_times(&cores)).iter().sum::<f64>() / 2.0);
                }
                p if guests.contains_key(p) => {
                    let s = guests.get_mut(p).expect("present");
                    let ours = |cmdline: &str| (guest_cmd(env, p, cmdline), Pin::Nothing);
                    s.placement = format!("{} (its own --cores)", placement.describe());
                    measure_guest(
                        s,
                        ours(&wake_cmdline()),
                        ours(&idle_cmdline()),
                        &cores,
                        false,
                        Duration::from_secs(60),
                        &placement,
                    );
                }
                peer if let Some(p) = Peer::from_source(peer) => {
                    let (wake_line, idle_line) = (wake_cmdline(), idle_cmdline());
                    let wake = PeerBoot {
                        setup: PeerSetup::default_of(p),
                        placement: Some(placement.clone()),
                        vcpus: 2,
                        mb: 64,
                        probe: &probe,
                        cmdline: &wake_line,
                        disk: None,
                    };
                    let idle = PeerBoot {
                        cmdline: &idle_line,
                        placement: Some(placement.clone()),
                        ..wake
                    };
                    let s = peer_series.entry(peer.to_string()).or_default();
                    s.placement = format!(
                        "its default (it has no idle or polling option to tune: its default \
                         is its best here); {}",
                        wake.placement_note()
                    );
                    let (wake, idle) = (wake.command(env, &env.work), idle.command(env, &env.work));
                    if let (Some(wake), Some(idle)) = (wake, idle) {
                        measure_guest(
                            s,
                            wake,
                            idle,
                            &cores,
                            false,
                            Duration::from_secs(60),
                            &placement,
                        );
                    }
                }
                peer => {
                    let cpu_pm = peer == "qemu-cpu-pm";
                    let s = peer_series.entry(peer.to_string()).or_default();
                    if cpu_pm && !s.failures.is_empty() {
                        continue; // failed once: do not hang a run on it again
                    }
                    let limit = Duration::from_secs(if cpu_pm { 15 } else { 60 });
                    s.placement = format!(
                        "{}; {} (started paused, vCPUs pinned over QMP, then cont)",
                        if cpu_pm {
                            "-overcommit cpu-pm=on (its best: the guest's idle instructions do \
                             not exit)"
                        } else {
                            "its default"
                        },
                        placement.describe()
                    );
                    measure_guest(
                        s,
                        qemu_cmd(env, &probe, cpu_pm, &wake_cmdline(), &placement, "wake"),
                        qemu_cmd(env, &probe, cpu_pm, &idle_cmdline(), &placement, "idle"),
                        &cores,
                        true,
                        limit,
                        &placement,
                    );
                }
            }
        }
    }

    let futex = host.summary("futex_pingpong");
    let spin = host.summary("spin_pingpong");
    section.host = Some(WakeHost {
        label: "L1 baseline (the development host is itself a KVM guest)".into(),
        futex_pingpong: host.metric("futex_pingpong"),
        spin_pingpong: host.metric("spin_pingpong"),
        timer_lateness: host.metric("timer_lateness"),
        idle_busy_share_no_guest: summary(&baseline_busy),
    });
    let no_rapl = rapl_joules().is_none();
    let row = |name: &str, s: &Series| WakeRow {
        name: name.into(),
        idle_mode_in_guest: s.modes.get("ipi").or(s.modes.get("timer")).cloned(),
        timer_lateness: s.metric("timer"),
        ipi_round_trip: s.metric("ipi"),
        shm_round_trip: s.metric("shm"),
        ipi_over_host_futex: ratio(s.summary("ipi"), futex),
        ipi_over_host_spin: ratio(s.summary("ipi"), spin),
        shm_over_host_spin: ratio(s.summary("shm"), spin),
        idle_busy_share: summary(&s.busy),
        idle_energy_j: summary(&s.energy),
        energy_note: no_rapl.then(|| "no RAPL on this host: null".into()),
        readback: s.readback.clone(),
        failures: s.failures.clone(),
        placement: (!s.placement.is_empty()).then(|| s.placement.clone()),
    };
    section.policies = Some(
        POLICIES
            .iter()
            .map(|p| match guests.get(*p) {
                Some(s) => PolicyRow::Measured(Box::new(row(p, s))),
                None => PolicyRow::Refused {
                    name: p.to_string(),
                    refused: refused.get(*p).cloned(),
                },
            })
            .collect(),
    );
    section.peers = Some(peer_series.iter().map(|(k, s)| row(k, s)).collect());

    // The orderings the seeds predict, and whether this host shows them.
    let g = |p: &str, k: &str| guests.get(p).and_then(|s| s.summary(k));
    let ordering = Claim::check_or;
    section.orderings = Some(vec![
        ordering(
            "spinning wakes faster than halting: a polling vCPU woken by a memory write (poll, shm) vs an IPI to a halted vCPU (hlt)",
            g("poll", "shm"),
            g("hlt", "ipi"),
            "not shown on this host",
        ),
        ordering(
            "spinning wakes faster than halting: an IPI to a spinning vCPU (poll) vs to a halted one (hlt)",
            g("poll", "ipi"),
            g("hlt", "ipi"),
            "hidden by the nested host: an interrupt for a vCPU that is running in guest mode needs a kick (an exit and re-entry through the L0 hypervisor), which costs as much here as waking a halted one",
        ),
        ordering(
            "spinning wakes faster than halting: timer lateness with the vCPU spinning (poll) vs halted (hlt)",
            g("poll", "timer"),
            g("hlt", "timer"),
            "not shown on this host",
        ),
        ordering(
            "halt polling on is faster than off: shared (host polls 200 us) vs hlt (halt-poll 0), both with a halting guest",
            g("shared", "ipi"),
            g("hlt", "ipi"),
            "not shown on this host",
        ),
    ]);
    let all_ok = guests.values().all(|s| {
        s.failures.is_empty() && s.medians.get("ipi").is_some_and(|v| v.len() == env.runs)
    }) && host
        .medians
        .get("futex_pingpong")
        .is_some_and(|v| v.len() == env.runs);
    section.head.finish(all_ok, || {
        format!(
            "guest failures: {:?}",
            guests
                .iter()
                .map(|(k, s)| (k, &s.failures))
                .collect::<Vec<_>>()
        )
    });
    section
}

/// [`measure_guest_here`], spawned from `from` ([`Placement::from_place`]): the VMM's
/// threads other than its vCPUs start on the housekeeping core.
fn measure_guest(
    s: &mut Series,
    wake: Placed,
    idle: Placed,
    cores: &[usize],
    qemu: bool,
    limit: Duration,
    from: &Placement,
) {
    let r = from.from_place(|| measure_guest_here(s, wake, idle, cores, qemu, limit));
    if let Err(e) = r {
        s.failures.push(e);
    }
}

fn measure_guest_here(
    s: &mut Series,
    (wake, pin): Placed,
    idle: Placed,
    cores: &[usize],
    qemu: bool,
    limit: Duration,
) {
    let ok = |st: std::process::ExitStatus| {
        if qemu {
            st.code() == Some(1)
        } else {
            st.success()
        }
    };
    match crate::timed_run_with(wake, limit, |pid| pin.apply(pid)) {
        Ok(r) if ok(r.status) => {
            let lines = parse_wake(&r.stdout);
            if lines.is_empty() {
                s.failures
                    .push("exit 0 without a wake line: the guest ran something else".into());
                return;
            }
            for (test, (m, p, mode)) in lines {
                s.add(&test, m, p);
                s.modes.insert(test, mode);
            }
            if s.readback.is_none()
                && let Ok(j) = crate::LaunchJson::from_stdout(&r.stdout)
            {
                // The idle plan and KVM's read-back, as the VMM's JSON report has them.
                s.readback = Some(j.idle);
            }
        }
        Ok(r) => {
            let why = r
                .stderr
                .lines()
                .chain(r.stdout.lines())
                .filter(|l| l.contains("error") || l.contains("FATAL") || l.contains("mwait"))
                .collect::<Vec<_>>()
                .join(" | ");
            s.failures.push(format!(
                "exit {:?}{}: {}",
                r.status.code(),
                if r.status.code().is_none() {
                    format!(" (killed after {} s: hung)", limit.as_secs())
                } else {
                    String::new()
                },
                why
            ));
            return;
        }
        Err(e) => {
            s.failures.push(e.to_string());
            return;
        }
    }
    match guest_idle(idle, cores) {
        Ok(i) => {
            s.busy
                .push(i.busy.iter().sum::<f64>() / i.busy.len().max(1) as f64);
            if let Some(e) = i.energy_j {
                s.energy.push(e);
            }
        }
        Err(e) => s.failures.push(format!("idle window: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_wake_lines() {
        let out = "probe: wake start mode=hlt n=5\nprobe: wake test=ipi mode=hlt n=200 median_ns=65923 p99_ns=74900 min_ns=1 max_ns=2\nprobe: wake test=shm mode=spin n=200 median_ns=100 p99_ns=160 min_ns=50 max_ns=160\n";
        let w = parse_wake(out);
        assert_eq!(w["ipi"], (65923.0, 74900.0, "hlt".to_string()));
        assert_eq!(w["shm"].2, "spin");
        assert_eq!(w.len(), 2);
    }

    #[test]
    fn host_side_runs() {
        let f = host_pingpong(0, 0, 20, true);
        assert_eq!(f.len(), 20);
        assert!(f.iter().all(|x| *x > 0.0));
        let t = host_timer(0, 5, Duration::from_micros(200));
        assert_eq!(t.len(), 5);
        assert!(t.iter().all(|x| *x >= 0.0));
        let b = busy_share(&[(10, 100)], &[(60, 200)]);
        assert_eq!(b, vec![0.5]);
    }
}
