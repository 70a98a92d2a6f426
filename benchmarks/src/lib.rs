//! Benchmarks: harnesses that measure, and the results file they write.
//!
//! Nothing here is a test: no assertion decides pass or fail. Each section returns a JSON
//! object with `completed`, its provenance, its parameters, medians with min-max spread and
//! the raw runs; `partition bench` merges it into `benchmarks/results/<host>.json`.

pub mod blk;
pub mod chart;
pub mod compare;
pub mod crosscheck;
pub mod doc;
pub mod exits;
pub mod figures;
pub mod head;
pub mod host;
pub mod hotpaths;
pub mod lookup;
pub mod memsetup;
pub mod noise;
pub mod nvmecore;
pub mod outdir;
pub mod peers;
pub mod placement;
pub mod probe;
pub mod provenance;
pub use provenance::now_utc;
pub mod quick;
pub mod report;
pub mod results;
pub mod sections;
pub mod stats;
pub mod submit;
pub mod submit_vfio;
pub mod supervisor;
pub mod vfio_nvme;
pub mod wake;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Where benchmarks run.
#[derive(Clone, Debug)]
pub struct Env {
    /// The `partition` binary.
    pub partition: PathBuf,
    /// Scratch directory (removed by the caller).
    pub work: PathBuf,
    /// The repository (for the commit in provenance), if known.
    pub repo: Option<PathBuf>,
    /// `qemu-system-x86_64`, if installed and not left out.
    pub qemu: Option<PathBuf>,
    /// QEMU was left out on purpose (`partition bench --no-qemu`), not missing.
    pub qemu_left_out: bool,
    /// Cloud Hypervisor's binary, if given or on PATH (a peer: [`peers`]).
    pub cloud_hypervisor: Option<PathBuf>,
    /// Firecracker's binary, if given or on PATH (a peer: [`peers`]).
    pub firecracker: Option<PathBuf>,
    /// Measured runs per configuration.
    pub runs: usize,
    /// The core partitions run on (reserved by the benchmark).
    pub core: usize,
    /// A core left to the host (launchers, QEMU, host-side runs).
    pub host_core: usize,
    /// The Linux guest image directory (scripts/guest-image.sh), if known.
    pub guest_image: Option<PathBuf>,
    /// lmbench's binaries (the crosscheck section), if known.
    pub lmbench: Option<PathBuf>,
    /// A baseline build of `partition` to compare this one with (the builds section).
    pub baseline: Option<Baseline>,
    /// A host NVMe function bound to vfio-pci for the submit-vfio section, `DDDD:BB:DD.F`.
    pub vfio: Option<String>,
    /// The Linux guest of the exits section: a directory with `vmlinux` and `base.cpio`.
    pub exits_guest: Option<PathBuf>,
}

impl Env {
    /// Why a section has no QEMU rows, for its failures: left out, or not installed.
    pub fn qemu_absent(&self) -> &'static str {
        if self.qemu_left_out {
            "left out (partition bench --no-qemu)"
        } else {
            "qemu-system-x86_64 is not installed"
        }
    }
    /// An environment for unit tests: nothing found, one run, cores 0 and 1.
    #[cfg(test)]
    pub(crate) fn for_tests() -> Env {
        Env {
            partition: "/bin/partition".into(),
            work: "/w".into(),
            repo: None,
            qemu: None,
            qemu_left_out: false,
            cloud_hypervisor: None,
            firecracker: None,
            runs: 1,
            core: 1,
            host_core: 0,
            guest_image: None,
            lmbench: None,
            baseline: None,
            vfio: None,
            exits_guest: None,
        }
    }
}

/// A baseline build of `partition`.
#[derive(Clone, Debug)]
pub struct Baseline {
    /// What it is (a commit, say).
    pub label: String,
    /// Its binary.
    pub partition: PathBuf,
}

/// One builder for every `partition launch` a benchmark runs: the state directory, the
/// cores, the memory, the guest and its command line, devices and flags, in the order a
/// person would type them.
pub struct Launch {
    cmd: Command,
}

