//! `noise`: what the host takes from the core a partition runs on. One gap detector
//! (tools/probe-guest/src/gaps.rs, included below, so both sides run the same code) reads
//! the TSC back to back for a window: in the probe guest's ring 3 in our partition
//! (`probe.bench=noise`; on the nested kvm_pvm host guest ring 3 runs natively, so the gaps
//! are real time), as a bare-host thread pinned to the same core (the twin), and in the
//! probe under QEMU microvm with its vCPU thread pinned there. Each case runs quiet and then
//! beside a noisy neighbour on the housekeeping core: stress-ng's cpu, vm, cache and timer
//! stressors (where stress-ng is installed) and a second probe guest launched ad hoc there
//! reading its disk over and over. Per run: the noise (us lost per second: the sum of gaps
//! over 1 us), the largest gap, gaps over 1/10/100 us per second, and the 99.99th
//! percentile gap; rows are medians over rounds with min-max spread. Beside the windows, two
//! of the VMM's paths in our partition, quiet and beside the same neighbour: the wake
//! round trip (the probe's IPI ping-pong between its two vCPUs) and the mapped doorbell's
//! submit to the engine's fence.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[path = "../../tools/probe-guest/src/gaps.rs"]
mod gaps;

use crate::doc::noise::{NoiseParams, NoiseRow, NoiseSection, PathRow};
use crate::head::Head;
use crate::host::pin;
use crate::placement::pin_and_start_qemu;
use crate::stats::summary;
use crate::{Env, Launch, Microvm, timed_run, timed_run_with};

/// One detector window, as either side reports it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Window {
    /// Its length, ms.
    pub ms: u64,
    /// TSC reads.
    pub samples: u64,
    /// Sum of the gaps over 1 us, ns.
    pub lost_ns: u64,
    /// The largest gap, ns.
    pub max_ns: u64,
    /// Gaps over 1, 10 and 100 us.
    pub over: [u64; 3],
    /// The 99.99th percentile gap (its bucket's upper bound), ns.
    pub p9999_ns: u64,
}

/// The per-run figures a row summarises, in the order [`Window::metrics`] gives them.
pub const METRICS: [&str; 6] = [
    "noise_us_per_s",
    "max_gap_us",
    "over_1us_per_s",
    "over_10us_per_s",
    "over_100us_per_s",
    "p9999_gap_ns",
];

impl Window {
    /// The per-run figures a row summarises, named by [`METRICS`].
    pub fn metrics(&self) -> [f64; 6] {
        let s = self.ms.max(1) as f64 / 1000.0;
        [
            self.lost_ns as f64 / 1000.0 / s,
            self.max_ns as f64 / 1000.0,
            self.over[0] as f64 / s,
            self.over[1] as f64 / s,
            self.over[2] as f64 / s,
            self.p9999_ns as f64,
        ]
    }

    /// The probe's `noise ...` line.
    pub fn parse(stdout: &str) -> Option<Self> {
        let line = stdout.lines().find_map(|l| {
            l.trim_end()
                .strip_prefix("probe: noise ")
                .filter(|r| r.starts_with("ms="))
        })?;
        let field = |k: &str| -> Option<u64> {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(k)?.strip_prefix('='))?
                .parse()
                .ok()
        };
        Some(Self {
            ms: field("ms")?,
            samples: field("samples")?,
            lost_ns: field("lost_ns")?,
            max_ns: field("max_ns")?,
            over: [field("over1us")?, field("over10us")?, field("over100us")?],
            p9999_ns: field("p9999_ns")?,
        })
    }
}

