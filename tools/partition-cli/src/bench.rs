//! `partition bench`: run benchmark sections and merge them into the results file.

use std::path::PathBuf;
use std::process::ExitCode;

use benchmarks::results::{self, Stored};

use crate::{EXIT_USAGE, EXIT_VMM_ERROR};

/// Sections, in the order `bench` runs them.
const SECTIONS: &[(&str, &str)] = &[
    (
        "memsetup",
        "launch to first serial byte and its memory-setup part: pool vs fresh anonymous (prefault) vs fresh hugetlb vs QEMU microvm -mem-prealloc, 256 MiB to 8 GiB",
    ),
    (
        "wake",
        "the price of a fast wakeup per idle policy: timer lateness, IPI and shared-memory ping-pong in a 2-vCPU probe guest vs futex/spin/clock_nanosleep on the bare host; idle busy share and energy; QEMU microvm default and cpu-pm=on",
    ),
    (
        "blk",
        "4 KiB reads at depth 1 (and depth 32, GET_ID fences, a 64 MiB sequential read): host pread/io_uring warm and O_DIRECT vs the probe guest over exit notify, ioeventfd, ioeventfd+polling, O_DIRECT vs QEMU microvm virtio-blk (io_uring, iothread+polling)",
    ),
];

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Run only these sections (comma-separated).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// List the sections and exit.
    #[arg(long)]
    list: bool,
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
    };
    let mut code = ExitCode::SUCCESS;
    for (name, _) in SECTIONS {
        if !a.only.is_empty() && !a.only.iter().any(|s| s == name) {
            continue;
        }
        eprintln!(
            "partition: bench {name}: running ({} runs per configuration)",
            a.runs
        );
        let section = match *name {
            "memsetup" => benchmarks::memsetup::run(&env, &sizes),
            "wake" => benchmarks::wake::run(&env),
            "blk" => benchmarks::blk::run(&env),
            _ => continue,
        };
        let completed = section["completed"].as_bool().unwrap_or(false);
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
        if !completed {
            code = ExitCode::from(EXIT_VMM_ERROR);
        }
    }
    let _ = std::fs::remove_dir_all(&work);
    code
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_string_lossy()
        .split(':')
        .map(|d| PathBuf::from(d).join(name))
        .find(|p| p.is_file())
}
