//! `partition bench` (run by `partition-bench`): run benchmark sections, merge them into the
//! results file, and write the report beside it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use benchmarks::results::{self, Stored};
use benchmarks::sections::{self, Options};
use benchmarks::supervisor;

use crate::{EXIT_USAGE, EXIT_VMM_ERROR};

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
    /// Merge the sections of this results file (one a run elsewhere wrote, such as
    /// scripts/rig-bench.sh's inside the rig) into --results, as a run of them here would
    /// (an incomplete one never replaces a completed one), then write the report.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["only", "report", "quick"])]
    merge: Option<PathBuf>,
    /// Add the rows of the non-mwait idle policies of this results file's `exits` section
    /// (a run of its own, such as `RIG_BENCH_NO_QEMU=1 scripts/rig-bench.sh exits
    /// --exits-policies hlt`) to the completed `exits` section of --results, each row set
    /// naming the run it came from, then write the report.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["only", "report", "quick", "merge"])]
    merge_policy_rows: Option<PathBuf>,
    /// Measured runs per configuration (memsetup adds a discarded warm-up round; wake
    /// discards warm-up samples inside each run).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Results file (default: benchmarks/results/<hostname>.json under the current directory).
    #[arg(long, value_name = "FILE")]
    results: Option<PathBuf>,
    /// Length of one gap-detector window of the `noise` section, ms.
    #[arg(long, value_name = "MS", default_value_t = 2000, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    noise_ms: u64,
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
    /// Another build of `partition` to compare this one with (the `builds` section, which
    /// runs only with it).
    #[arg(long, value_name = "BIN")]
    baseline: Option<PathBuf>,
    /// An NVMe controller bound to vfio-pci for the `submit-vfio` section (DDDD:BB:DD.F):
    /// the partition, the bare host and QEMU drive it in turn.
    #[arg(long, value_name = "BDF")]
    vfio: Option<String>,
    /// Leave QEMU out of every section that would run it beside ours (each says so in its
    /// failures, as where QEMU is not installed): our rows alone, for a check of our own
    /// counts that a QEMU guest's failure must not decide.
    #[arg(long)]
    no_qemu: bool,
    /// Cloud Hypervisor's binary, a peer in `memsetup` (default: `cloud-hypervisor` on PATH;
    /// none: its rows say so). docs/benchmarks.md says how to build it.
    #[arg(long, value_name = "PATH", env = "PARTITION_CLOUD_HYPERVISOR")]
    cloud_hypervisor: Option<PathBuf>,
    /// Firecracker's binary, a peer in `memsetup` (default: `firecracker` on PATH; none:
    /// its rows say so). docs/benchmarks.md says how to build it.
    #[arg(long, value_name = "PATH", env = "PARTITION_FIRECRACKER")]
    firecracker: Option<PathBuf>,
    /// The Linux guest of the `exits` section: a directory with Debian's `vmlinux` and the
    /// initramfs `base.cpio` the Linux tests boot (scripts/rig-bench.sh exits makes it).
    #[arg(long, value_name = "DIR")]
    exits_guest: Option<PathBuf>,
    /// The `exits` section's loop counts: each loop runs N1 then N2 iterations (default
    /// 50,550; N1 < N2).
    #[arg(long, value_name = "N1,N2", value_parser = parse_counts)]
    exits_count: Option<(u64, u64)>,
    /// The `exits` section's idle policies for our partition, one row set each, in order
    /// (default mwait; any of auto, mwait, hlt, haltpoll, poll, shared): what each costs
    /// in exits on the same guest and loops.
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = parse_policy)]
    exits_policies: Option<Vec<String>>,
    /// What the baseline is, for the results (default: its path).
    #[arg(long, value_name = "TEXT", requires = "baseline")]
    baseline_label: Option<String>,
}

/// `N1,N2` with 0 < N1 < N2 <= 10^8.
fn parse_counts(s: &str) -> Result<(u64, u64), String> {
    s.split_once(',')
        .and_then(|(a, b)| Some((a.trim().parse::<u64>().ok()?, b.trim().parse::<u64>().ok()?)))
        .filter(|&(a, b)| a > 0 && a < b && b <= 100_000_000)
        .ok_or_else(|| format!("{s:?} is not N1,N2 with 0 < N1 < N2 <= 100000000"))
}

/// An idle policy's name.
fn parse_policy(s: &str) -> Result<String, String> {
    let w = s.trim();
    partition::cpu::idle::IdlePolicy::parse(w)
        .map(|p| p.name().to_string())
        .ok_or_else(|| {
            format!(
                "{w:?} is not an idle policy (one of {})",
                partition::cpu::idle::IdlePolicy::ALL
                    .map(|p| p.name())
                    .join(", ")
            )
        })
}

