//! `partition`: run guests as static partitions on KVM.
//!
//! The CLI parses, calls the library, prints. Exit status: 0 the guest powered off cleanly
//! (or reset), 1 the VMM failed, 2 bad input, 3 the guest crashed (triple fault, KVM
//! internal error), 4 the guest reported a non-zero status, 128+N stopped by signal N.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use partition::launch::{self, Checked, Ending, Observer};
use partition::vcpu::StopReason;
use partition::{Console, KernelSource, LaunchConfig};

/// The probe guest, built from tools/probe-guest by build.rs.
static PROBE_GUEST: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/probe-guest.elf"));

const EXIT_VMM_ERROR: u8 = 1;
const EXIT_USAGE: u8 = 2;
const EXIT_GUEST_CRASH: u8 = 3;
const EXIT_GUEST_FAILED: u8 = 4;

#[derive(Parser)]
#[command(
    name = "partition",
    version,
    about = "Run guests as static partitions on KVM: dedicated cores, memory reserved up front",
    after_help = "Exit status: 0 guest powered off cleanly, 1 VMM error, 2 bad input, \
                  3 guest crashed, 4 guest reported failure, 128+N stopped by signal N."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Boot a guest on dedicated cores and wait until it powers off.
    ///
    /// One vCPU per listed core, pinned before it first runs. The guest's serial port
    /// (COM1) goes to stdout, or to --console. Ctrl-C stops the guest and tears down.
    Launch(LaunchArgs),
    /// Take the ELF vmlinux out of a bzImage (find and decompress its payload).
    ExtractVmlinux {
        /// The bzImage.
        bzimage: PathBuf,
        /// Where to write the vmlinux.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Write the built-in probe guest ELF to a file (to boot it under another VMM).
    ProbeImage {
        /// Where to write it.
        #[arg(short, long)]
        output: PathBuf,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Boot {
    /// Linux x86-64 boot protocol: long mode, RSI = boot_params (zero page).
    Linux64,
    /// PVH: 32-bit entry from the kernel's XEN_ELFNOTE_PHYS32_ENTRY note.
    Pvh,
}

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("image").required(true).args(["kernel", "probe"])))]
struct LaunchArgs {
    /// Host cores, one vCPU each, in vCPU order: "0", "0,1", "2-5".
    #[arg(long, value_name = "LIST")]
    cores: String,
    /// Guest memory: 128M, 1G, 2GiB (a multiple of 4 KiB; of 2 MiB with --hugepages).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    memory: u64,
    /// Kernel: an ELF vmlinux (or other ELF64 kernel) or a bzImage.
    #[arg(long, value_name = "PATH")]
    kernel: Option<PathBuf>,
    /// Boot the built-in probe guest instead of a kernel file.
    #[arg(long)]
    probe: bool,
    /// Initial ramdisk.
    #[arg(long, value_name = "PATH")]
    initrd: Option<PathBuf>,
    /// Kernel command line.
    #[arg(long, value_name = "STR", default_value = "")]
    cmdline: String,
    /// Write the guest's serial output to FILE instead of stdout.
    #[arg(long, value_name = "FILE")]
    console: Option<PathBuf>,
    /// Entry protocol.
    #[arg(long, value_enum, default_value = "linux64")]
    boot: Boot,
    /// Back guest memory with 2 MiB hugetlb pages from the kernel's free pool.
    #[arg(long)]
    hugepages: bool,
}

fn parse_size(s: &str) -> Result<u64, String> {
    partition::size::parse(s).map_err(|e| e.to_string())
}

struct Progress;

impl Observer for Progress {
    fn booting(&self, checked: &Checked, boot: &boot::BootInfo, memory: &str) {
        let cores = checked.cores();
        eprintln!(
            "partition: booting {} ({} entry {:#x}) on {} vCPU{} (cores {}), {} of {} memory",
            checked.kernel_name(),
            boot.entry.protocol,
            boot.entry_addr,
            cores.len(),
            if cores.len() == 1 { "" } else { "s" },
            partition::cores::format(cores),
            partition::size::format(boot::e820::total(&boot.e820)),
            memory,
        );
    }
}