impl Launch {
    /// `partition launch --cores CORES --memory MEMORY`, with its own state directory.
    pub fn new(env: &Env, state: &Path, cores: &str, memory: &str) -> Self {
        let mut cmd = Command::new(&env.partition);
        cmd.env("PARTITION_STATE_DIR", state)
            .arg("launch")
            .args(["--cores", cores, "--memory", memory]);
        Self { cmd }
    }
    /// The built-in probe guest.
    pub fn probe(mut self) -> Self {
        self.cmd.arg("--probe");
        self
    }
    /// A kernel and initrd from files.
    pub fn kernel(mut self, kernel: &Path, initrd: &Path) -> Self {
        self.cmd
            .arg("--kernel")
            .arg(kernel)
            .arg("--initrd")
            .arg(initrd);
        self
    }
    /// `--backing anonymous|prefault|hugetlb`.
    pub fn backing(mut self, backing: &str) -> Self {
        self.cmd.args(["--backing", backing]);
        self
    }
    /// `--name NAME`: a partition from the reservation.
    pub fn name(mut self, name: &str) -> Self {
        self.cmd.args(["--name", name]);
        self
    }
    /// `--idle POLICY`.
    pub fn idle(mut self, policy: &str) -> Self {
        self.cmd.args(["--idle", policy]);
        self
    }
    /// `--cmdline LINE`.
    pub fn cmdline(mut self, line: &str) -> Self {
        self.cmd.args(["--cmdline", line]);
        self
    }
    /// `--disk path=PATH<opts>` (`opts` such as `,poll=on`).
    pub fn disk(mut self, path: &Path, opts: &str) -> Self {
        self.cmd
            .arg("--disk")
            .arg(format!("path={}{opts}", path.display()));
        self
    }
    /// `--no-ioeventfd` unless `ioeventfd`.
    pub fn ioeventfd(mut self, ioeventfd: bool) -> Self {
        if !ioeventfd {
            self.cmd.arg("--no-ioeventfd");
        }
        self
    }
    /// `--json`: the launch report as the last line of stdout ([`LaunchJson::from_stdout`]).
    pub fn json(mut self) -> Self {
        self.cmd.arg("--json");
        self
    }
    /// One more argument, as given.
    pub fn arg(mut self, a: &str) -> Self {
        self.cmd.arg(a);
        self
    }
    /// An environment variable for the VMM (`RUST_LOG`, say).
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.cmd.env(key, value);
        self
    }
    /// The command.
    pub fn command(self) -> Command {
        self.cmd
    }
}

/// The peer VMM as every section runs it: QEMU's microvm booting the probe guest, the
/// console on stdout, power-off through isa-debug-exit (status s exits `(s << 1) | 1`).
/// Callers add what differs (QMP, a drive, `-overcommit`).
pub struct Microvm<'a> {
    /// A core list ("0,1") to start QEMU on, if any (set before exec: [`placement`]).
    pub pin: Option<String>,
    /// vCPUs.
    pub smp: usize,
    /// Memory, MiB.
    pub mb: u64,
    /// Whether microvm keeps its ACPI tables (off: the probe finds CPUs in the MP table).
    pub acpi: bool,
    /// `-mem-prealloc`.
    pub prealloc: bool,
    /// The probe guest ELF.
    pub probe: &'a Path,
    /// Its command line.
    pub cmdline: &'a str,
}

/// `bin`, started on the cores of the list `pin` ("0,1") when it is given: the affinity is
/// set in the child before exec (no `taskset` process whose exec and start would count as
/// the VMM's own; [`placement`]).
pub fn pinned(bin: &Path, pin: Option<&str>) -> Command {
    let mut c = Command::new(bin);
    if let Some(list) = pin {
        let cores: Vec<usize> = list
            .split(',')
            .filter_map(|x| x.trim().parse().ok())
            .collect();
        placement::start_on(&mut c, &cores);
    }
    c
}

