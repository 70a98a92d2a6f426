//! `partition bench`: run benchmark sections, merge them into the results file, and write
//! the report beside it.

use std::path::PathBuf;
use std::process::ExitCode;

use benchmarks::results::{self, Stored};
use serde_json::Value;

use crate::{EXIT_USAGE, EXIT_VMM_ERROR};

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

fn write_report(results: &std::path::Path) -> bool {
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
    let work = std::env::temp_dir().join(format!("partition-bench-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&work);
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
        if !wanted(name) {
            continue;
        }
        eprintln!(
            "partition: bench {name}: running ({} runs per configuration)",
            a.runs
        );
        let sections: Vec<(&str, Value)> = match *name {
            "host" | "guest" => {
                if done_host_guest {
                    continue;
                }
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
            let limited = !completed && section["host_limitation"] == true;
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
