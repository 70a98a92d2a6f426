//! `host` and `guest`: the hotpaths suite (benchmarks/hotpaths) on the bare host and in a
//! Linux partition on the same cores, per idle policy, rounds alternating.
//!
//! The host side runs the static binary pinned to the partition's cores (`--cpus C,H`:
//! the process on C, second processes on C or H). The guest side boots the image
//! `scripts/guest-image.sh` builds (its init runs the same binary with `--cpus 0,1`; vCPU 0
//! is pinned to C, vCPU 1 to H) on 1 GiB of hugepage memory, once per idle policy the host
//! offers. Each hotpaths run is itself lmbench's median of 11 repetitions per benchmark;
//! rows give the median over rounds with the min-max spread.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::doc::hotpaths::{
    GuestImage, GuestParams, GuestSection, HostParams, HostSection, HotRow, PolicyRows,
};
use crate::head::Head;
use crate::stats::summary;
use crate::{Env, HugepageCount, Launch, timed_run};

/// What the guest rows mean on the nested kvm_pvm host (recorded with them).
pub const NESTED_LIMITATION: &str = "guest kernel entries are emulated on this host: /dev/kvm is the \
    nested kvm_pvm module, which runs guest ring 0 in KVM's instruction emulator (about a \
    microsecond an instruction), and every guest system call also goes through the VMM's \
    SYSCALL repair (a page fault, a debug exit and back). Guest ring 3 runs natively, but \
    the Linux guest's timer interrupt (100 Hz) runs its handler in the emulator for \
    milliseconds inside every timed interval, so its ring-3 rows (memory latency and \
    bandwidth) can be inflated too, by an amount that varies from run to run. No row of \
    the Linux guest compares the VMM with the host here; the probe \
    guest, which takes no timer interrupts, does (its memory chase is at parity with the \
    host's).";

/// hotpaths' arguments inside the guest: one suite run per launch; on a nested kvm_pvm host
/// the memory-latency chase stops at 64 MiB, because every guest page fault there runs in
/// the host's instruction emulator (several milliseconds a 4 KiB page: the 256 MiB chase
/// alone would be minutes of faults).
fn guest_hotpaths_args(nested: bool) -> &'static str {
    if nested {
        "--runs 1 --cpus 0,1 --max-mem 67108864"
    } else {
        "--runs 1 --cpus 0,1"
    }
}

/// How long one guest launch may take: a boot and one suite run; on a nested host both run
/// at the emulator's pace.
fn guest_time_limit(nested: bool) -> Duration {
    Duration::from_secs(if nested { 1800 } else { 600 })
}

/// Guest rounds per policy: every round asked for, except on a nested kvm_pvm host, where a
/// launch is minutes of emulated ring 0 (about six with a 2-vCPU boot and one suite run)
/// and one round per policy is what a run can afford.
fn guest_rounds(nested: bool, runs: usize) -> usize {
    if nested { runs.min(1) } else { runs }
}

/// One hotpaths result row.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// Benchmark name.
    pub name: String,
    /// Unit (us, ns, MB/s).
    pub unit: String,
    /// Median of the run's repetitions (of its runs, if it ran several).
    pub value: f64,
}

/// A hotpaths JSON document: its rows and its errors.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Rows in the order the suite printed them.
    pub rows: Vec<Row>,
    /// Benchmark -> error.
    pub errors: BTreeMap<String, String>,
    /// The whole document.
    pub raw: Value,
}

/// Parses hotpaths' JSON (the first line that parses as its document).
pub fn parse(text: &str) -> Option<Report> {
    let doc: Value = text
        .lines()
        .filter(|l| l.trim_start().starts_with('{'))
        .find_map(|l| serde_json::from_str::<Value>(l.trim()).ok())
        .filter(|v| v["suite"] == "hotpaths")?;
    let rows = doc["results"]
        .as_array()?
        .iter()
        .filter_map(|r| {
            Some(Row {
                name: r["name"].as_str()?.to_string(),
                unit: r["unit"].as_str()?.to_string(),
                value: r["median"].as_f64()?,
            })
        })
        .collect();
    let errors = doc["errors"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                .collect()
        })
        .unwrap_or_default();
    Some(Report {
        rows,
        errors,
        raw: doc,
    })
}