impl Microvm<'_> {
    /// The command line, ready for the caller's additions.
    pub fn command(&self, env: &Env) -> Command {
        let qemu = env
            .qemu
            .clone()
            .unwrap_or_else(|| "qemu-system-x86_64".into());
        let mut c = pinned(&qemu, self.pin.as_deref());
        let machine = if self.acpi {
            "microvm"
        } else {
            "microvm,acpi=off"
        };
        c.args([
            "-M",
            machine,
            "-enable-kvm",
            "-cpu",
            "host,-arch-capabilities",
        ])
        .args([
            "-smp",
            &self.smp.to_string(),
            "-m",
            &format!("{}M", self.mb),
        ]);
        if self.prealloc {
            c.arg("-mem-prealloc");
        }
        c.arg("-kernel")
            .arg(self.probe)
            .args(["-append", self.cmdline])
            .args(["-nodefaults", "-no-user-config", "-nographic"])
            .args(["-serial", "stdio"])
            .args(["-device", "isa-debug-exit,iobase=0xf4,iosize=4"]);
        c
    }
}

/// Whether /dev/kvm is the nested kvm_pvm module (docs/measurement.md, the development
/// host): guest ring 0 runs in the host's instruction emulator.
pub fn nested_pvm() -> bool {
    std::path::Path::new("/sys/module/kvm_pvm").exists()
}

/// The kernel's count of 2 MiB hugepages, put back to the value it holds when dropped.
pub struct HugepageCount(pub String);

impl HugepageCount {
    fn path() -> &'static str {
        "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"
    }
    /// The current count.
    pub fn read() -> u64 {
        std::fs::read_to_string(Self::path())
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }
    /// Asks for `n` pages; returns what the kernel gave.
    pub fn set(n: u64) -> u64 {
        let _ = std::fs::write(Self::path(), n.to_string());
        Self::read()
    }
    /// Adds `pages` free hugepages until the guard drops; None (and nothing changed) if the
    /// kernel cannot find them.
    pub fn grow(pages: u64) -> Option<Self> {
        let base = Self::read();
        let guard = Self(base.to_string());
        (Self::set(base + pages) >= base + pages).then_some(guard)
    }
}

impl Drop for HugepageCount {
    fn drop(&mut self) {
        let _ = std::fs::write(Self::path(), &self.0);
    }
}

/// Host facts for a result (every field may be null): [`provenance::collect`].
pub fn provenance(env: &Env) -> Value {
    crate::provenance::collect(env.repo.as_deref())
}

/// One run of a command whose stdout is a guest's serial console.
#[derive(Debug)]
pub struct Run {
    /// From spawn to the first byte on stdout (None if there was none).
    pub first_byte: Option<Duration>,
    /// The process as it was right after its first stdout byte (None if there was none or
    /// it was already gone).
    pub at_first_byte: Option<ProcSample>,
    /// From spawn to exit.
    pub total: Duration,
    /// Exit status.
    pub status: ExitStatus,
    /// Everything on stdout.
    pub stdout: String,
    /// Everything on stderr.
    pub stderr: String,
}

/// A process's CPU time and memory, read from /proc.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProcSample {
    /// CPU time of all its threads so far (guest time of vCPU threads included), ns.
    pub cpu_ns: u64,
    /// Resident set (`VmRSS`), KiB: its own memory and any anonymous guest memory.
    pub rss_kib: u64,
    /// Hugetlb pages mapped (`HugetlbPages`), KiB: hugetlb guest memory is here, not in RSS.
    pub hugetlb_kib: u64,
}

impl ProcSample {
    /// `pid`'s sample, or None if it is gone.
    pub fn of(pid: u32) -> Option<Self> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let mut cpu_ns = 0u64;
        for t in std::fs::read_dir(format!("/proc/{pid}/task"))
            .ok()?
            .flatten()
        {
            let s = std::fs::read_to_string(t.path().join("schedstat")).unwrap_or_default();
            cpu_ns += Self::schedstat_ns(&s).unwrap_or(0);
        }
        Some(Self {
            cpu_ns,
            rss_kib: Self::status_kib(&status, "VmRSS:").unwrap_or(0),
            hugetlb_kib: Self::status_kib(&status, "HugetlbPages:").unwrap_or(0),
        })
    }

    /// The first field of `/proc/.../schedstat`: time on the CPU, ns.
    fn schedstat_ns(s: &str) -> Option<u64> {
        s.split_whitespace().next()?.parse().ok()
    }

    /// A `Key:   N kB` line of `/proc/PID/status`.
    fn status_kib(status: &str, key: &str) -> Option<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }
}

