//! Helpers shared by the end-to-end tests: running the `partition` binary with a timeout,
//! parsing the probe guest's report, host facts, tiny hand-made kernels.
#![allow(dead_code)]

pub mod host;
pub mod vfio;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The binary under test, with a state directory of this test process's own (so a
/// reservation on the host running the tests is neither used nor disturbed).
pub fn partition() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_partition"));
    c.env(
        "PARTITION_STATE_DIR",
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("state-{}", std::process::id())),
    );
    c
}

/// This test binary's name (`pool`, `vfio`): what [`skip`] puts before a test's own name.
pub const BINARY: &str = env!("CARGO_CRATE_NAME");

/// The one skip rule (tools/skip): prints that `test` is SKIPPED and why, or fails it if
/// `PARTITION_MUST_RUN` names it, its binary or a prefix of it. A name without its binary's
/// (`probe_boot::`) gets it, so that a platform can require a whole binary.
pub fn skip(test: &str, why: &str) {
    let full = if test.starts_with(&format!("{BINARY}::")) {
        test.to_string()
    } else {
        format!("{BINARY}::{test}")
    };
    skip::skip(&full, why);
}

/// Whether /dev/kvm can be used; prints why not when it cannot.
pub fn kvm_available(test: &str) -> bool {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        Ok(_) => true,
        Err(e) => {
            skip(test, &format!("/dev/kvm is not usable here ({e})"));
            false
        }
    }
}

/// Whether /dev/kvm can be used and this process has two cores for a 2-vCPU partition (or a
/// partition beside the host's core); prints why not when it cannot.
pub fn kvm_and_two_cores(test: &str) -> bool {
    if !kvm_available(test) {
        return false;
    }
    if host_cores() < 2 {
        skip(test, "needs two host cores");
        return false;
    }
    true
}

/// `partition launch --cores 0,1 --memory 64M --probe ARGS...`: a 2-vCPU probe launch
/// (check [`kvm_and_two_cores`] first), within `limit`.
pub fn probe_on_two_cores(args: &[&str], limit: Duration) -> Output {
    let mut all = vec!["launch", "--cores", "0,1", "--memory", "64M", "--probe"];
    all.extend_from_slice(args);
    run(&all, limit)
}

/// A CPU's hypervisor signature as CPUID gives it: the hypervisor bit (leaf 1, ECX bit 31)
/// and, with it set, the 12 bytes of leaf 0x4000_0000 (EBX, ECX, EDX).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuSignature {
    /// Leaf 1 ECX bit 31: running under a hypervisor.
    pub hypervisor: bool,
    /// The hypervisor's vendor signature (`TCGTCGTCGTCG`, `KVMKVMKVM\0\0\0`, ...).
    pub vendor: [u8; 12],
}

impl CpuSignature {
    /// This machine's.
    pub fn this() -> Self {
        let l1 = std::arch::x86_64::__cpuid(1);
        let hypervisor = l1.ecx & (1 << 31) != 0;
        let mut vendor = [0u8; 12];
        if hypervisor {
            // With the hypervisor bit set, leaf 0x4000_0000 is the hypervisor's.
            let h = std::arch::x86_64::__cpuid(0x4000_0000);
            vendor[..4].copy_from_slice(&h.ebx.to_le_bytes());
            vendor[4..8].copy_from_slice(&h.ecx.to_le_bytes());
            vendor[8..].copy_from_slice(&h.edx.to_le_bytes());
        }
        Self { hypervisor, vendor }
    }

    /// Whether it is a QEMU TCG guest's (the rig's outer machine, docs/testing.md).
    pub fn is_qemu_tcg(&self) -> bool {
        self.hypervisor && &self.vendor == b"TCGTCGTCGTCG"
    }
}

/// Whether this machine is a QEMU TCG guest (the rig's outer machine, docs/testing.md).
pub fn under_qemu_tcg() -> bool {
    CpuSignature::this().is_qemu_tcg()
}

