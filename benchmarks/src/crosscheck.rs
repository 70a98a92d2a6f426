//! `crosscheck`: our bare-host figures against independent tools from Debian's packages,
//! run in the same session, alternating, pinned to the same core.
//!
//! - lmbench 3 (Debian's `lmbench`, from non-free; `scripts/bench.sh` unpacks it without
//!   installing it) for every hotpaths figure it measures: `lat_syscall`, `lat_sig`,
//!   `lat_pipe`, `lat_unix`, `lat_ctx -s 0 2`, `lat_proc fork`, `lat_mem_rd -N 1 -t`, `bw_mem`;
//! - stress-ng's `switch` stressor (`--switch-method sem-sysv`: its per-switch time is
//!   half a semaphore ping-pong) against hotpaths' context switch;
//! - rt-tests' `cyclictest` (SCHED_OTHER, 1 ms interval) against the `wake` section's
//!   host timer lateness (`clock_nanosleep`, the same loop);
//! - fio (random 4 KiB reads at depth 1, psync and io_uring, warm and O_DIRECT) against the
//!   `blk` section's host rows, on the same file.
//!
//! Each pair is measured once per round, the two tools back to back in an order that
//! alternates; rows give both medians over rounds, their ratio, and whether they agree
//! within 20%.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::doc::crosscheck::{CrossRow, CrosscheckParams, CrosscheckSection};
use crate::head::Head;
use crate::hotpaths;
use crate::stats::summary;
use crate::{Env, timed_run};

/// The agreement the issue asks for.
pub const TOLERANCE: f64 = 0.20;

/// The first number after `prefix:` on a line of lmbench's output.
pub fn lm_value(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(prefix))
        .and_then(|r| r.trim_start_matches(':').split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// `lat_ctx`: the time on the line for `procs` processes.
pub fn lm_ctx(text: &str, procs: u32) -> Option<f64> {
    text.lines().find_map(|l| {
        let mut w = l.split_whitespace();
        (w.next()? == procs.to_string())
            .then(|| w.next()?.parse().ok())
            .flatten()
    })
}

/// `lat_mem_rd`: (MB, ns) pairs.
pub fn lm_mem(text: &str) -> Vec<(f64, f64)> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let a = w.next()?.parse().ok()?;
            let b = w.next()?.parse().ok()?;
            w.next().is_none().then_some((a, b))
        })
        .collect()
}

/// cyclictest's histogram (`-h`): the median latency in microseconds.
pub fn cyclic_median(text: &str) -> Option<f64> {
    let mut buckets: Vec<(u64, u64)> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
        })
        .collect();
    buckets.sort();
    let total: u64 = buckets.iter().map(|b| b.1).sum();
    if total == 0 {
        return None;
    }
    let mut seen = 0;
    for (us, n) in buckets {
        seen += n;
        if seen * 2 >= total {
            return Some(us as f64);
        }
    }
    None
}

/// fio's JSON: the median total latency of reads, ns.
pub fn fio_median(json_text: &str) -> Option<f64> {
    let start = json_text.find('{')?;
    let v: Value = serde_json::from_str(&json_text[start..]).ok()?;
    v["jobs"][0]["read"]["lat_ns"]["percentile"]["50.000000"].as_f64()
}

/// stress-ng's `nanosecs per context switch` metric.
pub fn stress_switch_ns(text: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.contains("nanosecs per context switch"))
        .and_then(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let i = words.iter().position(|w| *w == "nanosecs")?;
            words[..i].iter().rev().find_map(|w| w.parse().ok())
        })
}

fn run_out(mut c: Command) -> Result<String, String> {
    let what = format!("{:?}", c.get_program());
    c.stdin(std::process::Stdio::null());
    let r = timed_run(c, Duration::from_secs(300)).map_err(|e| format!("{what}: {e}"))?;
    if !r.status.success() {
        return Err(format!(
            "{what} exited {:?}: {}",
            r.status.code(),
            r.stderr.lines().last().unwrap_or("")
        ));
    }
    Ok(format!("{}\n{}", r.stdout, r.stderr))
}

fn taskset(core: usize, prog: &Path) -> Command {
    let mut c = Command::new("taskset");
    c.arg("-c").arg(core.to_string()).arg(prog);
    c
}

/// One comparison: ours and theirs, values per round.
#[derive(Default)]
struct Pair {
    ours: Vec<f64>,
    theirs: Vec<f64>,
    failures: Vec<String>,
}