/// Runs `cmd`, timing its first stdout byte; kills it after `limit`.
pub fn timed_run(cmd: Command, limit: Duration) -> std::io::Result<Run> {
    timed_run_with(cmd, limit, |_| Ok(()))
}

/// Everything `r` gives until EOF, as text: a guest's console is not promised to be UTF-8
/// (one stray byte made `read_to_string` drop a whole run's output), so invalid bytes
/// become U+FFFD instead.
pub fn read_lossy(r: &mut impl Read) -> String {
    let mut bytes = Vec::new();
    let _ = r.read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// As [`timed_run`], calling `after_spawn` with the child's pid before reading its output
/// (to pin its threads, say); the child is killed if the hook fails.
pub fn timed_run_with(
    mut cmd: Command,
    limit: Duration,
    after_spawn: impl FnOnce(u32) -> Result<(), String>,
) -> std::io::Result<Run> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = cmd.spawn()?;
    if let Err(e) = after_spawn(child.id()) {
        let _ = child.kill();
        let _ = child.wait();
        return Err(std::io::Error::other(e));
    }
    let mut out = child
        .stdout
        .take()
        .ok_or_else(|| std::io::Error::other("no stdout"))?;
    let mut err = child
        .stderr
        .take()
        .ok_or_else(|| std::io::Error::other("no stderr"))?;
    let err_t = std::thread::spawn(move || read_lossy(&mut err));
    let pid = child.id();
    let watchdog = std::thread::spawn(move || {
        let t = Instant::now();
        while t.elapsed() < limit {
            std::thread::sleep(Duration::from_millis(50));
            if std::fs::metadata(format!("/proc/{pid}")).is_err() {
                return;
            }
        }
        // SAFETY: signalling the child we spawned (at worst a pid that already exited).
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    });
    let mut first = [0u8; 1];
    let (first_byte, mut stdout) = match out.read(&mut first) {
        Ok(1) => (
            Some(start.elapsed()),
            String::from_utf8_lossy(&first).into_owned(),
        ),
        _ => (None, String::new()),
    };
    let at_first_byte = first_byte.and_then(|_| ProcSample::of(pid));
    stdout.push_str(&read_lossy(&mut out));
    let status = child.wait()?;
    let total = start.elapsed();
    let _ = watchdog.join();
    Ok(Run {
        first_byte,
        at_first_byte,
        total,
        status,
        stdout,
        stderr: err_t.join().unwrap_or_default(),
    })
}