/// The doubled-interrupt allowance, the one place it lives: `extra`, the interrupts a
/// guest took beyond those raised (`what` names them, `context` goes with a refusal), on a
/// machine of CPU signature `sig`. None is right; but QEMU TCG's SVM emulation now and then
/// delivers an interrupt to its L2 guest twice with no VM exit between (docs/testing.md, "A
/// doubled interrupt, found"), so under TCG they are allowed (Ok, with the NOTE to print);
/// anywhere else they are refused (Err, the failure's message).
pub fn allow_doubled(
    sig: &CpuSignature,
    what: &str,
    extra: u64,
    context: &str,
) -> Result<Option<String>, String> {
    if extra == 0 {
        return Ok(None);
    }
    if !sig.is_qemu_tcg() {
        return Err(format!(
            "{what}: {extra} interrupt(s) taken more often than raised: {context}"
        ));
    }
    Ok(Some(format!(
        "NOTE {what}: QEMU TCG delivered {extra} interrupt(s) twice ({context})"
    )))
}

/// [`allow_doubled`] on this machine: fails the test where it refuses, prints the NOTE
/// where it allows. Returns `extra`, for bounds that must allow for them.
pub fn doubled_interrupts(what: &str, extra: u64, context: &str) -> u64 {
    match allow_doubled(&CpuSignature::this(), what, extra, context) {
        Ok(note) => {
            if let Some(n) = note {
                println!("{n}");
            }
            extra
        }
        Err(e) => panic!("{e}"),
    }
}

/// Whether this host is the nested kvm_pvm kind (docs/measurement.md, the development host).
pub fn nested_pvm() -> bool {
    Path::new("/sys/module/kvm_pvm").exists()
}

/// The command line the VMM says it gave the guest (`partition: command line: ...`).
pub fn vmm_cmdline(stderr: &str) -> String {
    stderr
        .lines()
        .find_map(|l| l.strip_prefix("partition: command line: "))
        .unwrap_or_else(|| panic!("no command line reported:\n{stderr}"))
        .to_string()
}

/// The words the CPU model puts before the user's command line on this host.
pub fn cpu_model_words() -> &'static str {
    if nested_pvm() {
        "clearcpuid=141,154,151,308,137,147,148,129,153,317,297,580,288 cryptomgr.notests \
         init_on_alloc=0 initcall_blacklist=ftrace_check_for_weak_functions,trace_eval_init "
    } else {
        ""
    }
}

/// What the idle policy a launch resolved added to the guest's command line after the
/// user's words, as its `--json` report says (`idle.cmdline`: `cpuidle.off=1` under
/// `mwait`, `idle=poll` under `poll`), with the space before it; empty when none.
pub fn idle_words(report: &serde_json::Value) -> String {
    match report["idle"]["cmdline"].as_str().unwrap_or_default() {
        "" => String::new(),
        w => format!(" {w}"),
    }
}

/// Number of cores this process may use.
pub fn host_cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Outcome of a finished command.
pub struct Output {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn code(&self) -> i32 {
        self.status.code().unwrap_or(-1)
    }
}

