//! `partition`: run guests as static partitions on KVM.
//!
//! The CLI parses, calls the library, prints. Exit status: 0 success (for launch: the
//! guest powered off cleanly or reset), 1 the VMM failed, 2 bad input or a refused request,
//! 3 the guest crashed (triple fault, KVM internal error), 4 the guest reported a non-zero
//! status, 5 a VMM thread broke its seccomp filter, 128+N stopped by signal N.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

mod embedded;
mod verbs;
use partition::board::console::Output as ConsoleOutput;
use partition::board::spec::DeviceSpec;
use partition::machine::launch;
use partition::machine::open::Checked;
use partition::machine::outcome::Observer;
use partition::{Console, KernelSource, LaunchConfig, MemorySource, PoolRequest};

/// The probe guest, built from tools/probe-guest by build.rs.
static PROBE_GUEST: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/probe-guest.elf"));

use partition::machine::outcome::status::{USAGE as EXIT_USAGE, VMM_ERROR as EXIT_VMM_ERROR};

#[derive(Parser)]
#[command(
    name = "partition",
    version,
    about = "Run guests as static partitions on KVM: dedicated cores, memory reserved up front",
    after_help = "Exit status: 0 guest powered off cleanly, 1 VMM error, 2 bad input, \
                  3 guest crashed, 4 guest reported failure, 5 the VMM broke its seccomp \
                  filter, 128+N stopped by signal N."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args)]
struct StateDir {
    /// Directory holding the ledger (and our hugetlbfs mount, if we need one): an absolute
    /// path.
    #[arg(long, value_name = "DIR", env = "PARTITION_STATE_DIR", default_value = partition::host::ledger::DEFAULT_STATE_DIR, value_parser = absolute_dir)]
    state_dir: PathBuf,
}

