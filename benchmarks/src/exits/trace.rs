//! The exits section's instrument: the host kernel's trace buffer with `kvm:kvm_exit` (and
//! `kvm:kvm_msr`) on, the console's announcement of each counted loop, and the arithmetic
//! from the marks' snapshots to exits per iteration by reason.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// Trace buffer per CPU, KiB (a Linux boot and the loops are some 10^5 exits).
const TRACE_KB: u64 = 131_072;

/// A counted loop as hotpaths announced it on the console.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Loop {
    /// Benchmark name.
    pub op: String,
    /// Its loop's order within the benchmark.
    pub part: u32,
    /// Its first mark's number.
    pub mark: u32,
    /// Iterations of the first run.
    pub n1: u64,
    /// Of the second.
    pub n2: u64,
}

/// The `key=value` words after `tag` on a console line (None: no `tag` there).
fn fields<'a>(line: &'a str, tag: &str) -> Option<BTreeMap<&'a str, &'a str>> {
    let rest = &line[line.find(tag)? + tag.len()..];
    Some(
        rest.split_whitespace()
            .filter_map(|w| w.split_once('='))
            .collect(),
    )
}

/// What one iteration adds, from a count at a loop's four marks (A, B around the N1 run,
/// C, D around the N2 run) and n = N2 - N1: ((D - C) - (B - A)) / n.
fn difference([a, b, c, d]: [f64; 4], n: f64) -> f64 {
    ((d - c) - (b - a)) / n
}

/// The `hotpaths-count` lines of a console.
pub fn loops(console: &str) -> Vec<Loop> {
    console
        .lines()
        .filter_map(|l| {
            let kv = fields(l, "hotpaths-count ")?;
            Some(Loop {
                op: kv.get("op")?.to_string(),
                part: kv.get("part")?.parse().ok()?,
                mark: kv.get("mark")?.parse().ok()?,
                n1: kv.get("n1")?.parse().ok()?,
                n2: kv.get("n2")?.parse().ok()?,
            })
        })
        .collect()
}

/// The guest's IPIs per iteration of each counted loop, by kind (`RES`, `CAL`), from the
/// `hotpaths-ipis` lines of a console (hotpaths' counts at a loop's four marks) and the
/// loops' iteration counts: ((D - C) - (B - A)) / (N2 - N1), as the exits.
pub fn ipis_per_iteration(
    console: &str,
    loops: &[Loop],
) -> BTreeMap<(String, u32), BTreeMap<String, f64>> {
    let mut out = BTreeMap::new();
    for l in console.lines() {
        let Some(kv) = fields(l, "hotpaths-ipis ") else {
            continue;
        };
        let (Some(op), Some(part)) = (
            kv.get("op"),
            kv.get("part").and_then(|p| p.parse::<u32>().ok()),
        ) else {
            continue;
        };
        let Some(lp) = loops.iter().find(|x| x.op == *op && x.part == part) else {
            continue;
        };
        let Some(n) = lp.n2.checked_sub(lp.n1).filter(|n| *n > 0) else {
            continue;
        };
        let mut per = BTreeMap::new();
        for (key, name) in [("res", "RES"), ("cal", "CAL")] {
            let v: Vec<f64> = kv
                .get(key)
                .map(|v| {
                    v.split(',')
                        .filter_map(|x| x.parse::<u64>().ok())
                        .map(|x| x as f64)
                        .collect()
                })
                .unwrap_or_default();
            if let [a, b, c, d] = v[..] {
                per.insert(name.to_string(), difference([a, b, c, d], n as f64));
            }
        }
        if !per.is_empty() {
            out.insert((op.to_string(), part), per);
        }
    }
    out
}

/// One `kvm_exit` event: its reason and, for an I/O exit that writes, the port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exit {
    /// The reason as the tracepoint prints it (`io`, `msr`, `npf`, `intr`... on AMD;
    /// `IO_INSTRUCTION`, `MSR_WRITE`... on Intel).
    pub reason: String,
    /// The port of an I/O write.
    pub out_port: Option<u16>,
}