/// The hotpaths output between the guest init's markers.
pub fn between_markers(console: &str) -> Option<&str> {
    let start = console.find("HOTPATHS-BEGIN")?;
    let end = console[start..].find("HOTPATHS-END")? + start;
    Some(&console[start + "HOTPATHS-BEGIN".len()..end])
}

/// Writes the embedded hotpaths binary into the work directory.
pub fn binary(env: &Env) -> Result<PathBuf, String> {
    crate::embedded(env, "hotpaths-binary", "hotpaths")
}

/// Runs hotpaths on the host with `args`; the parsed report.
pub fn run_host(bin: &Path, args: &[&str], dir: &Path) -> Result<Report, String> {
    let mut c = Command::new(bin);
    c.args(args).arg("--json").arg("--dir").arg(dir);
    let r = timed_run(c, Duration::from_secs(600)).map_err(|e| e.to_string())?;
    let rep = parse(&r.stdout).ok_or_else(|| {
        format!(
            "hotpaths exited {:?} without a report: {}",
            r.status.code(),
            r.stderr.trim()
        )
    })?;
    if !rep.errors.is_empty() {
        return Err(format!("hotpaths errors: {:?}", rep.errors));
    }
    Ok(rep)
}

/// Values per benchmark across runs.
#[derive(Default)]
pub struct Series {
    /// name -> (unit, values).
    pub values: BTreeMap<String, (String, Vec<f64>)>,
    /// Names in first-seen order.
    pub order: Vec<String>,
    /// What went wrong.
    pub failures: Vec<String>,
}

impl Series {
    /// Adds one run's rows.
    pub fn add(&mut self, rep: &Report) {
        for r in &rep.rows {
            if !self.values.contains_key(&r.name) {
                self.order.push(r.name.clone());
            }
            self.values
                .entry(r.name.clone())
                .or_insert_with(|| (r.unit.clone(), Vec::new()))
                .1
                .push(r.value);
        }
    }
    /// Rows: name, unit, median, spread, runs, per-run values.
    pub fn rows(&self) -> Vec<HotRow> {
        self.order
            .iter()
            .filter_map(|n| {
                let (unit, v) = &self.values[n];
                let s = summary(v)?;
                Some(HotRow {
                    name: n.clone(),
                    unit: unit.clone(),
                    median: s.median,
                    spread: [s.min, s.max],
                    runs: s.n,
                    per_run: v.clone(),
                })
            })
            .collect()
    }
    /// Runs recorded for `name`.
    pub fn runs(&self, name: &str) -> usize {
        self.values.get(name).map_or(0, |v| v.1.len())
    }
}

/// The guest image in `dir`: the kernel (the ELF `vmlinux`, which boots without
/// decompressing itself, else `bzImage`) and `initramfs.cpio` (uncompressed).
pub fn image_files(dir: &Path) -> Option<(PathBuf, PathBuf)> {
    let k = [dir.join("vmlinux"), dir.join("bzImage")]
        .into_iter()
        .find(|k| k.is_file())?;
    let i = dir.join("initramfs.cpio");
    i.is_file().then_some((k, i))
}

fn guest_cmd(env: &Env, policy: &str, kernel: &Path, initrd: &Path, args: &str) -> Command {
    Launch::new(
        env,
        &env.work.join("guest-state"),
        &format!("{},{}", env.core, env.host_core),
        "1G",
    )
    .backing("hugetlb")
    .idle(policy)
    .kernel(kernel, initrd)
    .cmdline(&format!(
        "console=ttyS0 earlyprintk=serial,ttyS0 panic=-1 hotpaths.args={}",
        args.replace(' ', "+")
    ))
    .command()
}

/// What a failed guest run showed: exit status, the console's last lines and the VMM's
/// errors (or its last lines when it printed none).
fn guest_failure(r: &crate::Run) -> String {
    let tail = |s: &str, n: usize| {
        let v: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
        v[v.len().saturating_sub(n)..].join(" | ")
    };
    let errors: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| l.contains("error") || l.contains("FATAL"))
        .take(3)
        .collect();
    format!(
        "exit {:?}; console: {}; vmm: {}",
        r.status.code(),
        tail(&r.stdout, 2),
        if errors.is_empty() {
            tail(&r.stderr, 3)
        } else {
            errors.join(" | ")
        }
    )
}