/// Writes the report after a merge: success, or a VMM error if it could not be written.
fn report_exit(results: &Path) -> ExitCode {
    if write_report(results) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_VMM_ERROR)
    }
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

/// `--merge-policy-rows FROM`: the other policies' rows of `from`'s exits section added to
/// the completed one of `results`.
fn merge_policy_rows(from: &Path, results: &Path) -> ExitCode {
    let exits_of = |p: &Path| {
        benchmarks::doc::Results::read(p)
            .map_err(|e| format!("{}: {e}", p.display()))?
            .exits
            .ok_or_else(|| format!("{}: no exits section", p.display()))
    };
    let (mut into, from_section) = match (exits_of(results), exits_of(from)) {
        (Ok(i), Ok(f)) => (i, f),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("partition: error: --merge-policy-rows: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let merged = match benchmarks::exits::merge_policy_rows(&mut into, &from_section) {
        Ok(m) => m,
        Err(e) => {
            eprintln!(
                "partition: error: --merge-policy-rows {}: {e}",
                from.display()
            );
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let value = match serde_json::to_value(&into) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("partition: error: --merge-policy-rows: {e}");
            return ExitCode::from(EXIT_VMM_ERROR);
        }
    };
    if let Err(e) = results::store_section(results, "exits", value) {
        eprintln!("partition: error: exits: {e}");
        return ExitCode::from(EXIT_VMM_ERROR);
    }
    eprintln!(
        "partition: bench: {} merged into {}'s exits section",
        merged.join(", "),
        results.display()
    );
    report_exit(results)
}

/// `--merge FROM`: each section of results file `from` stored into `results`.
fn merge(from: &Path, results: &Path) -> ExitCode {
    let bytes = match partition::sys::files::read_limited(from, benchmarks::doc::MAX_RESULTS) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("partition: error: --merge {}: {e}", from.display());
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let sections = match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(v) => match v.get("sections").and_then(|s| s.as_object()) {
            Some(s) => s.clone(),
            None => {
                eprintln!("partition: error: --merge {}: no sections", from.display());
                return ExitCode::from(EXIT_USAGE);
            }
        },
        Err(e) => {
            eprintln!("partition: error: --merge {}: {e}", from.display());
            return ExitCode::from(EXIT_USAGE);
        }
    };
    for (name, section) in sections {
        match results::store_section(results, &name, section) {
            Ok(Stored::Written) => {
                eprintln!("partition: bench: {name} merged into {}", results.display())
            }
            Ok(Stored::KeptEarlier) => eprintln!(
                "partition: bench: {name} is incomplete in {}; the completed one in {} is kept",
                from.display(),
                results.display()
            ),
            Err(e) => {
                eprintln!("partition: error: {name}: {e}");
                return ExitCode::from(EXIT_VMM_ERROR);
            }
        }
    }
    report_exit(results)
}