/// A state directory is named absolutely: a relative one would make a reservation under
/// whatever directory the command happened to run in (host plans require the same).
fn absolute_dir(s: &str) -> Result<PathBuf, String> {
    let p = PathBuf::from(s);
    if p.is_absolute() {
        Ok(p)
    } else {
        Err(format!(
            "{s:?} is relative: give the state directory as an absolute path (such as {})",
            std::env::current_dir()
                .map(|d| d.join(&p).display().to_string())
                .unwrap_or_else(|_| "/run/partition".into())
        ))
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Set aside a hugepage pool and cores for partitions (once, at boot).
    ///
    /// Allocates hugepages (checking the kernel really gave them), preallocates a pool file
    /// on hugetlbfs, takes the cores out of general scheduling where the host allows it
    /// (cgroup cpusets), moves IRQs off them, and records it all in the ledger. Running it
    /// again with the same plan changes nothing; a different plan is refused while
    /// partitions exist.
    Reserve(ReserveArgs),
    /// Give back everything `reserve` took (refused while partitions exist).
    Unreserve {
        #[command(flatten)]
        state: StateDir,
    },
    /// Show the pool, the cores and the partitions (dead ones included).
    Status {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        /// Ask one partition's local API instead (a launch with --api-socket, inside a pod
        /// say, which no ledger records): what runs, its state and its counters.
        #[arg(long, value_name = "PATH")]
        api_socket: Option<PathBuf>,
        #[command(flatten)]
        state: StateDir,
    },
    /// Stop a partition (SIGTERM, then SIGKILL), or reclaim a dead one: its memory is
    /// scrubbed and its cores and extent go back to the reservation.
    Release {
        /// The partition.
        name: String,
        /// Seconds to wait after SIGTERM before SIGKILL.
        #[arg(long, default_value_t = 10)]
        grace: u64,
        #[command(flatten)]
        state: StateDir,
    },
    /// Boot a guest on dedicated cores and wait until it powers off.
    ///
    /// One vCPU per listed core, pinned before it first runs. With --name the cores and
    /// memory come from the reservation (see `reserve`); without it the memory is
    /// anonymous and reserved cores are refused. The guest's serial port (COM1) goes to
    /// stdout, or to --console. Ctrl-C stops the guest and tears down.
    Launch(Box<LaunchArgs>),
    /// Take the ELF vmlinux out of a bzImage (find and decompress its payload).
    ExtractVmlinux {
        /// The bzImage.
        bzimage: PathBuf,
        /// Where to write the vmlinux.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Measure: write benchmark sections into benchmarks/results/<host>.json, then the
    /// report (<host>.md) and chart (<host>-ratios.svg) beside it.
    ///
    /// Sections (`--list` says what each measures): host, guest, probe, crosscheck, wake,
    /// blk, submit, submit-vfio (only with --vfio), exits (only with --exits-guest; the rig:
    /// scripts/rig-bench.sh exits), memsetup, sandbox, builds (only with --baseline).
    /// Benchmarks
    /// use state directories, pools and hugepages of their own and give them back;
    /// `--quick` prints a minute's look instead of storing anything.
    ///
    /// Run by `partition-bench`, installed beside `partition` (the VMM binary carries no
    /// benchmark code): `partition bench --help` shows its options.
    #[command(disable_help_flag = true)]
    Bench {
        /// The benchmark's options (`partition bench --help`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// What this host's KVM offers for idle policies, which policies it can give, its APIC
    /// virtualization (APICv/AVIC/x2AVIC/IPIv, docs/idle.md), and the host settings that cost the reserved cores latency: cpufreq governor and EPP, the
    /// pstate mode, idle states, SMT siblings, isolcpus/nohz_full/rcu_nocbs/irqaffinity,
    /// transparent hugepages, mitigations, irqbalance; each with what it costs and what to
    /// change (docs/operations.md).
    Caps {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        /// The cores to report on (default: the reservation's, else every online core).
        #[arg(long, value_name = "LIST")]
        cores: Option<String>,
        #[command(flatten)]
        state: StateDir,
    },
    /// Write the built-in probe guest ELF to a file (to boot it under another VMM).
    ProbeImage {
        /// Where to write it.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Write the built-in hotpaths benchmark (a static binary) to a file: for a guest
    /// image (scripts/guest-image.sh), or to run by hand (`hotpaths --help`). Run by
    /// `partition-bench`, as `bench` is.
    #[command(disable_help_flag = true)]
    HotpathsBinary {
        /// `-o FILE`: where to write it (made executable).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum BackingArg {
    Anonymous,
    Prefault,
    Hugetlb,
}

#[derive(Clone, Copy, ValueEnum)]
enum Boot {
    /// Linux x86-64 boot protocol: long mode, RSI = boot_params (zero page).
    Linux64,
    /// PVH: 32-bit entry from the kernel's XEN_ELFNOTE_PHYS32_ENTRY note.
    Pvh,
}

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["memory", "plan"])))]
struct ReserveArgs {
    /// Pool size: 1G, 512M (a multiple of the page size).
    #[arg(long, value_name = "SIZE", requires = "cores")]
    memory: Option<String>,
    /// Hugepage size: 2M or 1G.
    #[arg(long, value_name = "SIZE", default_value = "2M")]
    page_size: String,
    /// Take the hugepages from this NUMA node.
    #[arg(long, value_name = "N")]
    node: Option<u32>,
    /// Cores to reserve: "1", "2-5". At least one core must stay with the host.
    #[arg(long, value_name = "LIST")]
    cores: Option<String>,
    /// Read the plan from a TOML file (memory, page_size, node, cores, state_dir,
    /// isolation, irqbalance).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["memory", "cores", "node", "isolation", "irqbalance"])]
    plan: Option<PathBuf>,
    /// How the reserved cores are kept from the host's other tasks. "cpusets" (the
    /// default): out of every cpuset cgroup (Docker's, podman's, libvirt's, a kubelet's are
    /// narrowed and given back at unreserve); where that cannot be done the reserve is
    /// refused (exit 2) naming the cgroup in the way. "none": accept cores that other
    /// cgroups' tasks share (the reservation then keeps only partitions off each other).
    #[arg(long, value_name = "MODE", value_parser = parse_isolation)]
    isolation: Option<partition::host::plan::IsolationMode>,
    /// What to do about a running irqbalance, which would move device interrupts back
    /// onto the reserved cores every 10 s. "ban" (the default): tell it through its control
    /// socket to keep off them (given back at unreserve); where it cannot be told, the
    /// reserve is refused (exit 2). "ignore": leave it be (`status` shows IRQs it moved
    /// back).
    #[arg(long, value_name = "MODE", value_parser = parse_irqbalance)]
    irqbalance: Option<partition::host::plan::IrqbalanceMode>,
    #[command(flatten)]
    state: StateDir,
}

fn parse_isolation(s: &str) -> Result<partition::host::plan::IsolationMode, String> {
    partition::host::plan::IsolationMode::parse(s).ok_or_else(|| "cpusets or none".to_string())
}

fn parse_irqbalance(s: &str) -> Result<partition::host::plan::IrqbalanceMode, String> {
    partition::host::plan::IrqbalanceMode::parse(s).ok_or_else(|| "ban or ignore".to_string())
}

fn parse_idle(s: &str) -> Result<partition::cpu::idle::IdlePolicy, String> {
    partition::cpu::idle::IdlePolicy::parse(s)
        .ok_or_else(|| "one of auto, mwait, hlt, haltpoll, poll, shared".to_string())
}

fn parse_size(s: &str) -> Result<u64, String> {
    partition::config::size::parse(s).map_err(|e| e.to_string())
}

/// `SIZE` or `SIZE@OFFSET`.
#[derive(Clone, Copy, Debug)]
struct MemorySpec {
    size: u64,
    offset: Option<u64>,
}

fn parse_memory(s: &str) -> Result<MemorySpec, String> {
    let (size, offset) = match s.split_once('@') {
        Some((a, b)) => (a, Some(b)),
        None => (s, None),
    };
    let size = partition::config::size::parse(size).map_err(|e| e.to_string())?;
    let offset = match offset {
        Some(o) => Some(match o.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16).map_err(|_| format!("{o:?} is not an offset"))?,
            None => partition::config::size::parse(o).map_err(|e| e.to_string())?,
        }),
        None => None,
    };
    Ok(MemorySpec { size, offset })
}

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("image").required(true).args(["kernel", "probe"])))]
struct LaunchArgs {
    /// Host cores, one vCPU each, in vCPU order: "0", "0,1", "2-5"; or `from-cgroup`: the
    /// cores of the cpuset cgroup this process runs in, if they are exclusive (a pod's under
    /// the kubelet's static CPU manager, docs/kubernetes.md).
    #[arg(long, value_name = "LIST")]
    cores: partition::machine::config::CoreSelection,
    /// Guest memory: 128M, 1G, 2GiB (a multiple of 4 KiB; of 2 MiB with --hugepages or a
    /// 2 MiB pool). With --name, SIZE@OFFSET takes that extent of the pool (OFFSET in bytes,
    /// 0x hex or with a suffix); otherwise the first free extent that fits.
    #[arg(long, value_name = "SIZE[@OFFSET]", value_parser = parse_memory)]
    memory: MemorySpec,
    /// Run as partition NAME, on reserved cores and memory from the pool.
    #[arg(long, value_name = "NAME")]
    name: Option<String>,
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
    /// Pass on at most this much of the guest's serial output (to stdout or --console);
    /// the rest is dropped, and the launch says so once.
    #[arg(long, value_name = "SIZE", default_value = "64M", value_parser = parse_size)]
    console_limit: u64,
    /// Entry protocol.
    #[arg(long, value_enum, default_value = "linux64")]
    boot: Boot,
    /// Idle policy: auto (the best the host offers), mwait, hlt, haltpoll, poll, shared.
    /// See `partition caps` for what this host offers; an unavailable one is refused.
    #[arg(long, value_name = "POLICY", default_value = "auto", value_parser = parse_idle)]
    idle: partition::cpu::idle::IdlePolicy,
    /// Memory for a launch without --name: anonymous (faulted in as the guest touches it),
    /// prefault (anonymous, MAP_POPULATE), hugetlb (2 MiB pages from the kernel's free
    /// hugepages, MAP_HUGETLB | MAP_POPULATE).
    #[arg(long, value_enum, default_value = "anonymous", conflicts_with = "name")]
    backing: BackingArg,
    /// Same as --backing hugetlb.
    #[arg(long, conflicts_with_all = ["name", "backing"])]
    hugepages: bool,
    /// Guest memory from a file in this hugetlbfs directory (a pod's emptyDir with
    /// `medium: HugePages-2Mi`), within the pod's hugetlb limit; the file is unlinked at once.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["name", "backing", "hugepages"])]
    memory_from: Option<PathBuf>,
    /// With --cores from-cgroup: the kubelet's CPU manager checkpoint
    /// (/var/lib/kubelet/cpu_manager_state, mounted read-only), which says whether the
    /// cgroup's cores are exclusive when the cgroup itself does not.
    #[arg(long, value_name = "FILE")]
    kubelet_cpu_state: Option<PathBuf>,
    /// Serve the local API (HTTP and JSON: state, counters, idle read-back, pause, resume,
    /// stop) on this Unix socket, owned by the VMM's user, mode 0600 (docs/kubernetes.md).
    #[arg(long, value_name = "PATH")]
    api_socket: Option<PathBuf>,
    /// A virtio-blk disk: path=FILE[,readonly=on][,direct=on][,queues=N][,poll_us=N]
    /// [,core=N][,sqpoll=on][,id=STR][,transport=mmio|pci]. Repeatable. On virtio-mmio
    /// (the default) announced to the guest on its command line
    /// (virtio_mmio.device=4K@ADDR:GSI) and in ACPI; with transport=pci a virtio-pci
    /// function on the PCI root, one MSI-X vector a queue (docs/block.md).
    #[arg(long, value_name = "SPEC")]
    disk: Vec<String>,
    /// Let queue doorbells exit to the VMM instead of binding them to ioeventfds (for
    /// comparison).
    #[arg(long)]
    no_ioeventfd: bool,
    /// A PCI function: `engine[,doorbell=trap|ioeventfd|mapped]`, the GPU-style
    /// submission engine (docs/pci.md; default doorbell `mapped`, a page of the guest's
    /// address space the engine's thread polls); or `vfio=DDDD:BB:DD.F`, a host function bound to
    /// vfio-pci passed through (docs/passthrough.md: not yet run on hardware; a host without
    /// VFIO refuses it with the reason). Repeat it for several functions (00:02.0, 00:03.0,
    /// ... in the guest, in the order given; their IOMMU groups must be bound to vfio-pci
    /// whole); one engine.
    #[arg(long, value_name = "SPEC")]
    device: Vec<String>,
    /// Print where launch time went (memory, VM, boot, vCPUs, first serial byte).
    #[arg(long)]
    timings: bool,
    /// At the end, print the launch report as one line of JSON on stdout: the outcome
    /// (kind, vCPU, exit code), timings, idle plan and its read-back, CPU model, per-vCPU
    /// exits, assists and KVM statistics, disks, pool extent. With the console on stdout
    /// too, the report is its last line; `--console FILE` keeps them apart.
    #[arg(long)]
    json: bool,
    /// What the guest is told about its CPU: host (the host's CPUID), nested-safe (hide
    /// what a host that emulates guest ring 0 refuses: CPUID and `clearcpuid=` on the
    /// kernel command line, and repair SYSCALL), or auto (nested-safe when /dev/kvm is the
    /// nested kvm_pvm module, host otherwise). Printed at launch.
    #[arg(long, value_name = "MODEL", default_value = "auto")]
    cpu_model: partition::cpu::cpumodel::CpuModelRequest,
    /// Once the VM is set up, run as this user (a number, or a name from /etc/passwd;
    /// default: an identity of this launch's own, uid and gid 3000000000 + its pid, which no
    /// other VMM shares and no user needs to exist for). The VMM then has no capabilities, no_new_privs, and a
    /// seccomp filter on every thread (docs/security.md).
    #[arg(long, value_name = "USER", conflicts_with = "no_sandbox")]
    uid: Option<String>,
    /// The group to run as (a number, or a name from /etc/group; default: the user's; with
    /// no --uid, the launch's own).
    #[arg(long, value_name = "GROUP", conflicts_with = "no_sandbox")]
    gid: Option<String>,
    /// Debugging only: keep root and every capability, install no seccomp filter.
    #[arg(long)]
    no_sandbox: bool,
    #[command(flatten)]
    state: StateDir,
}