/// Runs `host` and/or `guest`, alternating: the sections wanted.
pub fn run(
    env: &Env,
    want_host: bool,
    want_guest: bool,
) -> (Option<HostSection>, Option<GuestSection>) {
    let head = Head::start(env);
    let cpus = format!("{},{}", env.core, env.host_core);
    let host_args = ["--runs", "1", "--cpus", &cpus];
    let mut host = Series::default();
    let mut host_section = HostSection {
        head: head.clone(),
        params: HostParams {
            runs: env.runs,
            cpus: vec![env.core, env.host_core],
            pinning: "the process on the first CPU; second processes of *_1core on it too, of *_2cores on the second".into(),
            hotpaths_args: host_args.iter().map(|a| a.to_string()).collect(),
        },
        method: "hotpaths (lmbench's loops and timing: each value is the median of 11 timed repetitions of at least 5 ms after a discarded warm-up, less the empty loop), once per round; rows are the median over rounds with the min-max spread; rounds alternate with the guest runs".into(),
        rows: None,
        failures: None,
    };
    let mut guest_section = GuestSection {
        head,
        params: GuestParams {
            runs: guest_rounds(crate::nested_pvm(), env.runs),
            runs_asked: env.runs,
            vcpus_on_cores: vec![env.core, env.host_core],
            memory: "1 GiB, 2 MiB hugepages".into(),
            hotpaths_args: guest_hotpaths_args(crate::nested_pvm()).into(),
            time_limit_s: guest_time_limit(crate::nested_pvm()).as_secs(),
        },
        policies: None,
        image: None,
        host_limitation: false,
        limitation: None,
    };
    let bin = match binary(env) {
        Ok(b) => b,
        Err(e) => {
            let why = format!("writing the hotpaths binary: {e}");
            host_section.head.fail(why.clone());
            guest_section.head.fail(why);
            return (
                want_host.then_some(host_section),
                want_guest.then_some(guest_section),
            );
        }
    };

    // The guest: an image, and the policies this host offers.
    let image = env.guest_image.as_deref().and_then(image_files);
    let policies = crate::offered_policies(env);
    let mut guests: BTreeMap<String, Series> = BTreeMap::new();
    let mut guest_notes: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut guest_blocked: Option<String> = None;
    if want_guest {
        match &image {
            None => {
                guest_blocked = Some(format!(
                    "no guest image at {}: scripts/guest-image.sh builds it{}",
                    env.guest_image
                        .as_deref()
                        .map_or("benchmarks/cache/guest-image/current".into(), |p| p
                            .display()
                            .to_string()),
                    ""
                ))
            }
            Some(_) => {
                for p in &policies {
                    guests.insert(p.clone(), Series::default());
                }
            }
        }
    }
    let hugepages = if want_guest && !guests.is_empty() {
        let g = HugepageCount::grow(512);
        if g.is_none() {
            guest_blocked = Some("the kernel could not find 512 free 2 MiB hugepages".into());
            guests.clear();
        }
        g
    } else {
        None
    };

    let mut jobs: Vec<String> = Vec::new();
    if want_host {
        jobs.push("host".into());
    }
    jobs.extend(guests.keys().cloned());
    let mut crashed: Option<String> = None;
    for round in 0..env.runs {
        let mut order = jobs.clone();
        let n = order.len().max(1);
        order.rotate_left(round % n);
        for job in order {
            if job == "host" {
                match run_host(&bin, &host_args, &env.work) {
                    Ok(r) => host.add(&r),
                    Err(e) => host.failures.push(e),
                }
                continue;
            }
            let Some((kernel, initrd)) = &image else {
                continue;
            };
            if round >= guest_rounds(crate::nested_pvm(), env.runs) {
                continue;
            }
            if crashed.is_some() {
                continue; // the kernel crashed once: it will under every policy
            }
            let s = guests.get_mut(&job).expect("present");
            if !s.failures.is_empty() {
                continue; // failed once: the reason is recorded, do not repeat it
            }
            let nested = crate::nested_pvm();
            let c = guest_cmd(env, &job, kernel, initrd, guest_hotpaths_args(nested));
            match timed_run(c, guest_time_limit(nested)) {
                Ok(r) => match between_markers(&r.stdout).and_then(parse) {
                    Some(rep) if rep.errors.is_empty() => {
                        s.add(&rep);
                        let notes = guest_notes.entry(job.clone()).or_default();
                        if notes.is_empty() {
                            notes.extend(
                                r.stdout
                                    .lines()
                                    .filter(|l| l.starts_with("guest: "))
                                    .map(String::from),
                            );
                        }
                    }
                    Some(rep) => s
                        .failures
                        .push(format!("hotpaths errors: {:?}", rep.errors)),
                    None => {
                        let why = guest_failure(&r);
                        if r.status.code() == Some(3) {
                            crashed = Some(format!("--idle {job}: {why}"));
                        }
                        s.failures.push(why);
                    }
                },
                Err(e) => s.failures.push(e.to_string()),
            }
        }
    }
    drop(hugepages);

    let host_out = want_host.then(|| {
        let complete = host.failures.is_empty()
            && !host.order.is_empty()
            && host.order.iter().all(|n| host.runs(n) == env.runs);
        host_section.rows = Some(host.rows());
        host_section.failures = Some(host.failures.clone());
        host_section.head.finish(complete, || {
            format!("host runs failed: {:?}", host.failures)
        });
        host_section
    });
    let guest_out = want_guest.then(|| {
        let rows = guests
            .iter()
            .map(|(p, s)| PolicyRows {
                policy: p.clone(),
                rows: s.rows(),
                failures: s.failures.clone(),
                guest_lines: guest_notes.get(p).cloned(),
            })
            .collect();
        if let Some(c) = &crashed {
            guest_blocked = Some(format!(
                "the guest kernel crashed, so no policy was measured (the first crash is shown; the others were not tried): {c}"
            ));
        }
        let complete = guest_blocked.is_none()
            && !guests.is_empty()
            && guests.values().all(|s| {
                s.failures.is_empty()
                    && s.runs("null_syscall") == guest_rounds(crate::nested_pvm(), env.runs)
            });
        guest_section.policies = Some(rows);
        if let Some(img) = &image {
            guest_section.image = Some(GuestImage {
                kernel: img.0.clone(),
                initramfs: img.1.clone(),
                inputs: std::fs::read_to_string(img.0.with_file_name("inputs")).ok(),
            });
        }
        if crate::nested_pvm() {
            // The numbers are real, but they measure the nested host's emulator.
            guest_section.host_limitation = true;
            guest_section.limitation = Some(NESTED_LIMITATION.into());
        }
        guest_section.head.finish(complete, || {
            guest_blocked.clone().unwrap_or_else(|| {
                guests
                    .iter()
                    .filter(|(_, s)| !s.failures.is_empty())
                    .map(|(p, s)| format!("--idle {p}: {}", s.failures.join("; ")))
                    .collect::<Vec<_>>()
                    .join(" / ")
            })
        });
        guest_section
    });
    (host_out, guest_out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nested_host_runs_one_guest_round_per_policy() {
        assert_eq!(guest_rounds(true, 5), 1);
        assert_eq!(guest_rounds(true, 0), 0);
        assert_eq!(guest_rounds(false, 5), 5);
        assert!(guest_hotpaths_args(true).contains("--max-mem 67108864"));
        assert!(!guest_hotpaths_args(false).contains("--max-mem"));
        assert!(guest_time_limit(true) > guest_time_limit(false));
    }

    #[test]
    fn parses_reports_and_markers() {
        let doc = r#"{"suite":"hotpaths","version":1,"results":[{"name":"null_syscall","unit":"us","median":0.19,"min":0.19,"max":0.2,"per_run":[0.19]},{"name":"mem_lat_512","unit":"ns","median":1.2,"min":1.2,"max":1.2,"per_run":[1.2]}],"errors":{"fork_exec":"boom"}}"#;
        let console = format!("guest: kernel 6.1\nHOTPATHS-BEGIN\n{doc}\nHOTPATHS-END status=0\n");
        let inner = between_markers(&console).unwrap();
        let r = parse(inner).unwrap();
        assert_eq!(r.rows.len(), 2);
        assert_eq!(r.rows[0].name, "null_syscall");
        assert_eq!(r.rows[1].unit, "ns");
        assert_eq!(r.errors["fork_exec"], "boom");
        assert!(parse("not json\n{\"suite\":\"other\"}").is_none());
        assert!(between_markers("HOTPATHS-BEGIN only").is_none());
        let mut s = Series::default();
        s.add(&r);
        s.add(&r);
        assert_eq!(s.runs("null_syscall"), 2);
        assert_eq!(s.rows()[0].median, 0.19);
    }
}