/// Everything `r` gives until EOF, invalid UTF-8 (a guest console can have any byte)
/// replaced rather than losing the whole output.
pub fn read_lossy(r: &mut impl Read) -> String {
    let mut bytes = Vec::new();
    let _ = r.read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The longest any test may wait for one command in the rig (the exits and submit-vfio
/// sections). `wait_output` refuses a longer limit there, and `scripts/rig.sh` derives from this
/// line how long a rig machine may stay silent before it is called hung (scripts/lib.sh
/// `rig_silence`): change it here only.
pub const LONGEST_DEADLINE: Duration = Duration::from_secs(900);

/// Whether a test may wait `limit` for `what`: in the rig (`rig`, a QEMU TCG machine) no
/// longer than [`LONGEST_DEADLINE`], which the rig's silence limit outlasts. The nested
/// host has no silence limit, and a stock kernel's boot there may take 30 minutes.
pub fn deadline_fits(limit: Duration, what: &str, rig: bool) -> Result<(), String> {
    if rig && limit > LONGEST_DEADLINE {
        return Err(format!(
            "{what}: a deadline of {limit:?} exceeds LONGEST_DEADLINE, which the rig's silence limit is made from"
        ));
    }
    Ok(())
}

/// Waits for `child` up to `limit`, killing it (and failing) if it takes longer. The limit
/// is a hang guard, not a speed check.
pub fn wait_output(child: Child, limit: Duration, what: &str) -> Output {
    wait_output_showing(child, limit, what, String::new)
}

/// [`wait_output`], adding `also()` to the failure when it kills the child (a guest's
/// console, which tells where a hung guest was).
pub fn wait_output_showing(
    mut child: Child,
    limit: Duration,
    what: &str,
    also: impl Fn() -> String,
) -> Output {
    if let Err(e) = deadline_fits(limit, what, under_qemu_tcg()) {
        panic!("{e}");
    }
    let start = Instant::now();
    // Drain pipes on threads so a chatty child cannot block on a full pipe.
    let mut out = child.stdout.take();
    let mut err = child.stderr.take();
    let t_out = std::thread::spawn(move || out.as_mut().map(read_lossy).unwrap_or_default());
    let t_err = std::thread::spawn(move || err.as_mut().map(read_lossy).unwrap_or_default());
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            // Killed, the child's pipes close: show what it said until then.
            let said = |s: String| tail(&s, 4096).to_string();
            panic!(
                "{what}: still running after {limit:?}; killed. It said:\n--- stdout (end) ---\n{}\n--- stderr (end) ---\n{}\n{}",
                said(t_out.join().unwrap_or_default()),
                said(t_err.join().unwrap_or_default()),
                also()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: t_out.join().unwrap_or_default(),
        stderr: t_err.join().unwrap_or_default(),
    }
}

/// The last `n` bytes of `s` (at a character boundary).
pub fn tail(s: &str, n: usize) -> &str {
    let mut i = s.len().saturating_sub(n);
    while !s.is_char_boundary(i) {
        i += 1;
    }
    &s[i..]
}

/// The launch report `partition launch --json` prints as the last line of stdout.
pub fn report(stdout: &str) -> serde_json::Value {
    let line = stdout.lines().last().unwrap_or("");
    serde_json::from_str(line).unwrap_or_else(|e| panic!("no JSON report ({e}):\n{stdout}"))
}

/// Runs `partition` with `args`, up to `limit`.
pub fn run(args: &[&str], limit: Duration) -> Output {
    let mut cmd = partition();
    cmd.args(args);
    output_of(cmd, limit, &format!("partition {}", args.join(" ")))
}

/// Runs `cmd` (stdin empty, stdout and stderr captured) up to `limit`.
pub fn output_of(mut cmd: Command, limit: Duration, what: &str) -> Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {what}: {e}"));
    wait_output(child, limit, what)
}

/// One e820 line of the probe's report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct E820 {
    pub start: u64,
    pub end: u64,
    pub kind: u32,
}

/// One memtest range of the probe's report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    pub start: u64,
    pub end: u64,
    pub checksum: u64,
    pub errors: u64,
}

/// What the probe guest printed.
#[derive(Debug, Default)]
pub struct ProbeReport {
    pub protocol: String,
    pub cmdline: Option<String>,
    pub e820: Vec<E820>,
    pub madt_ids: Option<Vec<u32>>,
    pub mptable_ids: Option<Vec<u32>>,
    pub expected: Option<usize>,
    pub started: Option<usize>,
    pub seed: Option<u64>,
    pub ranges: Vec<Range>,
    pub skips: String,
    pub total: Option<(u64, u64, u64)>,
    pub result: Option<String>,
}

fn hex(s: &str) -> u64 {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap_or_else(|_| panic!("hex {s:?}"))
}

fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
}

fn ids(s: &str) -> Vec<u32> {
    let inner = s.trim_start_matches('[').trim_end_matches(']');
    inner
        .split(',')
        .filter(|x| !x.trim().is_empty())
        .map(|x| x.trim().parse().unwrap())
        .collect()
}