fn rdtsc() -> u64 {
    // SAFETY: RDTSC has no preconditions on x86-64.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// The host's TSC rate, kHz, against CLOCK_MONOTONIC over `over`.
pub fn host_tsc_khz(over: Duration) -> u64 {
    let (t0, c0) = (Instant::now(), rdtsc());
    std::thread::sleep(over);
    let (t1, c1) = (Instant::now(), rdtsc());
    let ns = (t1 - t0).as_nanos().max(1) as u64;
    (c1.wrapping_sub(c0)).saturating_mul(1_000_000) / ns
}

/// The detector for `ms` on the calling thread, wherever it runs.
fn detect(ms: u64, tsc_khz: u64) -> Window {
    let mut g = Box::new(gaps::Gaps::new(tsc_khz));
    gaps::run(rdtsc, ms * tsc_khz, &mut g);
    let ns = |t: u64| t * 1_000_000 / tsc_khz.max(1);
    Window {
        ms,
        samples: g.samples,
        lost_ns: ns(g.lost),
        max_ns: ns(g.max),
        over: g.over,
        p9999_ns: ns(g.quantile(9999, 10000)),
    }
}

/// The twin: the detector in a host thread pinned to `core`.
pub fn bare(core: usize, ms: u64, tsc_khz: u64) -> Result<Window, String> {
    std::thread::spawn(move || {
        pin(core);
        detect(ms, tsc_khz)
    })
    .join()
    .map_err(|_| "the bare-host detector thread panicked".to_string())
}

fn cmdline(ms: u64) -> String {
    format!("probe.memtest=0 probe.bench=noise probe.noise_ms={ms}")
}

/// Ours: the probe in a partition on `env.core`: ad hoc, or from the pool of the
/// reservation in `pool` (named, so it takes the reserved core and pool memory).
fn partition(env: &Env, pool: Option<&Path>, ms: u64) -> Result<Window, String> {
    let state = pool.map_or_else(|| env.work.join("noise-state"), Path::to_path_buf);
    let mut l = Launch::new(env, &state, &env.core.to_string(), "32M").probe();
    if pool.is_some() {
        l = l.name("noise");
    }
    let cmd = l.cmdline(&cmdline(ms)).command();
    let run = timed_run(cmd, Duration::from_millis(ms) + Duration::from_secs(60))
        .map_err(|e| e.to_string())?;
    Window::parse(&run.stdout).ok_or_else(|| {
        format!(
            "no noise line (exit {}): {}",
            run.status,
            run.stderr.lines().last().unwrap_or("")
        )
    })
}

/// QEMU microvm, its vCPU thread pinned to `env.core` and the rest to the housekeeping core.
fn qemu(env: &Env, probe: &Path, ms: u64, round: usize) -> Result<Window, String> {
    let qmp = env.work.join(format!("noise-qmp-{round}.sock"));
    let line = cmdline(ms);
    let mut c = Microvm {
        pin: None,
        smp: 1,
        mb: 32,
        acpi: false,
        prealloc: true,
        probe,
        cmdline: &line,
    }
    .command(env);
    c.args(["-name", "noise,debug-threads=on", "-S", "-qmp"])
        .arg(format!("unix:{},server=on,wait=off", qmp.display()));
    let (core, other) = (env.core, env.host_core);
    let run = timed_run_with(
        c,
        Duration::from_millis(ms) + Duration::from_secs(60),
        |pid| pin_and_start_qemu(pid, &qmp, core, other),
    )
    .map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&qmp);
    Window::parse(&run.stdout).ok_or_else(|| {
        format!(
            "no noise line (exit {}): {}",
            run.status,
            run.stderr.lines().last().unwrap_or("")
        )
    })
}

/// The noisy neighbour on the housekeeping core: stress-ng (where installed) and a probe
/// guest reading its disk, launched again each time it finishes; stopped on drop.
struct Neighbour {
    stop: Arc<AtomicBool>,
    guest: Option<std::thread::JoinHandle<()>>,
    stress: Option<Child>,
    /// What its guest's launches did so far.
    runs: Arc<std::sync::Mutex<GuestRuns>>,
}

/// The neighbour guest's launches: how many started, and the first that did not end well.
#[derive(Default)]
struct GuestRuns {
    started: usize,
    failed: Option<String>,
}

/// What the neighbour is, as the results say it.
fn describe(stress_ng: bool) -> String {
    format!(
        "on the housekeeping core: {}a probe guest launched ad hoc there (probe.blk=qd32,lat \
         over a 16 MiB disk, launched again as each run ends)",
        if stress_ng {
            "stress-ng --cpu 1 --vm 1 --vm-bytes 64M --cache 1 --timer 1 --timer-freq 4000, and "
        } else {
            "(stress-ng is not installed) "
        }
    )
}

fn stress_ng() -> Option<std::path::PathBuf> {
    crate::host::on_path("stress-ng")
}

