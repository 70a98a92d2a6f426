//! `partition-bench`: the benchmarks, a program apart from the VMM. `partition bench ...`
//! and `partition hotpaths-binary ...` replace themselves with this program (installed
//! beside `partition`), so the VMM binary carries no benchmark code and no embedded
//! hotpaths (docs/architecture.md, docs/benchmarks.md). Exit status as `partition`'s.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod embedded;

use partition::machine::outcome::status::{USAGE as EXIT_USAGE, VMM_ERROR as EXIT_VMM_ERROR};

/// The hotpaths benchmark (benchmarks/hotpaths), a static binary, built by build.rs.
static HOTPATHS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/hotpaths"));

#[derive(Parser)]
#[command(
    name = "partition",
    bin_name = "partition",
    version,
    about = "The benchmarks of `partition` (run as `partition bench` and `partition hotpaths-binary`)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Measure: write benchmark sections into benchmarks/results/<host>.json, then the
    /// report (<host>.md) and chart (<host>-ratios.svg) beside it.
    ///
    /// Sections (`--list` says what each measures): host, guest, probe, crosscheck, wake,
    /// blk, submit, submit-vfio (only with --vfio), exits (only with --exits-guest; the rig:
    /// scripts/rig-bench.sh exits), memsetup, sandbox, builds (only with --baseline).
    /// Benchmarks
    /// use state directories, pools and hugepages of their own and give them back;
    /// `--quick` prints a minute's look instead of storing anything.
    Bench(Box<bench::BenchArgs>),
    /// Write the built-in hotpaths benchmark (a static binary) to a file: for a guest
    /// image (scripts/guest-image.sh), or to run by hand (`hotpaths --help`).
    HotpathsBinary {
        /// Where to write it (made executable).
        #[arg(short, long)]
        output: PathBuf,
    },
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .format_timestamp_millis()
        .init();
    match Cli::parse().cmd {
        Cmd::Bench(a) => bench::bench(*a),
        Cmd::HotpathsBinary { output } => embedded::write_out(&output, HOTPATHS, 0o755),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn bench_help_names_every_section() {
        let mut cmd = super::Cli::command();
        let help = cmd
            .find_subcommand_mut("bench")
            .expect("a bench subcommand")
            .render_long_help()
            .to_string();
        // Whole words: "submit-vfio" does not name "submit".
        let words: Vec<&str> = help
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .collect();
        for s in benchmarks::sections::ALL {
            for (name, _) in s.names() {
                assert!(words.contains(name), "`bench --help` does not name {name}");
            }
        }
    }
}
