//! `partition bench`: run benchmark sections, merge them into the results file, and write
//! the report beside it.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use benchmarks::results::{self, Stored};
use serde_json::Value;

use partition::signals::{self, SignalGuard};

use crate::{EXIT_USAGE, EXIT_VMM_ERROR};

/// Set by the supervisor for the child that does the run: its scratch directory.
const WORK_ENV: &str = "PARTITION_BENCH_WORK";

/// Sections, in the order `bench` runs them.
const SECTIONS: &[(&str, &str)] = &[
    (
        "host",
        "the hotpaths suite (lmbench's loops: syscalls, signals, context switch, pipe, AF_UNIX, fork/exec, memory latency and bandwidth) on the bare host, pinned to the partition's cores; alternates with `guest`",
    ),
    (
        "guest",
        "the same suite in a Linux partition on those cores, per idle policy (needs scripts/guest-image.sh; on a host that cannot run Linux guests it says why)",
    ),
    (
        "probe",
        "the VMM's own paths from the probe guest (CPUID, port and MMIO exits, ioeventfd doorbell) and its memory-latency staircase against the same chase on the host; ours with and without ioeventfd, and QEMU microvm",
    ),
    (
        "crosscheck",
        "our bare-host figures against lmbench, stress-ng, cyclictest and fio run in the same session",
    ),
    (
        "wake",
        "the price of a fast wakeup per idle policy: timer lateness, IPI and shared-memory ping-pong in a 2-vCPU probe guest vs futex/spin/clock_nanosleep on the bare host; idle busy share and energy; QEMU microvm default and cpu-pm=on",
    ),
    (
        "blk",
        "4 KiB reads at depth 1 (and depth 32, GET_ID fences, a 64 MiB sequential read): host pread/io_uring warm and O_DIRECT vs the probe guest over exit notify, ioeventfd, ioeventfd+polling, O_DIRECT vs QEMU microvm virtio-blk (io_uring, iothread+polling)",
    ),
    (
        "memsetup",
        "launch to first serial byte and its memory-setup part: pool vs fresh anonymous (prefault) vs fresh hugetlb vs QEMU microvm -mem-prealloc, 256 MiB to 8 GiB",
    ),
];

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Run only these sections (comma-separated; see --list).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// List the sections and exit.
    #[arg(long)]
    list: bool,
    /// A minute's look, printed and not stored: the host's hot paths, the probe guest's
    /// exit paths and its memory staircase against the host's.
    #[arg(long, conflicts_with_all = ["only", "report"])]
    quick: bool,
    /// Only rewrite the report (<results>.md and its chart) from the results file.
    #[arg(long)]
    report: bool,
    /// Measured runs per configuration (memsetup adds a discarded warm-up round; wake
    /// discards warm-up samples inside each run).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Results file (default: benchmarks/results/<hostname>.json under the current directory).
    #[arg(long, value_name = "FILE")]
    results: Option<PathBuf>,
    /// memsetup sizes, largest last (default 256M,1G,4G,8G).
    #[arg(long, value_delimiter = ',', value_name = "SIZES")]
    sizes: Vec<String>,
    /// The Linux guest image for `guest` (default: benchmarks/cache/guest-image/current,
    /// which scripts/guest-image.sh makes).
    #[arg(long, value_name = "DIR")]
    guest_image: Option<PathBuf>,
    /// lmbench's binaries for `crosscheck` (scripts/bench.sh unpacks Debian's package).
    #[arg(long, value_name = "DIR", env = "PARTITION_LMBENCH")]
    lmbench: Option<PathBuf>,
}

fn write_report(results: &Path) -> bool {
    match benchmarks::report::write(results) {
        Ok((md, svg)) => {
            eprintln!(
                "partition: bench: report {} and chart {}",
                md.display(),
                svg.display()
            );
            true
        }
        Err(e) => {
            eprintln!("partition: bench: report: {e}");
            false
        }
    }
}