impl Neighbour {
    /// The neighbour started and given a second to get going, when `wanted`.
    fn when(wanted: bool, env: &Env) -> Result<Option<Self>, String> {
        if !wanted {
            return Ok(None);
        }
        let n = Self::start(env).map_err(|e| format!("starting the neighbour: {e}"))?;
        std::thread::sleep(Duration::from_secs(1));
        Ok(Some(n))
    }

    fn start(env: &Env) -> Result<Self, String> {
        let disk = env.work.join("noise-neighbour.img");
        crate::host::make_image(&disk, 16 << 20).map_err(|e| format!("{}: {e}", disk.display()))?;
        let stress = match stress_ng() {
            Some(bin) => Some(
                Command::new("taskset")
                    .args(["-c", &env.host_core.to_string()])
                    .arg(bin)
                    .args([
                        "--cpu",
                        "1",
                        "--vm",
                        "1",
                        "--vm-bytes",
                        "64M",
                        "--cache",
                        "1",
                    ])
                    .args(["--timer", "1", "--timer-freq", "4000", "--timeout", "0"])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .map_err(|e| format!("stress-ng: {e}"))?,
            ),
            None => None,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let runs = Arc::new(std::sync::Mutex::new(GuestRuns::default()));
        let (s, partition, state, core, seen) = (
            stop.clone(),
            env.partition.clone(),
            env.work.join("noise-neighbour-state"),
            env.host_core,
            runs.clone(),
        );
        let guest = std::thread::spawn(move || {
            let runs = || seen.lock().unwrap_or_else(|e| e.into_inner());
            while !s.load(Ordering::Acquire) {
                let mut c = Command::new(&partition);
                c.env("PARTITION_STATE_DIR", &state)
                    .args(["launch", "--cores", &core.to_string(), "--memory", "32M"])
                    .arg("--probe")
                    .arg("--disk")
                    .arg(format!("path={}", disk.display()))
                    .args([
                        "--cmdline",
                        "probe.memtest=0 probe.blk=qd32,lat probe.blk_n=3000",
                    ]);
                runs().started += 1;
                let ended = timed_run(c, Duration::from_secs(120));
                if s.load(Ordering::Acquire) {
                    // Stopped from outside (its launch may have been cut short): not a run.
                    break;
                }
                let why = match ended {
                    Ok(r) if r.status.success() => continue,
                    Ok(r) => format!(
                        "its guest's launch exited {:?}: {}",
                        r.status.code(),
                        r.stderr.lines().last().unwrap_or("")
                    ),
                    Err(e) => format!("its guest did not run: {e}"),
                };
                runs().failed.get_or_insert(why);
            }
        });
        Ok(Self {
            stop,
            guest: Some(guest),
            stress,
            runs,
        })
    }

    /// Whether the neighbour is still doing its work: stress-ng (where installed) alive,
    /// its guest launched and none of its launches failed.
    fn running(&mut self) -> Result<(), String> {
        if let Some(c) = self.stress.as_mut() {
            match c.try_wait() {
                Ok(None) => {}
                Ok(Some(st)) => return Err(format!("the neighbour's stress-ng exited ({st})")),
                Err(e) => return Err(format!("the neighbour's stress-ng: {e}")),
            }
        }
        let r = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(why) = &r.failed {
            return Err(format!("the neighbour failed: {why}"));
        }
        if r.started == 0 {
            return Err("the neighbour's guest never launched".into());
        }
        Ok(())
    }
}

/// A case's rounds so far: its measurements, its failures, and the windows the neighbour
/// was seen running through (None: quiet).
type Gathered<T> = (Vec<T>, Vec<String>, Option<usize>);

/// A path's rounds so far: medians, p99s, failures, windows the neighbour ran through.
type PathGathered = (Vec<f64>, Vec<f64>, Vec<String>, Option<usize>);

/// After a window beside `n` (None: quiet): whether the neighbour ran through it, counted
/// in `seen`; Err is the window's failure.
fn neighbour_ran(n: &mut Option<Neighbour>, seen: &mut Option<usize>) -> Result<(), String> {
    match n {
        None => Ok(()),
        Some(n) => {
            n.running()?;
            *seen.get_or_insert(0) += 1;
            Ok(())
        }
    }
}

impl Drop for Neighbour {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(mut c) = self.stress.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(g) = self.guest.take() {
            let _ = g.join();
        }
    }
}