/// Parses the probe's `probe: ...` lines.
pub fn parse_probe(out: &str) -> ProbeReport {
    let mut r = ProbeReport::default();
    for line in out.lines() {
        let Some(l) = line.strip_prefix("probe: ") else {
            continue;
        };
        if let Some(rest) = l.strip_prefix("hello ") {
            r.protocol = field(rest, "protocol").unwrap_or_default().to_string();
        } else if let Some(c) = l.strip_prefix("cmdline=") {
            r.cmdline = Some(c.to_string());
        } else if let Some(rest) = l.strip_prefix("e820 0x") {
            let (range, kind) = rest.split_once(' ').unwrap();
            let (a, b) = range.split_once('-').unwrap();
            r.e820.push(E820 {
                start: hex(a),
                end: hex(b),
                kind: field(kind, "type").unwrap().parse().unwrap(),
            });
        } else if let Some(rest) = l.strip_prefix("acpi rsdp=") {
            let madt = rest.split(" apic_ids=").nth(1).unwrap();
            r.madt_ids = Some(ids(madt));
        } else if let Some(rest) = l.strip_prefix("mptable cpus=") {
            r.mptable_ids = Some(ids(rest.split(" apic_ids=").nth(1).unwrap()));
        } else if let Some(rest) = l.strip_prefix("smp ") {
            r.expected = field(rest, "expected").map(|v| v.parse().unwrap());
            r.started = field(rest, "started").map(|v| v.parse().unwrap());
        } else if let Some(rest) = l.strip_prefix("memtest seed=") {
            let (seed, skips) = rest.split_once(' ').unwrap();
            r.seed = Some(hex(seed));
            r.skips = skips.to_string();
        } else if let Some(rest) = l.strip_prefix("memtest range ") {
            let (range, tail) = rest.split_once(' ').unwrap();
            let (a, b) = range.split_once('-').unwrap();
            r.ranges.push(Range {
                start: hex(a),
                end: hex(b),
                checksum: hex(field(tail, "checksum").unwrap()),
                errors: field(tail, "errors").unwrap().parse().unwrap(),
            });
        } else if let Some(rest) = l.strip_prefix("memtest bytes=") {
            let bytes: u64 = rest.split_whitespace().next().unwrap().parse().unwrap();
            r.total = Some((
                bytes,
                hex(field(rest, "checksum").unwrap()),
                field(rest, "errors").unwrap().parse().unwrap(),
            ));
        } else if let Some(rest) = l.strip_prefix("result ") {
            r.result = Some(rest.split_whitespace().next().unwrap().to_string());
        }
    }
    r
}

/// The probe's memtest pattern (tools/probe-guest/src/memtest.rs), recomputed here.
pub fn pattern(a: u64, seed: u64) -> u64 {
    let mut z = (a ^ seed).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Checksum the probe must report for `[start, end)` if every word read back correctly.
pub fn expected_checksum(start: u64, end: u64, seed: u64) -> u64 {
    (start..end)
        .step_by(8)
        .fold(0u64, |acc, a| acc.wrapping_add(pattern(a, seed)))
}

/// The e820 map our VMM promises for `size` bytes (see boot/src/e820.rs).
pub fn expected_e820(size: u64) -> Vec<E820> {
    let low = size.min(0xc000_0000);
    let mut v = vec![
        E820 {
            start: 0,
            end: 0x9fc00,
            kind: 1,
        },
        E820 {
            start: 0x9fc00,
            end: 0x100000,
            kind: 2,
        },
        E820 {
            start: 0x100000,
            end: low,
            kind: 1,
        },
    ];
    if size > low {
        v.push(E820 {
            start: 0x1_0000_0000,
            end: 0x1_0000_0000 + size - low,
            kind: 1,
        });
    }
    v
}

/// A minimal ELF64 x86-64 executable: `code` loaded at 0x200000 (entry), plus `bss` bytes.
pub fn tiny_kernel(code: &[u8], bss: u64) -> Vec<u8> {
    let paddr: u64 = 0x20_0000;
    let off: u64 = 64 + 56;
    let mut b = vec![0u8; 64];
    b[0..4].copy_from_slice(b"\x7fELF");
    b[4] = 2;
    b[5] = 1;
    b[6] = 1;
    b[16..18].copy_from_slice(&2u16.to_le_bytes());
    b[18..20].copy_from_slice(&62u16.to_le_bytes());
    b[20..24].copy_from_slice(&1u32.to_le_bytes());
    b[24..32].copy_from_slice(&paddr.to_le_bytes());
    b[32..40].copy_from_slice(&64u64.to_le_bytes());
    b[52..54].copy_from_slice(&64u16.to_le_bytes());
    b[54..56].copy_from_slice(&56u16.to_le_bytes());
    b[56..58].copy_from_slice(&1u16.to_le_bytes());
    let mut p = vec![0u8; 56];
    p[0..4].copy_from_slice(&1u32.to_le_bytes());
    p[4..8].copy_from_slice(&7u32.to_le_bytes());
    p[8..16].copy_from_slice(&off.to_le_bytes());
    p[16..24].copy_from_slice(&paddr.to_le_bytes());
    p[24..32].copy_from_slice(&paddr.to_le_bytes());
    p[32..40].copy_from_slice(&(code.len() as u64).to_le_bytes());
    p[40..48].copy_from_slice(&(code.len() as u64 + bss).to_le_bytes());
    b.extend_from_slice(&p);
    b.extend_from_slice(code);
    b
}

/// A scratch directory under the target dir, removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Self {
        let p = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
    pub fn file(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Host state a launch must leave as it found it.
#[derive(Debug, PartialEq, Eq)]
pub struct HostState {
    pub hugepages_total: u64,
    pub mounts: String,
    pub our_processes: Vec<u32>,
}

/// Snapshot of hugepages, mounts and running `partition` processes of this build.
pub fn host_state() -> HostState {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let hugepages_total = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("HugePages_Total:"))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0);
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    let exe = std::fs::canonicalize(env!("CARGO_BIN_EXE_partition")).unwrap();
    let mut our_processes = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() {
            if std::fs::read_link(e.path().join("exe")).ok().as_deref() == Some(exe.as_path()) {
                our_processes.push(pid);
            }
        }
    }
    HostState {
        hugepages_total,
        mounts,
        our_processes,
    }
}