pub fn bench(a: BenchArgs) -> ExitCode {
    if let Some(p) = &a.exits_policies {
        if let Some(twice) = p
            .iter()
            .enumerate()
            .find_map(|(i, x)| p[..i].contains(x).then_some(x))
        {
            eprintln!("partition: error: --exits-policies: {twice:?} is named twice");
            return ExitCode::from(EXIT_USAGE);
        }
    }
    if a.list {
        for section in sections::ALL {
            for (name, what) in section.names() {
                println!("{name:10} {what}");
            }
        }
        return ExitCode::SUCCESS;
    }
    for s in &a.only {
        if !sections::known(s) {
            eprintln!("partition: error: --only: no section {s:?} (see --list)");
            return ExitCode::from(EXIT_USAGE);
        }
    }
    if a.only.iter().any(|s| s == "builds") && a.baseline.is_none() {
        eprintln!(
            "partition: error: --only builds needs --baseline BIN (another build to compare)"
        );
        return ExitCode::from(EXIT_USAGE);
    }
    if a.only.iter().any(|s| s == "exits") && a.exits_guest.is_none() {
        eprintln!(
            "partition: error: --only exits needs --exits-guest DIR (Debian's vmlinux and \
             base.cpio; scripts/rig-bench.sh exits makes it)"
        );
        return ExitCode::from(EXIT_USAGE);
    }
    if let Some(b) = &a.baseline {
        if !b.is_file() {
            eprintln!("partition: error: --baseline {}: not a file", b.display());
            return ExitCode::from(EXIT_USAGE);
        }
    }
    if a.runs == 0 {
        eprintln!("partition: error: --runs must be at least 1");
        return ExitCode::from(EXIT_USAGE);
    }
    let mut sizes = Vec::new();
    for s in &a.sizes {
        match partition::config::size::parse(s) {
            Ok(v) if v % (2 << 20) == 0 && v >= 16 << 20 => sizes.push(v),
            _ => {
                eprintln!(
                    "partition: error: --sizes: {s:?} is not a multiple of 2 MiB of at least 16 MiB"
                );
                return ExitCode::from(EXIT_USAGE);
            }
        }
    }
    let cwd = std::env::current_dir().unwrap_or_default();
    let results = a.results.unwrap_or_else(|| results::default_path(&cwd));
    if let Some(from) = &a.merge {
        return merge(from, &results);
    }
    if let Some(from) = &a.merge_policy_rows {
        return merge_policy_rows(from, &results);
    }
    if a.report {
        // The results file is the user's input: missing, not a regular file, too large or
        // not JSON is refused (exit 2); only writing the report can fail otherwise.
        let doc = match benchmarks::doc::Results::read(&results) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("partition: error: --results {e}");
                return ExitCode::from(EXIT_USAGE);
            }
        };
        return match benchmarks::report::write_from(&doc, &results) {
            Ok((md, svg)) => {
                eprintln!(
                    "partition: bench: report {} and chart {}",
                    md.display(),
                    svg.display()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("partition: bench: report: {e}");
                ExitCode::from(EXIT_VMM_ERROR)
            }
        };
    }
    let cores = partition::config::cores::available();
    if cores.len() < 2 {
        eprintln!("partition: error: benchmarks reserve a core and need another for the host");
        return ExitCode::from(EXIT_VMM_ERROR);
    }
    // The run itself happens in a child; this process stands by to give back what the run
    // holds if it is stopped (see `supervise`).
    let Some(work) = supervisor::supervised_work() else {
        return match supervisor::supervise() {
            Ok(Some(code)) => ExitCode::from(code),
            Ok(None) => ExitCode::from(EXIT_VMM_ERROR),
            Err(e) => {
                eprintln!("partition: error: {e}");
                ExitCode::from(EXIT_VMM_ERROR)
            }
        };
    };
    let env = benchmarks::Env {
        // The VMM the benchmarks launch: `partition`, beside this program.
        partition: std::env::current_exe()
            .map(|p| p.with_file_name("partition"))
            .unwrap_or_else(|_| "partition".into()),
        work: work.clone(),
        repo: cwd.join(".git").exists().then_some(cwd.clone()),
        qemu: (!a.no_qemu)
            .then(|| benchmarks::host::on_path("qemu-system-x86_64"))
            .flatten(),
        qemu_left_out: a.no_qemu,
        cloud_hypervisor: a
            .cloud_hypervisor
            .or_else(|| benchmarks::host::on_path("cloud-hypervisor")),
        firecracker: a
            .firecracker
            .or_else(|| benchmarks::host::on_path("firecracker")),
        runs: a.runs,
        core: *cores.last().unwrap_or(&1),
        host_core: cores[0],
        guest_image: Some(
            a.guest_image
                .unwrap_or_else(|| cwd.join("benchmarks/cache/guest-image/current")),
        ),
        lmbench: a.lmbench,
        baseline: a.baseline.map(|p| benchmarks::Baseline {
            label: a.baseline_label.unwrap_or_else(|| p.display().to_string()),
            partition: std::fs::canonicalize(&p).unwrap_or(p),
        }),
        vfio: a.vfio,
        exits_guest: a.exits_guest,
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
    let opts = Options {
        sizes,
        noise_ms: a.noise_ms,
        exits_count: a.exits_count,
        exits_policies: a.exits_policies.unwrap_or_default(),
    };
    let mut code = ExitCode::SUCCESS;
    for section in sections::ALL {
        let names: Vec<&str> = section
            .names()
            .iter()
            .map(|(n, _)| *n)
            .filter(|n| {
                wanted(n)
                    && (*n != "builds" || env.baseline.is_some())
                    && (*n != "exits" || env.exits_guest.is_some())
            })
            .collect();
        if names.is_empty() {
            continue;
        }
        eprintln!(
            "partition: bench {}: running ({} runs per configuration)",
            names.join(" and "),
            a.runs
        );
        // Dirty pages first: a build just before (scripts/bench.sh makes one, a baseline
        // another) leaves gigabytes to write back, and a launch's claim fsyncs the ledger,
        // which then waits behind them (a pool launch's claim took 212 ms right after 3 GB
        // were written, 2-18 ms otherwise, on the development host).
        // SAFETY: sync has no arguments and cannot fail.
        unsafe { libc::sync() };
        for (name, section) in section.run(&env, &opts, &wanted) {
            let completed = section.head().completed;
            let reason = section.head().reason.clone().unwrap_or_default();
            // A host limitation with a statement of it (`limitation`) qualifies numbers that
            // were measured; without one it says the section cannot run here at all.
            let limited = section.impossible_here();
            match results::store_section(&results, name, section.to_value()) {
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