struct Progress;

impl Observer for Progress {
    /// The launch's lines before the guest starts, written to stderr at once: stderr is
    /// unbuffered, and `eprintln!` makes a write for every piece of its format (33 writes
    /// before the first KVM_RUN, counted with strace, where one does).
    fn booting(&self, checked: &Checked, boot: &boot::BootInfo, memory: &str) {
        use std::fmt::Write as _;
        let cores = checked.plan.cores();
        let mut s = String::new();
        let _ = writeln!(
            s,
            "partition: booting {} ({} entry {:#x}) on {} vCPU{} (cores {}), {} of memory: {}",
            checked.kernel_name(),
            boot.entry.protocol,
            boot.entry_addr,
            cores.len(),
            if cores.len() == 1 { "" } else { "s" },
            partition::config::cores::format(cores),
            partition::config::size::format(boot::e820::memory(&boot.e820)),
            memory,
        );
        let _ = writeln!(s, "partition: {}", checked.plan.idle().describe());
        let _ = writeln!(s, "partition: {}", checked.plan.cpu_model().describe(&[]));
        let _ = writeln!(s, "partition: command line: {}", checked.plan.cmdline());
        if let Some(why) = checked.plan.cores_from() {
            let _ = writeln!(
                s,
                "partition: cores from this process's cgroup, exclusive by {why}"
            );
        }
        if let Some(p) = checked.plan.api_socket() {
            let _ = writeln!(s, "partition: local API on {}", p.display());
        }
        let _ = match checked.plan.sandbox() {
            partition::sys::sandbox::Sandbox::On(who) => writeln!(
                s,
                "partition: sandbox: once set up the VMM runs as {} (uid {}, gid {}) with no \
                 capabilities, no_new_privs and a seccomp filter on every thread",
                who.user, who.uid, who.gid
            ),
            partition::sys::sandbox::Sandbox::Off => writeln!(
                s,
                "partition: WARNING: --no-sandbox: the VMM keeps root and every capability and \
                 runs without seccomp filters; a guest that breaks out of it owns this host. \
                 For debugging only."
            ),
        };
        let _ = std::io::Write::write_all(&mut std::io::stderr(), s.as_bytes());
    }
}