fn launch(a: LaunchArgs) -> ExitCode {
    let kernel = match a.kernel {
        Some(p) => KernelSource::Path(p),
        None => KernelSource::Builtin {
            name: "probe-guest",
            bytes: PROBE_GUEST,
        },
    };
    let cfg = LaunchConfig {
        cores: a.cores,
        memory: a.memory,
        kernel,
        initrd: a.initrd,
        cmdline: a.cmdline,
        console: a.console.map_or(Console::Stdout, Console::File),
        protocol: match a.boot {
            Boot::Linux64 => boot::regs::BootProtocol::Linux64,
            Boot::Pvh => boot::regs::BootProtocol::Pvh,
        },
        backing: if a.hugepages {
            pool::Backing::Hugetlb
        } else {
            pool::Backing::Anonymous
        },
    };
    let report = match launch::launch(cfg, &Progress) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("partition: error: {e}");
            return ExitCode::from(if e.is_usage() {
                EXIT_USAGE
            } else {
                EXIT_VMM_ERROR
            });
        }
    };
    let secs = report.ran_for.as_secs_f64();
    let code = match &report.ending {
        Ending::Signal(s) => {
            eprintln!("partition: stopped by signal {s} after {secs:.3} s");
            128 + *s as u8
        }
        Ending::Guest { vcpu, reason } => {
            let (what, code) = match reason {
                StopReason::PowerOff(0) => ("guest powered off (status 0)".to_string(), 0),
                StopReason::PowerOff(s) => (
                    format!("guest powered off with failure status {s}"),
                    EXIT_GUEST_FAILED,
                ),
                StopReason::Reset => ("guest reset (a partition stops on reset)".into(), 0),
                StopReason::TripleFault => ("guest triple-faulted".into(), EXIT_GUEST_CRASH),
                StopReason::InternalError(w) => {
                    (format!("KVM internal error: {w}"), EXIT_GUEST_CRASH)
                }
                StopReason::FailEntry(r) => (
                    format!("VM entry failed, hardware reason {r:#x}"),
                    EXIT_GUEST_CRASH,
                ),
                StopReason::Crash => ("guest reported a crash".into(), EXIT_GUEST_CRASH),
                StopReason::Unhandled(w) => (format!("unhandled exit: {w}"), EXIT_GUEST_CRASH),
                StopReason::RunError(w) => (format!("vCPU failed: {w}"), EXIT_VMM_ERROR),
                StopReason::Kicked => ("stopped".into(), EXIT_VMM_ERROR),
            };
            eprintln!("partition: {what} on vcpu{vcpu} after {secs:.3} s");
            code
        }
    };
    for v in &report.vcpus {
        let exits: Vec<String> = v
            .exits
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(k, n)| format!("{k}={n}"))
            .collect();
        eprintln!(
            "partition: vcpu{} (core {}) exits: {}",
            v.index,
            v.core,
            if exits.is_empty() {
                "none".to_string()
            } else {
                exits.join(" ")
            }
        );
    }
    ExitCode::from(code)
}

fn extract(bzimage: PathBuf, output: PathBuf) -> ExitCode {
    let bytes = match std::fs::read(&bzimage) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("partition: error: {}: {e}", bzimage.display());
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let elf = match boot::extract::extract_vmlinux(&bytes) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("partition: error: {}: {e}", bzimage.display());
            return ExitCode::from(EXIT_USAGE);
        }
    };
    if let Err(e) = std::fs::write(&output, &elf) {
        eprintln!("partition: error: {}: {e}", output.display());
        return ExitCode::from(EXIT_VMM_ERROR);
    }
    eprintln!(
        "partition: wrote {} ({} bytes) from {}",
        output.display(),
        elf.len(),
        bzimage.display()
    );
    ExitCode::SUCCESS
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .format_timestamp_millis()
        .init();
    match Cli::parse().cmd {
        Cmd::Launch(a) => launch(a),
        Cmd::ExtractVmlinux { bzimage, output } => extract(bzimage, output),
        Cmd::ProbeImage { output } => match std::fs::write(&output, PROBE_GUEST) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("partition: error: {}: {e}", output.display());
                ExitCode::from(EXIT_VMM_ERROR)
            }
        },
    }
}