/// What is compared: (row, our figure, their tool and figure, unit, note on method).
struct Spec {
    row: &'static str,
    ours: &'static str,
    theirs: &'static str,
    unit: &'static str,
}

const LM: &[Spec] = &[
    Spec {
        row: "null syscall",
        ours: "null_syscall",
        theirs: "lat_syscall null",
        unit: "us",
    },
    Spec {
        row: "read",
        ours: "read",
        theirs: "lat_syscall read",
        unit: "us",
    },
    Spec {
        row: "write",
        ours: "write",
        theirs: "lat_syscall write",
        unit: "us",
    },
    Spec {
        row: "stat",
        ours: "stat",
        theirs: "lat_syscall stat FILE",
        unit: "us",
    },
    Spec {
        row: "open/close",
        ours: "open_close",
        theirs: "lat_syscall open FILE",
        unit: "us",
    },
    Spec {
        row: "signal install",
        ours: "sig_install",
        theirs: "lat_sig install",
        unit: "us",
    },
    Spec {
        row: "signal catch",
        ours: "sig_catch",
        theirs: "lat_sig catch",
        unit: "us",
    },
    Spec {
        row: "pipe round trip",
        ours: "pipe_1core",
        theirs: "lat_pipe",
        unit: "us",
    },
    Spec {
        row: "AF_UNIX round trip",
        ours: "unix_1core",
        theirs: "lat_unix",
        unit: "us",
    },
    Spec {
        row: "context switch (2 procs)",
        ours: "ctx_switch_1core",
        theirs: "lat_ctx -s 0 2",
        unit: "us",
    },
    Spec {
        row: "fork+exit",
        ours: "fork_exit",
        theirs: "lat_proc fork",
        unit: "us",
    },
    Spec {
        row: "memory latency 16 KiB",
        ours: "mem_lat_16384",
        theirs: "lat_mem_rd -N 1 -t",
        unit: "ns",
    },
    Spec {
        row: "memory latency 1 MiB",
        ours: "mem_lat_1048576",
        theirs: "lat_mem_rd -N 1 -t",
        unit: "ns",
    },
    Spec {
        row: "memory latency 64 MiB",
        ours: "mem_lat_67108864",
        theirs: "lat_mem_rd -N 1 -t",
        unit: "ns",
    },
    Spec {
        row: "read bandwidth 64 MiB",
        ours: "bw_rd",
        theirs: "bw_mem 64m rd",
        unit: "MB/s",
    },
    Spec {
        row: "write bandwidth 64 MiB",
        ours: "bw_wr",
        theirs: "bw_mem 64m wr",
        unit: "MB/s",
    },
    Spec {
        row: "copy bandwidth 64 MiB",
        ours: "bw_bcopy",
        theirs: "bw_mem 64m bcopy",
        unit: "MB/s",
    },
];

/// Runs lmbench's programs once; our-name -> value.
fn lmbench_once(
    dir: &Path,
    core: usize,
    file: &Path,
) -> Result<BTreeMap<&'static str, f64>, String> {
    let mut out = BTreeMap::new();
    let f = file.to_string_lossy().to_string();
    let run = |prog: &str, args: &[&str]| -> Result<String, String> {
        let mut c = taskset(core, &dir.join(prog));
        c.args(args);
        run_out(c)
    };
    let get = |t: &str, p: &str, what: &str| {
        lm_value(t, p).ok_or_else(|| format!("{what}: no \"{p}\" in {:?}", t.trim()))
    };
    for (ours, args, prefix) in [
        ("null_syscall", vec!["null"], "Simple syscall"),
        ("read", vec!["read"], "Simple read"),
        ("write", vec!["write"], "Simple write"),
        ("stat", vec!["stat", &f], "Simple stat"),
        ("open_close", vec!["open", &f], "Simple open/close"),
    ] {
        let t = run("lat_syscall", &args)?;
        out.insert(ours, get(&t, prefix, "lat_syscall")?);
    }
    let t = run("lat_sig", &["install"])?;
    out.insert(
        "sig_install",
        get(&t, "Signal handler installation", "lat_sig")?,
    );
    let t = run("lat_sig", &["catch"])?;
    out.insert("sig_catch", get(&t, "Signal handler overhead", "lat_sig")?);
    let t = run("lat_pipe", &[])?;
    out.insert("pipe_1core", get(&t, "Pipe latency", "lat_pipe")?);
    let t = run("lat_unix", &[])?;
    out.insert(
        "unix_1core",
        get(&t, "AF_UNIX sock stream latency", "lat_unix")?,
    );
    let t = run("lat_ctx", &["-s", "0", "2"])?;
    out.insert(
        "ctx_switch_1core",
        lm_ctx(&t, 2).ok_or_else(|| format!("lat_ctx: {:?}", t.trim()))?,
    );
    let t = run("lat_proc", &["fork"])?;
    out.insert("fork_exit", get(&t, "Process fork+exit", "lat_proc")?);
    // One repetition per round (lmbench runs 11): the random chains of every size up to
    // 64 MiB take 44 s at 11; the rounds give the median.
    let t = run("lat_mem_rd", &["-N", "1", "-t", "64", "64"])?;
    let pts = lm_mem(&t);
    for (name, bytes) in [
        ("mem_lat_16384", 16384.0),
        ("mem_lat_1048576", 1048576.0),
        ("mem_lat_67108864", 67108864.0),
    ] {
        let mb = bytes / 1048576.0;
        let v = pts
            .iter()
            .min_by(|a, b| (a.0 - mb).abs().total_cmp(&(b.0 - mb).abs()))
            .filter(|p| (p.0 - mb).abs() / mb < 0.05)
            .map(|p| p.1)
            .ok_or_else(|| format!("lat_mem_rd: no point near {mb} MB"))?;
        out.insert(name, v);
    }
    for (name, what) in [("bw_rd", "rd"), ("bw_wr", "wr"), ("bw_bcopy", "bcopy")] {
        let t = run("bw_mem", &["64m", what])?;
        let v = lm_mem(&t)
            .first()
            .map(|p| p.1)
            .ok_or_else(|| format!("bw_mem {what}: {:?}", t.trim()))?;
        out.insert(name, v);
    }
    Ok(out)
}