/// Runs the section with windows of `ms` milliseconds.
pub fn run(env: &Env, ms: u64) -> NoiseSection {
    let mut section = NoiseSection {
        head: Head::start(env),
        params: NoiseParams {
            runs: env.runs,
            core: env.core,
            neighbour_core: env.host_core,
            window_ms: ms,
            neighbour: describe(stress_ng().is_some()),
        },
        reserved_note: None,
        method: "per round, in an order rotated each round: the gap detector (TSC read back to \
                 back; noise = sum of gaps over 1 us) for one window as a bare-host thread \
                 pinned to the core, in the probe guest's ring 3 in our partition on that core \
                 (an ad hoc launch pinned there), and in the probe under QEMU microvm with its \
                 vCPU thread pinned there (-S, pinned over QMP, then started); all rounds \
                 quiet, then all rounds beside the neighbour. Rows: the median of the per-run \
                 values with min-max spread. Paths: per round, one wake guest (2 vCPUs on the \
                 neighbour's core and the measured one, the IPI round trip) and one engine \
                 guest (mapped doorbell, fence polled) under --idle auto, all rounds quiet, \
                 then all rounds beside the neighbour; the median of per-run medians."
            .into(),
        rows: None,
        paths: Vec::new(),
    };
    let probe = match crate::probe_image(env) {
        Ok(p) => p,
        Err(e) => {
            section.head.fail(format!("writing the probe image: {e}"));
            return section;
        }
    };
    let tsc_khz = host_tsc_khz(Duration::from_millis(200));
    let mut cases = vec!["bare", "partition"];
    if env.qemu.is_some() {
        cases.push("qemu");
    }
    let mut rows = Vec::new();
    // Phase 1: ad hoc, every case pinned to the core.
    if let Err(e) = phase(env, &cases, &mut rows, &|case, round| match case {
        "bare" => bare(env.core, ms, tsc_khz),
        "partition" => partition(env, None, ms),
        _ => qemu(env, &probe, ms, round),
    }) {
        section.head.fail(e);
        section.rows = Some(rows);
        return section;
    }
    // The wake round trip and the submit-to-fence, quiet and beside the neighbour.
    match paths(env) {
        Ok(p) => section.paths = p,
        Err(e) => {
            section.head.fail(e);
            section.rows = Some(rows);
            return section;
        }
    }
    // Phase 2: the core reserved (`partition reserve`: taken out of every other cpuset), a
    // pool partition there and the twin joined to the reservation's guests cpuset.
    let mut expected = 2 * cases.len();
    match Reservation::take(env) {
        Ok(r) => {
            let reserved: &[&'static str] = if r.guests.is_some() {
                &["bare-reserved", "partition-reserved"]
            } else {
                &["partition-reserved"]
            };
            expected += 2 * reserved.len();
            let guests = r.guests.clone();
            if let Err(e) = phase(env, reserved, &mut rows, &|case, _| match (case, &guests) {
                ("bare-reserved", Some(g)) => bare_in(g, env.core, ms, tsc_khz),
                _ => partition(env, Some(&r.state), ms),
            }) {
                section.head.fail(e);
            }
            section.reserved_note = r.why_no_twin_note();
        }
        Err(e) => {
            section.reserved_note = Some(format!("no reserved-core rows: {e}"));
            expected += 1;
        }
    }
    let complete = rows.len() == expected
        && rows.iter().all(|r| r.failures.is_empty())
        && section.paths.iter().all(|p| p.failures.is_empty());
    section.rows = Some(rows);
    section.head.finish(complete, || {
        "a case or a path failed in some run (its row says why), or the reserved core could \
         not be had"
            .into()
    });
    section
}