/// A command line as a person would type it (for the results' `command` fields).
pub fn pretty(c: &Command) -> String {
    std::iter::once(c.get_program())
        .chain(c.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Writes a program the CLI embeds (`partition SUBCOMMAND -o FILE`) into the work
/// directory as `name`; its path.
pub fn embedded(env: &Env, subcommand: &str, name: &str) -> Result<PathBuf, String> {
    let p = env.work.join(name);
    let out = Command::new(&env.partition)
        .args([subcommand, "-o"])
        .arg(&p)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(p)
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// `partition caps --json`: what this host's KVM offers (null if it could not be read).
pub fn caps(env: &Env) -> Value {
    Command::new(&env.partition)
        .args(["caps", "--json"])
        .output()
        .ok()
        .and_then(|o| serde_json::from_slice(&o.stdout).ok())
        .unwrap_or(Value::Null)
}

/// The idle policies `partition caps --json` says this host offers (`auto` left out: it
/// only resolves to one of the others).
pub fn offered_policies(env: &Env) -> Vec<String> {
    caps(env)["policies"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|p| p["offered"] == true && p["policy"] != "auto")
                .filter_map(|p| p["policy"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Writes the embedded probe guest into the work directory; its path.
pub fn probe_image(env: &Env) -> Result<PathBuf, String> {
    embedded(env, "probe-image", "probe.elf")
}

/// Milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The parts of `partition launch --json`'s report the sections read (the VMM's own
/// document; unknown fields are ignored, so the report can grow).
#[derive(Clone, Debug, serde::Deserialize)]
pub struct LaunchJson {
    /// How the guest stopped.
    pub outcome: OutcomeJson,
    /// Stage durations.
    pub timings: TimingsJson,
    /// The idle plan and what KVM read back about it, as the VMM wrote them.
    pub idle: Value,
    /// Each vCPU's counters at the end: the VMM's one record of them (the API's and the
    /// ledger's too).
    #[serde(default)]
    pub vcpus: Vec<partition::cpu::exits::VcpuCounters>,
}

/// The report's `outcome`.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct OutcomeJson {
    /// `partition launch`'s exit status.
    pub exit_code: u8,
    /// The sentence the CLI printed.
    pub description: String,
}

/// The report's `timings`, milliseconds.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct TimingsJson {
    /// Getting guest memory.
    pub memory_ms: f64,
    /// VM creation.
    pub vm_ms: f64,
    /// Boot structures.
    pub boot_ms: f64,
    /// Devices and vCPUs.
    pub vcpus_ms: f64,
    /// Launch to the guest's first serial byte.
    pub first_output_ms: Option<f64>,
    /// The launch's timeline to the first byte, phase by phase (empty when the guest never
    /// wrote a byte).
    #[serde(default)]
    pub timeline: Vec<PhaseJson>,
}

/// One phase of the timeline.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct PhaseJson {
    /// Its name (`args`, `check`, `acquire`, ...).
    pub phase: String,
    /// Its length, ms.
    pub ms: f64,
    /// The VMM's CPU time in it (all threads), ms (0 from a VMM before it was recorded).
    #[serde(default)]
    pub cpu_ms: f64,
}

impl LaunchJson {
    /// The report a `--json` launch printed as the last line of `stdout`.
    pub fn from_stdout(stdout: &str) -> Result<Self, String> {
        let line = stdout.lines().last().unwrap_or("");
        serde_json::from_str(line).map_err(|e| format!("no launch report on stdout ({e})"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_console_with_a_stray_byte_keeps_its_text() {
        let mut console: &[u8] =
            b"[ 0.1] boot\n\xff\xfeHOTPATHS-BEGIN\n{}\nHOTPATHS-END status=0\n";
        let text = read_lossy(&mut console);
        assert!(text.starts_with("[ 0.1] boot\n"), "{text}");
        assert!(text.contains("HOTPATHS-END status=0"), "{text}");
        assert!(text.contains('\u{fffd}'));
    }

    #[test]
    fn the_launch_builder_writes_what_a_person_would_type() {
        let env = Env::for_tests();
        let c = Launch::new(&env, Path::new("/w/s"), "1,0", "64M")
            .probe()
            .backing("hugetlb")
            .idle("poll")
            .cmdline("probe.memtest=0")
            .disk(Path::new("/d.img"), ",poll=on")
            .ioeventfd(false)
            .json()
            .command();
        let args: Vec<String> = c
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            args.join(" "),
            "launch --cores 1,0 --memory 64M --probe --backing hugetlb --idle poll \
             --cmdline probe.memtest=0 --disk path=/d.img,poll=on --no-ioeventfd --json"
        );
        assert!(c.get_envs().any(|(k, v)| k == "PARTITION_STATE_DIR"
            && v == Some(std::ffi::OsStr::new("/w/s"))));
        let with = Launch::new(&env, Path::new("/s"), "0", "1G")
            .ioeventfd(true)
            .command();
        assert!(!with.get_args().any(|a| a == "--no-ioeventfd"));
    }

    #[test]
    fn proc_samples_parse_status_and_schedstat() {
        let status = "Name:\tx\nVmRSS:\t    2048 kB\nHugetlbPages:\t  524288 kB\n";
        assert_eq!(ProcSample::status_kib(status, "VmRSS:"), Some(2048));
        assert_eq!(
            ProcSample::status_kib(status, "HugetlbPages:"),
            Some(524288)
        );
        assert_eq!(ProcSample::status_kib(status, "VmSwap:"), None);
        assert_eq!(ProcSample::schedstat_ns("123456 789 10\n"), Some(123456));
        assert_eq!(ProcSample::schedstat_ns(""), None);
        // Our own process: it has run and has resident memory.
        let me = ProcSample::of(std::process::id()).unwrap();
        assert!(me.cpu_ns > 0 && me.rss_kib > 0, "{me:?}");
        assert_eq!(ProcSample::of(u32::MAX), None);
    }

    #[test]
    fn first_byte_and_the_json_report() {
        let mut c = Command::new("sh");
        c.args([
            "-c",
            r#"sleep 0.05; printf 'x\n'; printf '{"outcome":{"kind":"power_off","exit_code":0,"description":"off"},"timings":{"memory_ms":1.5,"vm_ms":2,"boot_ms":0.25,"vcpus_ms":3,"first_output_ms":null},"idle":{"policy":"hlt"},"vcpus":[{"vcpu":0,"core":1,"exits":{"io_out":7},"assists":{},"kvm":{},"marks":[]}],"extra":1}\n'"#,
        ]);
        let r = timed_run(c, Duration::from_secs(10)).unwrap();
        assert!(r.status.success());
        assert!(r.stdout.starts_with("x\n"));
        assert!(r.first_byte.unwrap() >= Duration::from_millis(40));
        let j = LaunchJson::from_stdout(&r.stdout).unwrap();
        assert_eq!(
            (j.outcome.exit_code, j.outcome.description.as_str()),
            (0, "off")
        );
        assert_eq!((j.timings.memory_ms, j.timings.vm_ms), (1.5, 2.0));
        assert_eq!(j.timings.first_output_ms, None);
        assert_eq!(j.idle["policy"], "hlt");
        assert_eq!((j.vcpus[0].core, j.vcpus[0].exits["io_out"]), (1, 7));
        // A launch that printed no report (it failed before the end) is an error.
        assert!(LaunchJson::from_stdout("probe: hello\n").is_err());
        let mut c = Command::new("sleep");
        c.arg("5");
        let r = timed_run(c, Duration::from_millis(200)).unwrap();
        assert!(!r.status.success());
        assert!(r.first_byte.is_none());
    }

    #[test]
    fn the_peer_vmm_command_says_what_it_was_asked() {
        let env = Env {
            partition: "partition".into(),
            work: "/nonexistent".into(),
            qemu: Some("/opt/q".into()),
            qemu_left_out: false,
            ..Env::for_tests()
        };
        let probe = Path::new("/p.elf");
        let args = |c: &Command| {
            std::iter::once(c.get_program())
                .chain(c.get_args())
                .map(|a| a.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
        };
        let mut m = Microvm {
            pin: Some("0,1".into()),
            smp: 2,
            mb: 64,
            acpi: true,
            prealloc: false,
            probe,
            cmdline: "a=1 b",
        };
        let a = args(&m.command(&env));
        // Pinned in the child before exec, not under taskset.
        assert_eq!(a[0], "/opt/q");
        let after = |a: &[String], k: &str| a.iter().position(|x| x == k).map(|i| a[i + 1].clone());
        assert_eq!(after(&a, "-M").as_deref(), Some("microvm"));
        assert_eq!(after(&a, "-smp").as_deref(), Some("2"));
        assert_eq!(after(&a, "-m").as_deref(), Some("64M"));
        assert_eq!(after(&a, "-kernel").as_deref(), Some("/p.elf"));
        assert_eq!(after(&a, "-append").as_deref(), Some("a=1 b"));
        assert!(!a.iter().any(|x| x == "-mem-prealloc"));
        m.pin = None;
        m.acpi = false;
        m.prealloc = true;
        let a = args(&m.command(&env));
        assert_eq!(a[0], "/opt/q");
        assert_eq!(after(&a, "-M").as_deref(), Some("microvm,acpi=off"));
        assert!(a.iter().any(|x| x == "-mem-prealloc"));
        assert_eq!(
            after(&a, "-device").as_deref(),
            Some("isa-debug-exit,iobase=0xf4,iosize=4")
        );
    }
}