fn row(
    name: &str,
    ours_label: &str,
    theirs_label: &str,
    unit: &str,
    p: &Pair,
    note: Option<&str>,
) -> CrossRow {
    let o = summary(&p.ours);
    let t = summary(&p.theirs);
    let ratio = match (o, t) {
        (Some(o), Some(t)) if t.median > 0.0 => Some(o.median / t.median),
        _ => None,
    };
    CrossRow {
        row: name.into(),
        ours: ours_label.into(),
        theirs: theirs_label.into(),
        unit: unit.into(),
        ours_median: o.map(|s| s.median),
        ours_spread: o.map(|s| [s.min, s.max]),
        theirs_median: t.map(|s| s.median),
        theirs_spread: t.map(|s| [s.min, s.max]),
        ours_over_theirs: ratio,
        within_20_percent: ratio.map(|r| (r - 1.0).abs() <= TOLERANCE),
        runs: [p.ours.len(), p.theirs.len()],
        note: note.map(String::from),
        failures: p.failures.clone(),
    }
}

/// Runs the section.
pub fn run(env: &Env) -> CrosscheckSection {
    let mut section = CrosscheckSection {
        head: Head::start(env),
        params: CrosscheckParams {
            runs: env.runs,
            core: env.core,
            tolerance: TOLERANCE,
            lmbench: env.lmbench.clone(),
        },
        method: "each pair measured once per round, back to back, which goes first alternating by round; both pinned to the same core; medians over rounds with min-max spread".into(),
        rows: None,
    };
    let bin = match hotpaths::binary(env) {
        Ok(b) => b,
        Err(e) => {
            section
                .head
                .fail(format!("writing the hotpaths binary: {e}"));
            return section;
        }
    };
    let file = env.work.join("crosscheck-stat-me");
    let image = env.work.join("crosscheck.img");
    if let Err(e) = std::fs::write(&file, b"hotpaths\n")
        .and_then(|_| crate::host::make_image(&image, 64 << 20).map(|_| ()))
    {
        section.head.fail(format!("scratch files: {e}"));
        return section;
    }
    let core = env.core;
    let cpu = core.to_string();
    let fstr = file.to_string_lossy().to_string();
    let have = |p: &str| crate::host::on_path(p).is_some();
    let lm: Option<PathBuf> = env
        .lmbench
        .clone()
        .filter(|d| d.join("lat_syscall").is_file());

    let mut lm_pairs: BTreeMap<&str, Pair> = LM.iter().map(|s| (s.ours, Pair::default())).collect();
    let mut stress = Pair::default();
    let mut cyclic = Pair::default();
    let fio_rows = [
        ("pread warm", "psync", false),
        ("io_uring warm", "io_uring", false),
        ("pread direct", "psync", true),
        ("io_uring direct", "io_uring", true),
    ];
    let mut fio: BTreeMap<&str, Pair> = fio_rows.iter().map(|r| (r.0, Pair::default())).collect();

    for round in 0..env.runs {
        let ours_first = round % 2 == 0;
        // lmbench against hotpaths.
        if let Some(dir) = &lm {
            let ours = || {
                hotpaths::run_host(
                    &bin,
                    &[
                        "--cpus",
                        &cpu,
                        "--runs",
                        "1",
                        "--file",
                        &fstr,
                        "--no-thp",
                        "--only",
                        "null_syscall,read,write,stat,open_close,sig,pipe_1core,unix_1core,ctx_switch_1core,fork_exit,mem_lat_16384,mem_lat_1048576,mem_lat_67108864,bw",
                    ],
                    &env.work,
                )
            };
            let theirs = || lmbench_once(dir, core, &file);
            let (o, t) = if ours_first {
                let o = ours();
                (o, theirs())
            } else {
                let t = theirs();
                (ours(), t)
            };
            for (name, p) in lm_pairs.iter_mut() {
                match &o {
                    Ok(r) => match r.rows.iter().find(|x| x.name == *name) {
                        Some(x) => p.ours.push(x.value),
                        None => p.failures.push(format!("hotpaths gave no {name}")),
                    },
                    Err(e) => p.failures.push(format!("hotpaths: {e}")),
                }
                match &t {
                    Ok(m) => match m.get(name) {
                        Some(v) => p.theirs.push(*v),
                        None => p.failures.push(format!("lmbench gave no {name}")),
                    },
                    Err(e) => p.failures.push(format!("lmbench: {e}")),
                }
            }
        }
        // stress-ng's switch against our context switch.
        if have("stress-ng") {
            let ours = hotpaths::run_host(
                &bin,
                &["--cpus", &cpu, "--runs", "1", "--only", "ctx_switch_1core"],
                &env.work,
            );
            let mut c = Command::new("stress-ng");
            c.args([
                "--switch",
                "1",
                "--switch-method",
                "sem-sysv",
                "--switch-ops",
                "200000",
            ])
            .args(["--metrics", "--taskset", &cpu]);
            let theirs = run_out(c).and_then(|t| {
                stress_switch_ns(&t).ok_or_else(|| format!("stress-ng: no switch metric: {t}"))
            });
            match (ours, theirs) {
                (Ok(o), Ok(t)) => {
                    if let Some(x) = o.rows.first() {
                        stress.ours.push(x.value);
                    }
                    stress.theirs.push(t / 1000.0);
                }
                (o, t) => stress
                    .failures
                    .push(format!("{:?} / {:?}", o.err(), t.err())),
            }
        }
        // cyclictest against our clock_nanosleep lateness.
        if have("cyclictest") {
            let mut c = Command::new("cyclictest");
            c.args(["-q", "-l", "1000", "-i", "1000", "-a", &cpu, "-h", "10000"]);
            let theirs = run_out(c).and_then(|t| {
                cyclic_median(&t).ok_or_else(|| "cyclictest: no histogram".to_string())
            });
            let ours = crate::wake::host_timer(core, 1000, Duration::from_millis(1));
            match theirs {
                Ok(t) => {
                    cyclic.theirs.push(t);
                    if let Some(s) = summary(&ours) {
                        cyclic.ours.push(s.median / 1000.0);
                    }
                }
                Err(e) => cyclic.failures.push(e),
            }
        }
        // fio against the blk section's host rows.
        if have("fio") {
            crate::host::pin(core);
            for (name, engine, direct) in fio_rows {
                let p = fio.get_mut(name).expect("present");
                let ours = if engine == "psync" {
                    crate::blk::host_pread(&image, direct, 1000, Duration::ZERO)
                } else {
                    crate::blk::host_uring(&image, direct, 1000, Duration::ZERO)
                };
                let mut c = Command::new("fio");
                c.args([
                    "--name=x",
                    "--rw=randread",
                    "--bs=4k",
                    "--iodepth=1",
                    "--invalidate=0",
                ])
                .arg(format!("--filename={}", image.display()))
                .arg(format!("--ioengine={engine}"))
                .arg(format!("--direct={}", u8::from(direct)))
                .args(["--number_ios=1100", "--size=64M", "--lat_percentiles=1"])
                .args(["--randrepeat=1", "--output-format=json"])
                .arg(format!("--cpus_allowed={core}"));
                let theirs = run_out(c)
                    .and_then(|t| fio_median(&t).ok_or_else(|| "fio: no lat_ns p50".to_string()));
                match (ours, theirs) {
                    (Ok(o), Ok(t)) => {
                        if let Some(s) = summary(&o[o.len() / 11..]) {
                            p.ours.push(s.median / 1000.0);
                        }
                        p.theirs.push(t / 1000.0);
                    }
                    (o, t) => p.failures.push(format!("{:?} / {:?}", o.err(), t.err())),
                }
            }
        }
    }

    let mut rows = Vec::new();
    for s in LM {
        rows.push(row(
            s.row,
            s.ours,
            s.theirs,
            s.unit,
            &lm_pairs[s.ours],
            None,
        ));
    }
    rows.push(row(
        "context switch (2 procs)",
        "ctx_switch_1core",
        "stress-ng --switch 1 --switch-method sem-sysv",
        "us",
        &stress,
        Some("stress-ng's figure is half a System V semaphore ping-pong, the semop() calls included; lmbench's (and ours) subtracts the cost of the token passing itself"),
    ));
    rows.push(row(
        "timer wake lateness (1 ms clock_nanosleep)",
        "wake: clock_nanosleep lateness",
        "cyclictest -i 1000 (SCHED_OTHER), histogram median",
        "us",
        &cyclic,
        Some("cyclictest's histogram has 1 us buckets"),
    ));
    for (name, engine, direct) in fio_rows {
        rows.push(row(
            &format!("4 KiB random read depth 1, {name}"),
            &format!("blk: host {name} (no gap)"),
            &format!(
                "fio --ioengine={engine} --direct={} --invalidate=0, lat p50",
                u8::from(direct)
            ),
            "us",
            &fio[name],
            Some("fio's latency includes its own per-I/O accounting (clock reads, io_u handling)"),
        ));
    }
    let mut missing = Vec::new();
    if lm.is_none() {
        missing.push(format!(
            "lmbench not found ({}): scripts/bench.sh unpacks Debian's package",
            env.lmbench
                .as_ref()
                .map_or("PARTITION_LMBENCH unset".into(), |p| p
                    .display()
                    .to_string())
        ));
    }
    for t in ["stress-ng", "cyclictest", "fio"] {
        if !have(t) {
            missing.push(format!("{t} not installed"));
        }
    }
    let all_runs = rows.iter().all(|r| r.runs == [env.runs, env.runs]);
    let complete = missing.is_empty() && all_runs;
    section.head.finish(complete, || {
        let failed: Vec<String> = rows
            .iter()
            .filter(|r| !r.failures.is_empty())
            .map(|r| format!("{:?}: {:?}", r.row, r.failures))
            .collect();
        format!("{}; {}", missing.join("; "), failed.join("; "))
    });
    section.rows = Some(rows);
    let _ = std::fs::remove_file(&file);
    let _ = std::fs::remove_file(&image);
    section
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_tools() {
        assert_eq!(
            lm_value("Simple syscall: 0.1955 microseconds\n", "Simple syscall"),
            Some(0.1955)
        );
        assert_eq!(
            lm_value(
                "Simple open/close: 2.7279 microseconds",
                "Simple open/close"
            ),
            Some(2.7279)
        );
        assert_eq!(lm_value("nothing", "Simple read"), None);
        assert_eq!(lm_ctx("\n\"size=0k ovr=0.78\n2 2.28\n", 2), Some(2.28));
        assert_eq!(
            lm_mem("\"stride=64\n0.00049 1.234\n64.00000 120.5\n"),
            vec![(0.00049, 1.234), (64.0, 120.5)]
        );
        assert_eq!(
            cyclic_median("# Histogram\n000010 000001\n000011 000005\n000012 000004\n# Total"),
            Some(11.0)
        );
        assert_eq!(cyclic_median("# nothing"), None);
        let fio = r#"note: both iodepth >= 1 and synchronous I/O engine are selected
{"jobs":[{"read":{"lat_ns":{"percentile":{"50.000000":1400}}}}]}"#;
        assert_eq!(fio_median(fio), Some(1400.0));
        let sng = "stress-ng: metrc: [1] switch              3178.48 nanosecs per context switch (sem-sysv method) (harmonic mean of 1 instances)";
        assert_eq!(stress_switch_ns(sng), Some(3178.48));
        let old = "stress-ng: info:  [52] switch: (pipe) 6042.75 nanosecs per context switch (based on 1 instance)";
        assert_eq!(stress_switch_ns(old), Some(6042.75));
    }
}