/// All rounds of `cases` quiet, then all again beside the neighbour; a row per case each.
fn phase(
    env: &Env,
    cases: &[&'static str],
    rows: &mut Vec<NoiseRow>,
    measure: &dyn Fn(&str, usize) -> Result<Window, String>,
) -> Result<(), String> {
    for neighbour in [false, true] {
        let mut n = Neighbour::when(neighbour, env)?;
        let mut got: BTreeMap<&str, Gathered<Window>> = BTreeMap::new();
        for round in 0..env.runs {
            let mut order = cases.to_vec();
            order.rotate_left(round % cases.len());
            for case in order {
                let e = got.entry(case).or_default();
                let w = measure(case, round);
                match neighbour_ran(&mut n, &mut e.2) {
                    Err(why) => e.1.push(format!("round {round}: {why}")),
                    Ok(()) => match w {
                        Ok(w) => e.0.push(w),
                        Err(why) => e.1.push(why),
                    },
                }
            }
        }
        for case in cases {
            let (windows, failures, neighbour_windows) = got.remove(case).unwrap_or_default();
            let mut metrics = BTreeMap::new();
            for (i, name) in METRICS.iter().enumerate() {
                let v: Vec<f64> = windows.iter().map(|w| w.metrics()[i]).collect();
                if let Some(s) = summary(&v) {
                    metrics.insert(name.to_string(), s);
                }
            }
            rows.push(NoiseRow {
                case: case.to_string(),
                neighbour,
                metrics,
                failures,
                neighbour_windows,
            });
        }
    }
    Ok(())
}

/// The wake round trip and the mapped doorbell's submit-to-fence in our partition under the
/// idle policy a launch gets by default (`auto`), every round quiet, then every round beside
/// the neighbour. On a host of two cores both paths have an end on the neighbour's core (the
/// wake guest's first vCPU, the engine's thread): what the neighbour does to them is what
/// these rows show.
fn paths(env: &Env) -> Result<Vec<PathRow>, String> {
    let policy = "auto";
    let mut rows = Vec::new();
    for neighbour in [false, true] {
        let mut n = Neighbour::when(neighbour, env)?;
        // (medians, p99s, failures, windows the neighbour ran through) per path; the mode
        // the wake guest waited in.
        let mut got: [PathGathered; 2] = Default::default();
        let mut mode = None;
        for round in 0..env.runs {
            let wake = crate::wake::guest_once(env, policy);
            if let Err(why) = neighbour_ran(&mut n, &mut got[0].3) {
                got[0].2.push(format!("round {round}: {why}"));
            } else {
                match wake {
                    Ok(lines) => match lines.get("ipi") {
                        Some((m, p, how)) => {
                            got[0].0.push(*m);
                            got[0].1.push(*p);
                            mode = Some(how.clone());
                        }
                        None => got[0].2.push("no ipi line (one vCPU?)".into()),
                    },
                    Err(e) => got[0].2.push(e),
                }
            }
            let fence = crate::submit::mapped_fence_once(env, policy);
            if let Err(why) = neighbour_ran(&mut n, &mut got[1].3) {
                got[1].2.push(format!("round {round}: {why}"));
                continue;
            }
            match fence {
                Ok((m, p)) => {
                    got[1].0.push(m);
                    got[1].1.push(p);
                }
                Err(e) => got[1].2.push(e),
            }
        }
        for (path, (medians, p99s, failures, neighbour_windows)) in
            ["wake-ipi", "submit-fence"].into_iter().zip(got)
        {
            let policy = match (&mode, path) {
                (Some(m), "wake-ipi") => format!("{policy} (waited in {m})"),
                _ => policy.to_string(),
            };
            rows.push(PathRow {
                path: path.into(),
                neighbour,
                policy,
                median_ns: summary(&medians),
                p99_ns: summary(&p99s),
                failures,
                neighbour_windows,
            });
        }
    }
    Ok(rows)
}

/// A reservation of the measured core for phase 2, given back on drop.
struct Reservation {
    partition: std::path::PathBuf,
    state: std::path::PathBuf,
    /// The cgroup v1 cpuset the reservation keeps for guests, which a host thread joins to
    /// run on the reserved core (None: no such cpuset, and why in `why_no_twin`).
    guests: Option<std::path::PathBuf>,
    why_no_twin: String,
}

impl Reservation {
    fn take(env: &Env) -> Result<Self, String> {
        let state = env.work.join("noise-pool");
        let out = Command::new(&env.partition)
            .env("PARTITION_STATE_DIR", &state)
            .args([
                "reserve",
                "--memory",
                "64M",
                "--cores",
                &env.core.to_string(),
            ])
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "partition reserve: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let ledger: serde_json::Value = std::fs::read_to_string(state.join("ledger.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default();
        let iso = &ledger["cores"]["isolation"];
        let (guests, why) = match iso["kind"].as_str() {
            Some("cgroup-v1") => (iso["guests"].as_str().map(Into::into), String::new()),
            Some(k) => (
                None,
                format!(
                    "the reservation's isolation is {k}: a host thread cannot join it without \
                     moving its whole process (cgroup v2 moves processes), so no reserved twin"
                ),
            ),
            None => (None, "the ledger names no isolation".into()),
        };
        Ok(Self {
            partition: env.partition.clone(),
            state,
            guests,
            why_no_twin: why,
        })
    }

    fn why_no_twin_note(&self) -> Option<String> {
        (!self.why_no_twin.is_empty()).then(|| self.why_no_twin.clone())
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let _ = Command::new(&self.partition)
            .env("PARTITION_STATE_DIR", &self.state)
            .arg("unreserve")
            .output();
    }
}

/// The twin inside the reservation: a thread that joins the guests cpuset (cgroup v1
/// `tasks` takes a thread id), pins itself to the reserved core and runs the detector.
fn bare_in(guests: &Path, core: usize, ms: u64, tsc_khz: u64) -> Result<Window, String> {
    let tasks = guests.join("tasks");
    std::thread::spawn(move || {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        std::fs::write(&tasks, tid.to_string()).map_err(|e| format!("{}: {e}", tasks.display()))?;
        pin(core);
        Ok(detect(ms, tsc_khz))
        // The thread ends here, and leaves the cpuset with it.
    })
    .join()
    .map_err(|_| "the reserved twin's thread panicked".to_string())?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_line_parses_and_its_metrics_are_per_second() {
        let out = "probe: hello\nprobe: noise ms=2000 tsc_khz=2445422 samples=90000000 \
                   lost_ns=4000000 max_ns=250000 over1us=300 over10us=40 over100us=2 \
                   p9999_ns=235\nprobe: result ok status=0\n";
        let w = Window::parse(out).unwrap();
        assert_eq!(w.over, [300, 40, 2]);
        let m: BTreeMap<&str, f64> = METRICS.into_iter().zip(w.metrics()).collect();
        assert_eq!(m["noise_us_per_s"], 2000.0);
        assert_eq!(m["max_gap_us"], 250.0);
        assert_eq!(m["over_1us_per_s"], 150.0);
        assert_eq!(m["over_100us_per_s"], 1.0);
        assert_eq!(m["p9999_gap_ns"], 235.0);
        assert_eq!(Window::parse("probe: noise ms=1 samples=x"), None);
        assert_eq!(Window::parse("probe: hello"), None);
    }

    #[test]
    fn the_histogram_buckets_hold_their_gaps() {
        for g in [
            0u64,
            1,
            7,
            8,
            9,
            15,
            16,
            17,
            100,
            1000,
            123_456,
            u64::MAX / 3,
        ] {
            let b = gaps::bucket(g);
            assert!(
                gaps::bucket_top(b) >= g,
                "{g}: bucket {b} tops at {}",
                gaps::bucket_top(b)
            );
            if b > 0 {
                assert!(gaps::bucket_top(b - 1) < g, "{g}: bucket {b}");
            }
        }
        // 12.5 % wide above 8 ticks.
        let b = gaps::bucket(1000);
        assert!(gaps::bucket_top(b) - gaps::bucket_top(b - 1) <= 1000 / 8 + 1);
        let mut g = gaps::Gaps::new(1_000_000); // 1 GHz: 1000 ticks a microsecond
        for _ in 0..9_999 {
            g.add(20);
        }
        g.add(50_000);
        assert_eq!(g.samples, 10_000);
        assert_eq!((g.lost, g.max, g.over), (50_000, 50_000, [1, 1, 0]));
        assert!(g.quantile(9999, 10000) <= 23, "{}", g.quantile(9999, 10000));
        assert!(g.quantile(1, 1) >= 50_000);
    }

    #[test]
    fn the_twin_measures_a_window_of_the_length_asked() {
        let khz = host_tsc_khz(Duration::from_millis(50));
        assert!(khz > 100_000, "a TSC of {khz} kHz");
        let w = bare(0, 20, khz).unwrap();
        assert_eq!(w.ms, 20);
        assert!(w.samples > 1000 && w.max_ns > 0, "{w:?}");
    }
}