/// Reads one line of the trace: a `kvm_exit` event, or None.
pub fn exit_of(line: &str) -> Option<Exit> {
    let rest = &line[line.find("kvm_exit: ")?..];
    let word_after = |key: &str| {
        let at = rest.find(key)? + key.len();
        rest[at..].split_whitespace().next()
    };
    let reason = word_after(" reason ")?.to_string();
    let info1 = word_after(" info1 ")
        .and_then(|h| u64::from_str_radix(h.trim_start_matches("0x"), 16).ok());
    // The I/O exit's information: the port in bits 31:16 on both vendors; the direction
    // in bit 0 (AMD's EXITINFO1) or bit 3 (Intel's exit qualification), set for IN.
    let out_port = match reason.as_str() {
        "io" => info1.filter(|i| i & 1 == 0),
        "IO_INSTRUCTION" => info1.filter(|i| i & 8 == 0),
        _ => None,
    }
    .map(|i| (i >> 16) as u16);
    Some(Exit { reason, out_port })
}

/// Runs `run` with every KVM exit on the host recorded: its result and the trace (the
/// tracer puts the host's tracing back as it was when dropped, on error too).
pub(super) fn under_trace<T>(
    run: impl FnOnce() -> Result<T, String>,
) -> Result<(T, String), String> {
    let tracer = Tracer::start()?;
    let out = run()?;
    Ok((out, tracer.finish()?))
}

/// The vCPUs that took a shutdown exit (a triple fault: AMD's `shutdown`, Intel's
/// `TRIPLE_FAULT`) in a trace, in order: a guest that stops short with one of these reset,
/// it did not power off (a VMM run with `-no-reboot` exits 0 on either).
pub fn shutdowns(trace: &str) -> Vec<u32> {
    trace
        .lines()
        .filter(|l| {
            exit_of(l).is_some_and(|e| e.reason == "shutdown" || e.reason == "TRIPLE_FAULT")
        })
        .filter_map(vcpu_of)
        .collect()
}

/// The vCPU number of a `kvm_exit` line (`kvm_exit: vcpu N reason ...`).
fn vcpu_of(line: &str) -> Option<u32> {
    let rest = &line[line.find("kvm_exit: vcpu ")? + "kvm_exit: vcpu ".len()..];
    rest.split_whitespace().next()?.parse().ok()
}

/// The CPU a trace line was recorded on (`[001]`).
fn cpu_of(line: &str) -> Option<u32> {
    let open = line.find('[')?;
    let close = open + line[open..].find(']')?;
    line[open + 1..close].trim().parse().ok()
}

/// A `kvm_msr` event: `msr_write 830` -> `msr wr 0x830`.
fn msr_of(line: &str) -> Option<String> {
    let rest = &line[line.find("kvm_msr: msr_")? + "kvm_msr: msr_".len()..];
    let mut w = rest.split_whitespace();
    let dir = match w.next()? {
        "write" => "wr",
        "read" => "rd",
        _ => return None,
    };
    Some(format!("msr {dir} 0x{}", w.next()?))
}

/// The exits counted so far by reason at each mark (marks in the order they were
/// written: mark k is the k-th write to `port`). An `msr` exit followed on its CPU by the
/// `kvm_msr` event KVM traces while handling it is counted under the MSR it touched
/// (`msr wr 0x830`: the x2APIC ICR, an IPI; `0x6e0`: TSC deadline; `0x80b`: EOI).
pub fn snapshots(trace: &str, port: u16) -> Vec<BTreeMap<String, u64>> {
    let mut now: BTreeMap<String, u64> = BTreeMap::new();
    let mut pending = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for line in trace.lines() {
        let cpu = cpu_of(line).unwrap_or(0);
        if let Some(m) = msr_of(line) {
            if pending.remove(&cpu) {
                *now.entry(m).or_default() += 1;
            }
            continue;
        }
        let Some(e) = exit_of(line) else {
            continue;
        };
        if pending.remove(&cpu) {
            *now.entry("msr".into()).or_default() += 1;
        }
        if e.reason == "msr" {
            pending.insert(cpu);
            continue;
        }
        *now.entry(e.reason.clone()).or_default() += 1;
        if e.out_port == Some(port) {
            out.push(now.clone());
        }
    }
    out
}