fn launch(a: LaunchArgs) -> ExitCode {
    if a.memory.offset.is_some() && a.name.is_none() {
        eprintln!(
            "partition: error: --memory SIZE@OFFSET takes an extent of the pool: it needs --name"
        );
        return ExitCode::from(EXIT_USAGE);
    }
    // Every device in one list, each option's words parsed by its kind: the console, the
    // disks, then the --device functions.
    let mut devices = vec![DeviceSpec::Console(Console {
        output: a.console.map_or(ConsoleOutput::Stdout, ConsoleOutput::File),
        limit: a.console_limit,
    })];
    for (i, d) in a.disk.iter().enumerate() {
        match partition::board::disks::parse(d, i) {
            Ok(c) => devices.push(DeviceSpec::Disk(c)),
            Err(e) => {
                eprintln!("partition: error: {e}");
                return ExitCode::from(EXIT_USAGE);
            }
        }
    }
    for d in &a.device {
        match partition::board::spec::parse_device(d) {
            Ok(s) => devices.push(s),
            Err(e) => {
                eprintln!("partition: error: {e}");
                return ExitCode::from(EXIT_USAGE);
            }
        }
    }
    let kernel = match a.kernel {
        Some(p) => KernelSource::Path(p),
        None => KernelSource::Builtin {
            name: "probe-guest",
            bytes: PROBE_GUEST,
        },
    };
    let cfg = LaunchConfig {
        cores: a.cores,
        memory: a.memory.size,
        kernel,
        initrd: a.initrd,
        cmdline: a.cmdline,
        protocol: match a.boot {
            Boot::Linux64 => boot::regs::BootProtocol::Linux64,
            Boot::Pvh => boot::regs::BootProtocol::Pvh,
        },
        source: match (a.name, a.memory_from) {
            (Some(name), _) => MemorySource::Pool(PoolRequest {
                name,
                offset: a.memory.offset,
            }),
            (None, Some(dir)) => MemorySource::Volume(dir),
            (None, None) => MemorySource::Anonymous(match (a.hugepages, a.backing) {
                (true, _) | (_, BackingArg::Hugetlb) => pool::Backing::Hugetlb,
                (_, BackingArg::Prefault) => pool::Backing::AnonymousPopulated,
                (_, BackingArg::Anonymous) => pool::Backing::Anonymous,
            }),
        },
        state_dir: a.state.state_dir,
        idle: a.idle,
        ioeventfd: !a.no_ioeventfd,
        cpu_model: a.cpu_model,
        kubelet_cpu_state: a.kubelet_cpu_state,
        api_socket: a.api_socket,
        devices,
        sandbox: if a.no_sandbox {
            partition::SandboxRequest::Off
        } else {
            partition::SandboxRequest::On {
                uid: a.uid,
                gid: a.gid,
            }
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
    let outcome = partition::machine::outcome::Outcome::of(&report.ending);
    for line in report.sentences(a.timings) {
        eprintln!("partition: {line}");
    }
    if a.json {
        match serde_json::to_string(&partition::machine::outcome::document(&report)) {
            Ok(j) => {
                use std::io::Write;
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{j}");
                let _ = out.flush();
            }
            Err(e) => eprintln!("partition: error: the report as JSON: {e}"),
        }
    }
    ExitCode::from(outcome.exit_code())
}

fn extract(bzimage: PathBuf, output: PathBuf) -> ExitCode {
    // Distribution bzImages are tens of MiB; 1 GiB bounds a hostile or mistaken input.
    let bytes = match partition::sys::files::read_limited(&bzimage, 1 << 30) {
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
    if let Err(e) = partition::sys::files::write_new(&output, &elf, 0o644) {
        eprintln!("partition: error: {}: {e}", output.display());
        return ExitCode::from(if e.is_refusal() {
            EXIT_USAGE
        } else {
            EXIT_VMM_ERROR
        });
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
    partition::sys::timeline::mark_main();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .format_timestamp_millis()
        .init();
    let cmd = Cli::parse().cmd;
    if matches!(cmd, Cmd::Status { .. } | Cmd::Caps { .. }) {
        // Read-only reports: a closed pipe (`partition status | head`) ends the process
        // quietly, as for any Unix filter, instead of a panic on the next print. The verbs
        // that change state, and a running guest, keep SIGPIPE ignored.
        // SAFETY: setting a signal disposition to its default, before any thread exists.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    match cmd {
        Cmd::Reserve(a) => verbs::reserve(a),
        Cmd::Unreserve { state } => verbs::unreserve(&state.state_dir),
        Cmd::Status {
            json,
            api_socket: Some(sock),
            ..
        } => verbs::api_status(&sock, json),
        Cmd::Status { json, state, .. } => verbs::status(&state.state_dir, json),
        Cmd::Release { name, grace, state } => verbs::release(&state.state_dir, &name, grace),
        Cmd::Launch(a) => launch(*a),
        Cmd::Bench { args } => bench_program("bench", &args),
        Cmd::Caps { json, cores, state } => verbs::caps(json, cores.as_deref(), &state.state_dir),
        Cmd::ExtractVmlinux { bzimage, output } => extract(bzimage, output),
        Cmd::ProbeImage { output } => embedded::write_out(&output, PROBE_GUEST, 0o644),
        Cmd::HotpathsBinary { args } => bench_program("hotpaths-binary", &args),
    }
}

/// Replaces this process with `partition-bench SUBCOMMAND ARGS...`, the program beside this
/// one that holds the benchmarks (the VMM binary carries none). Returns only if it cannot.
fn bench_program(sub: &str, args: &[std::ffi::OsString]) -> ExitCode {
    use std::os::unix::process::CommandExt;
    let me = std::env::current_exe().unwrap_or_else(|_| "partition".into());
    let program = me.with_file_name("partition-bench");
    let e = std::process::Command::new(&program)
        .arg(sub)
        .args(args)
        .exec();
    eprintln!(
        "partition: error: {sub} is run by {}: {e} (it is built and installed beside \
         partition: cargo build -p partition-cli)",
        program.display()
    );
    ExitCode::from(EXIT_VMM_ERROR)
}