/// Waits until a probe launched with `probe.hold=1` says it holds (on `console`); panics
/// with what it said if it exits first or takes longer than `limit`.
pub fn wait_holding(mut child: Child, console: &Path, what: &str, limit: Duration) -> Child {
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(console).unwrap_or_default();
        if text.contains("probe: holding") {
            return child;
        }
        if let Some(st) = child.try_wait().unwrap() {
            let out = wait_output(child, limit, what);
            panic!(
                "{what} exited ({st}) before holding: {}\n{text}",
                out.stderr
            );
        }
        assert!(start.elapsed() < limit, "{what} never held:\n{text}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `name` in one of PATH's directories, if there.
pub fn find_in_path(name: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?
        .to_string_lossy()
        .split(':')
        .map(|d| std::path::Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// QEMU `machine` (microvm with its options) booting the probe ELF with `append` on
/// `smp` vCPUs and 64 MiB, the console on stdout, power-off through isa-debug-exit (status
/// s exits `(s << 1) | 1`), its output piped. Callers add their devices and spawn it.
pub fn qemu_probe(
    qemu: &std::path::Path,
    machine: &str,
    smp: usize,
    probe: &std::path::Path,
    append: &str,
) -> std::process::Command {
    let mut c = std::process::Command::new(qemu);
    c.args(["-M", machine, "-enable-kvm"])
        .args([
            "-cpu",
            "host,-arch-capabilities",
            "-smp",
            &smp.to_string(),
            "-m",
            "64M",
        ])
        .arg("-kernel")
        .arg(probe)
        .args(["-append", append])
        .args(["-nodefaults", "-no-user-config", "-nographic"])
        .args(["-serial", "stdio"])
        .args(["-device", "isa-debug-exit,iobase=0xf4,iosize=4"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// For a test that boots the probe under QEMU: QEMU's path and the probe ELF written into
/// `dir`, or None (after saying why) when QEMU is not installed.
pub fn qemu_and_probe(test: &str, dir: &Scratch) -> Option<(PathBuf, PathBuf)> {
    let Some(qemu) = find_in_path("qemu-system-x86_64") else {
        skip(test, "qemu-system-x86_64 is not installed");
        return None;
    };
    let probe = dir.path("probe.elf");
    let out = run(
        &["probe-image", "-o", probe.to_str().unwrap()],
        Duration::from_secs(30),
    );
    assert_eq!(out.code(), 0, "{}", out.stderr);
    Some((qemu, probe))
}