pub fn bench(a: BenchArgs) -> ExitCode {
    if a.list {
        for (name, what) in SECTIONS {
            println!("{name:10} {what}");
        }
        return ExitCode::SUCCESS;
    }
    for s in &a.only {
        if !SECTIONS.iter().any(|(n, _)| n == s) {
            eprintln!("partition: error: --only: no section {s:?} (see --list)");
            return ExitCode::from(EXIT_USAGE);
        }
    }
    if a.runs == 0 {
        eprintln!("partition: error: --runs must be at least 1");
        return ExitCode::from(EXIT_USAGE);
    }
    let mut sizes = Vec::new();
    for s in &a.sizes {
        match partition::size::parse(s) {
            Ok(v) if v % (2 << 20) == 0 && v >= 16 << 20 => sizes.push(v),
            _ => {
                eprintln!(
                    "partition: error: --sizes: {s:?} is not a multiple of 2 MiB of at least 16 MiB"
                );
                return ExitCode::from(EXIT_USAGE);
            }
        }
    }
    if sizes.is_empty() {
        sizes = benchmarks::memsetup::default_sizes();
    }
    let cwd = std::env::current_dir().unwrap_or_default();
    let results = a.results.unwrap_or_else(|| results::default_path(&cwd));
    if a.report {
        return if write_report(&results) {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(EXIT_VMM_ERROR)
        };
    }
    let cores = partition::cores::available();
    if cores.len() < 2 {
        eprintln!("partition: error: benchmarks reserve a core and need another for the host");
        return ExitCode::from(EXIT_VMM_ERROR);
    }
    // The run itself happens in a child; this process stands by to give back what the run
    // holds if it is stopped (see `supervise`).
    let Some(work) = supervised_work() else {
        return supervise();
    };
    let env = benchmarks::Env {
        partition: std::env::current_exe().unwrap_or_else(|_| "partition".into()),
        work: work.clone(),
        repo: cwd.join(".git").exists().then_some(cwd.clone()),
        qemu: which("qemu-system-x86_64"),
        runs: a.runs,
        core: *cores.last().unwrap_or(&1),
        host_core: cores[0],
        guest_image: Some(
            a.guest_image
                .unwrap_or_else(|| cwd.join("benchmarks/cache/guest-image/current")),
        ),
        lmbench: a.lmbench,
    };
    if a.quick {
        let r = benchmarks::quick::run(&env);
        let _ = std::fs::remove_dir_all(&work);
        return match r {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("partition: bench --quick: {e}");
                ExitCode::from(EXIT_VMM_ERROR)
            }
        };
    }
    let wanted = |n: &str| a.only.is_empty() || a.only.iter().any(|s| s == n);
    let mut code = ExitCode::SUCCESS;
    let mut done_host_guest = false;
    for (name, _) in SECTIONS {
        // host and guest run together (they alternate), announced once.
        if !wanted(name) || (matches!(*name, "host" | "guest") && done_host_guest) {
            continue;
        }
        let label = match *name {
            "host" | "guest" => ["host", "guest"]
                .into_iter()
                .filter(|s| wanted(s))
                .collect::<Vec<_>>()
                .join(" and "),
            _ => name.to_string(),
        };
        eprintln!(
            "partition: bench {label}: running ({} runs per configuration)",
            a.runs
        );
        let sections: Vec<(&str, Value)> = match *name {
            "host" | "guest" => {
                done_host_guest = true;
                benchmarks::hotpaths::run(&env, wanted("host"), wanted("guest"))
            }
            "probe" => vec![("probe", benchmarks::probe::run(&env))],
            "crosscheck" => vec![("crosscheck", benchmarks::crosscheck::run(&env))],
            "memsetup" => vec![("memsetup", benchmarks::memsetup::run(&env, &sizes))],
            "wake" => vec![("wake", benchmarks::wake::run(&env))],
            "blk" => vec![("blk", benchmarks::blk::run(&env))],
            _ => continue,
        };
        for (name, section) in sections {
            let completed = section["completed"].as_bool().unwrap_or(false);
            let reason = section["reason"].as_str().unwrap_or("").to_string();
            // A host limitation with a statement of it (`limitation`) qualifies numbers that
            // were measured; without one it says the section cannot run here at all.
            let limited =
                !completed && section["host_limitation"] == true && section["limitation"].is_null();
            match results::store_section(&results, name, section) {
                Ok(Stored::Written) => eprintln!(
                    "partition: bench {name}: {} written to {}",
                    if completed {
                        "completed,"
                    } else {
                        "INCOMPLETE,"
                    },
                    results.display()
                ),
                Ok(Stored::KeptEarlier) => eprintln!(
                    "partition: bench {name}: did not complete; the earlier completed result in {} was kept",
                    results.display()
                ),
                Err(e) => {
                    eprintln!("partition: bench {name}: {e}");
                    code = ExitCode::from(EXIT_VMM_ERROR);
                }
            }
            if limited {
                eprintln!("partition: bench {name}: not possible on this host: {reason}");
            } else if !completed {
                eprintln!("partition: bench {name}: not complete: {reason}");
                code = ExitCode::from(EXIT_VMM_ERROR);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&work);
    if !write_report(&results) {
        code = ExitCode::from(EXIT_VMM_ERROR);
    }
    code
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_string_lossy()
        .split(':')
        .map(|d| PathBuf::from(d).join(name))
        .find(|p| p.is_file())
}

/// The scratch directory `supervise` made for this process, if it is the run. The run
/// removes it at the end, so an inherited or hand-set variable naming anything else
/// (another directory, a supervisor that is not our parent) is ignored.
fn supervised_work() -> Option<PathBuf> {
    let work = PathBuf::from(std::env::var_os(WORK_ENV)?);
    // SAFETY: getppid has no arguments and cannot fail.
    let parent = unsafe { libc::getppid() };
    (work == scratch_dir(parent as u32)).then_some(work)
}

/// The scratch directory of the supervisor with pid `pid`.
fn scratch_dir(pid: u32) -> PathBuf {
    std::env::temp_dir().join(format!("partition-bench-{pid}"))
}

/// Runs this same command as a child (the run) and waits for it. If the run is stopped
/// (Ctrl-C, SIGTERM, SIGHUP), or ends leaving something behind, this process gives it back:
/// every process the run started is stopped (SIGTERM, SIGKILL after 10 s; as child
/// subreaper it sees the orphans too), partitions in the run's state directories are
/// released and their reservations undone, mounts under the scratch directory unmounted,
/// the hugepage count put back to what it was, and the scratch directory removed. The
/// exit status is the run's, or 128+N when stopped by signal N.
fn supervise() -> ExitCode {
    let work = scratch_dir(std::process::id());
    if let Err(e) = std::fs::create_dir_all(&work) {
        eprintln!("partition: error: {}: {e}", work.display());
        return ExitCode::from(EXIT_VMM_ERROR);
    }
    let hugepages = benchmarks::HugepageCount::read();
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes an integer flag; no pointers.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let guard = match SignalGuard::new() {
        Ok(g) => g,
        Err(e) => {
            eprintln!("partition: error: blocking SIGINT/SIGTERM: {e}");
            let _ = std::fs::remove_dir(&work);
            return ExitCode::from(EXIT_VMM_ERROR);
        }
    };
    let exe = std::env::current_exe().unwrap_or_else(|_| "partition".into());
    let mut cmd = Command::new(exe);
    cmd.args(std::env::args_os().skip(1)).env(WORK_ENV, &work);
    guard.unblocked_in(&mut cmd);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("partition: error: starting the run: {e}");
            let _ = std::fs::remove_dir(&work);
            return ExitCode::from(EXIT_VMM_ERROR);
        }
    };
    let run = child.id() as i32;
    let code: u8 = loop {
        if let Some(sig) = guard.wait(Duration::from_millis(200)) {
            eprintln!(
                "partition: bench: stopped by {}; stopping the run and giving back what it holds",
                signals::name(sig)
            );
            break 128 + sig as u8;
        }
        match child.try_wait() {
            Ok(Some(st)) => {
                use std::os::unix::process::ExitStatusExt;
                break st
                    .code()
                    .map(|c| c as u8)
                    .unwrap_or_else(|| 128 + st.signal().unwrap_or(0) as u8);
            }
            Ok(None) => reap_orphans(run),
            Err(e) => {
                eprintln!("partition: bench: waiting for the run: {e}");
                break EXIT_VMM_ERROR;
            }
        }
    };
    let stopped = stop_descendants();
    let _ = child.try_wait();
    let mut left = give_back(&work, hugepages);
    if stopped > 0 {
        left.insert(
            0,
            format!("stopped what the run had started ({stopped} processes)"),
        );
    }
    for l in &left {
        eprintln!("partition: bench: cleanup: {l}");
    }
    ExitCode::from(code)
}