/// Exits per iteration of `l`, by reason, from the snapshots (`first`: the number of the
/// first mark hotpaths writes, whose snapshot is index 0). None if a mark is missing.
pub fn per_iteration(
    snaps: &[BTreeMap<String, u64>],
    first: u32,
    l: &Loop,
) -> Option<BTreeMap<String, f64>> {
    let at = |k: u32| snaps.get(l.mark.checked_sub(first)?.checked_add(k)? as usize);
    let (a, b, c, d) = (at(0)?, at(1)?, at(2)?, at(3)?);
    let n = (l.n2.checked_sub(l.n1)?) as f64;
    let reasons: std::collections::BTreeSet<&String> = a
        .keys()
        .chain(b.keys())
        .chain(c.keys())
        .chain(d.keys())
        .collect();
    let get = |m: &BTreeMap<String, u64>, r: &String| *m.get(r).unwrap_or(&0) as f64;
    Some(
        reasons
            .into_iter()
            .map(|r| (r.clone(), difference([a, b, c, d].map(|m| get(m, r)), n)))
            .collect(),
    )
}

/// hotpaths' first mark number (`benchmarks/hotpaths/src/counted.rs`).
pub const FIRST_MARK: u32 = 0x1000;

/// The kernel's trace buffer, recording `kvm:kvm_exit` while it lives; everything it set
/// is put back when it drops (and tracefs unmounted if it mounted it).
pub struct Tracer {
    root: PathBuf,
    mounted: bool,
    old_kb: String,
    /// The events this tracer enabled (it leaves alone those already on: enabling or
    /// disabling one patches kernel text, which the rig does once, with one CPU online).
    enabled: Vec<&'static str>,
}

/// The events a trace records: every exit, and which MSR an msr exit touched (where the
/// kernel has that event).
const EVENTS: [(&str, bool); 2] = [("kvm/kvm_exit", true), ("kvm/kvm_msr", false)];

impl Tracer {
    fn write(&self, file: &str, v: &str) -> Result<(), String> {
        std::fs::write(self.root.join(file), v)
            .map_err(|e| format!("{}: {e}", self.root.join(file).display()))
    }

    /// Starts recording every KVM exit on the host.
    pub fn start() -> Result<Self, String> {
        let root = PathBuf::from("/sys/kernel/tracing");
        let mut mounted = false;
        if !root.join("events").exists() {
            let st = std::process::Command::new("mount")
                .args(["-t", "tracefs", "nodev"])
                .arg(&root)
                .status()
                .map_err(|e| format!("mount tracefs: {e}"))?;
            if !st.success() {
                return Err(format!("mount -t tracefs nodev {} failed", root.display()));
            }
            mounted = true;
        }
        let old_kb = std::fs::read_to_string(root.join("buffer_size_kb"))
            .unwrap_or_default()
            .trim()
            .to_string();
        let mut t = Self {
            root,
            mounted,
            old_kb,
            enabled: Vec::new(),
        };
        if !t.root.join("events/kvm/kvm_exit").exists() {
            return Err("no kvm:kvm_exit tracepoint (is the kvm module loaded?)".into());
        }
        t.write("tracing_on", "0")?;
        t.write("buffer_size_kb", &TRACE_KB.to_string())?;
        t.write("trace", "")?;
        for (event, needed) in EVENTS {
            let file = format!("events/{event}/enable");
            let on = std::fs::read_to_string(t.root.join(&file)).is_ok_and(|v| v.trim() == "1");
            if on {
                continue;
            }
            match t.write(&file, "1") {
                Ok(()) => t.enabled.push(event),
                Err(e) if needed => return Err(e),
                Err(_) => {}
            }
        }
        t.write("tracing_on", "1")?;
        Ok(t)
    }

    /// Stops recording and returns the trace; fails if any CPU's buffer overran.
    pub fn finish(&self) -> Result<String, String> {
        self.write("tracing_on", "0")?;
        let mut lost = 0u64;
        for e in std::fs::read_dir(self.root.join("per_cpu"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let stats = std::fs::read_to_string(e.path().join("stats")).unwrap_or_default();
            lost += stats
                .lines()
                .filter_map(|l| l.strip_prefix("overrun: ")?.trim().parse::<u64>().ok())
                .sum::<u64>();
        }
        if lost > 0 {
            return Err(format!(
                "the trace buffer overran ({lost} events lost): counts incomplete"
            ));
        }
        std::fs::read_to_string(self.root.join("trace"))
            .map_err(|e| format!("reading the trace: {e}"))
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        let _ = self.write("tracing_on", "0");
        for event in &self.enabled {
            let _ = self.write(&format!("events/{event}/enable"), "0");
        }
        let _ = self.write("trace", "");
        if !self.old_kb.is_empty() {
            let _ = self.write("buffer_size_kb", &self.old_kb);
        }
        if self.mounted {
            let _ = std::process::Command::new("umount")
                .arg(&self.root)
                .status();
        }
    }
}