/// (pid, parent pid, state letter) of every process.
fn processes() -> Vec<(i32, i32, char)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let st = partition::ledger::proc_stat(pid)?;
            Some((pid as i32, st.ppid as i32, st.state))
        })
        .collect()
}

/// Live processes below `root` (not `root`), and zombies that are `root`'s children.
fn descendants(root: i32) -> (Vec<i32>, Vec<i32>) {
    let all = processes();
    let (mut live, mut zombies) = (Vec::new(), Vec::new());
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for &(pid, ppid, state) in &all {
            if ppid != p {
                continue;
            }
            if state == 'Z' {
                if p == root {
                    zombies.push(pid);
                }
            } else {
                live.push(pid);
                frontier.push(pid);
            }
        }
    }
    (live, zombies)
}

/// Waits for our zombie children (orphans of the run that ended), leaving `keep` (the
/// run, whose status `Child::try_wait` collects). One waitid peek while there are none:
/// this runs beside the measurements, so it must not scan /proc.
fn reap_orphans(keep: i32) {
    loop {
        // SAFETY: siginfo_t is plain data; all-zero is valid and means "no child".
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid fills `info`, a valid siginfo_t; WNOWAIT leaves the child
        // waitable.
        let rc = unsafe {
            libc::waitid(
                libc::P_ALL,
                0,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        // SAFETY: si_pid is valid in a siginfo_t that waitid filled for WEXITED.
        let pid = unsafe { info.si_pid() };
        if rc != 0 || pid == 0 || pid == keep {
            return;
        }
        // SAFETY: waitpid on our own child that has exited, with a null status pointer.
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
    }
}

/// Stops every process below this one: SIGTERM (a partition tears down on it), SIGKILL
/// for what is left after 10 s. Returns how many there were.
fn stop_descendants() -> usize {
    // SAFETY: getpid has no arguments and cannot fail.
    let me = unsafe { libc::getpid() };
    let start = Instant::now();
    let mut seen = HashSet::new();
    loop {
        let (live, zombies) = descendants(me);
        for z in zombies {
            // SAFETY: waitpid on our own child that has exited, with a null status pointer.
            unsafe { libc::waitpid(z, std::ptr::null_mut(), libc::WNOHANG) };
        }
        if live.is_empty() {
            return seen.len();
        }
        let late = start.elapsed() > Duration::from_secs(10);
        if start.elapsed() > Duration::from_secs(20) {
            eprintln!("partition: bench: cleanup: processes {live:?} would not stop");
            return seen.len();
        }
        for p in live {
            if seen.insert(p) || late {
                let sig = if late { libc::SIGKILL } else { libc::SIGTERM };
                // SAFETY: signalling a process below ours, found in /proc just now.
                unsafe { libc::kill(p, sig) };
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Gives back what a run left under `work`, then removes it; returns what it did or could
/// not do (nothing for a run that cleaned up after itself).
fn give_back(work: &Path, hugepages: u64) -> Vec<String> {
    let mut said = Vec::new();
    let dirs = std::fs::read_dir(work)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_else(|_| Vec::new());
    for d in dirs {
        let Ok(st) = partition::partitions::status(&d) else {
            continue;
        };
        if !st.reserved {
            continue;
        }
        for p in &st.partitions {
            match partition::partitions::release(&d, &p.name, Duration::from_secs(2)) {
                Ok(_) => said.push(format!("partition {} released", p.name)),
                Err(e) => said.push(format!("releasing partition {}: {e}", p.name)),
            }
        }
        match partition::reserve::unreserve(&d) {
            Ok(r) => {
                said.push(format!("reservation in {} given back", d.display()));
                said.extend(r.warnings);
            }
            Err(e) => said.push(format!(
                "giving back the reservation in {}: {e}",
                d.display()
            )),
        }
    }
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    for m in mounts.lines().filter_map(|l| l.split_whitespace().nth(1)) {
        let m = m.replace("\\040", " ");
        if Path::new(&m).starts_with(work) {
            match pool::hugetlbfs::umount(Path::new(&m)) {
                Ok(()) => said.push(format!("{m} unmounted")),
                Err(e) => said.push(e.to_string()),
            }
        }
    }
    let now = benchmarks::HugepageCount::read();
    if now != hugepages {
        let back = benchmarks::HugepageCount::set(hugepages);
        said.push(if back == hugepages {
            format!("hugepage count put back from {now} to {hugepages}")
        } else {
            format!("hugepage count is {back}, not the {hugepages} it was (pages in use)")
        });
    }
    match std::fs::remove_dir_all(work) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            said.push(format!("{}: {e}", work.display()))
        }
        _ => {}
    }
    said
}
