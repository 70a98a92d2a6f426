//! Facts about the host a benchmark result must carry (docs/measurement.md): what the CPU
//! is, how it idles and clocks, the kernel and its command line, mitigations, memory and
//! hugepages, isolation, KVM and its module's parameters, the tools, the commit, and the host
//! report `partition caps` prints (each setting that costs a partition latency).
//!
//! Read here, in Rust, from /proc, /sys and a few commands, so that a result carries them
//! wherever it is measured: inside the rig there is no Python (it once recorded
//! `{"error":"running python3: ..."}`) and no git. Every field degrades to null rather
//! than failing. Where git cannot say the commit, `PARTITION_COMMIT` (and
//! `PARTITION_COMMIT_DIRTY`, `true` or `false`) say it: `scripts/rig-bench.sh` passes the
//! checkout's into the rig.

use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{Map, Value, json};

/// Environment variable naming the commit when git cannot (inside the rig).
pub const COMMIT_ENV: &str = "PARTITION_COMMIT";
/// Whether that commit had uncommitted changes (`true`, `false`).
pub const DIRTY_ENV: &str = "PARTITION_COMMIT_DIRTY";

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

fn text(v: Option<String>) -> Value {
    v.map_or(Value::Null, Value::String)
}

/// `cmd args...`'s standard output, trimmed, if it ran and succeeded.
fn run(cmd: &str, args: &[&str], cwd: Option<&Path>) -> Option<String> {
    let mut c = Command::new(cmd);
    c.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if let Some(d) = cwd {
        c.current_dir(d);
    }
    let out = c.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The first `name : value` line of `/proc/cpuinfo`'s text.
fn cpuinfo_field(cpuinfo: &str, name: &str) -> Option<String> {
    cpuinfo.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == name).then(|| v.trim().to_string())
    })
}

/// `/proc/meminfo`'s hugepage lines, Hugepagesize and MemTotal.
fn meminfo(text: &str) -> Value {
    let mut out = Map::new();
    for l in text.lines() {
        if let Some((k, v)) = l.split_once(':') {
            if k.starts_with("HugePages") || k == "Hugepagesize" || k == "MemTotal" {
                out.insert(k.to_string(), Value::String(v.trim().to_string()));
            }
        }
    }
    if out.is_empty() {
        Value::Null
    } else {
        Value::Object(out)
    }
}

/// Every file of directory `dir` by name, its contents trimmed (null if no directory).
fn files_of(dir: &str) -> Value {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Value::Null;
    };
    let mut names: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut out = Map::new();
    for n in names {
        if let Some(v) = read(&format!("{dir}/{n}")) {
            out.insert(n, Value::String(v));
        }
    }
    if out.is_empty() {
        Value::Null
    } else {
        Value::Object(out)
    }
}

fn kvm(cpuinfo: &str) -> Value {
    let vendor = ["kvm_intel", "kvm_amd", "kvm_pvm"]
        .into_iter()
        .rfind(|m| Path::new(&format!("/sys/module/{m}")).is_dir());
    let flags = cpuinfo_field(cpuinfo, "flags").unwrap_or_default();
    let nested = match vendor {
        Some(v @ ("kvm_intel" | "kvm_amd")) => read(&format!("/sys/module/{v}/parameters/nested")),
        _ => None,
    };
    json!({
        "dev_kvm": Path::new("/dev/kvm").exists(),
        "vendor_module": vendor,
        "params": files_of("/sys/module/kvm/parameters"),
        "vendor_params": vendor.map_or(Value::Null, |v| files_of(&format!("/sys/module/{v}/parameters"))),
        // The host itself runs under a hypervisor (the CPUID "hypervisor" bit), so guests
        // here are nested: figures are L2 against an L1 baseline.
        "host_is_a_guest": flags.split_whitespace().any(|f| f == "hypervisor"),
        "nested_param": text(nested),
    })
}

fn cpuidle() -> Value {
    let mut states = Vec::new();
    let base = "/sys/devices/system/cpu/cpu0/cpuidle";
    let mut dirs: Vec<String> = std::fs::read_dir(base)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("state"))
        .collect();
    dirs.sort();
    for d in dirs {
        let f = |x: &str| text(read(&format!("{base}/{d}/{x}")));
        states
            .push(json!({"name": f("name"), "latency_us": f("latency"), "disabled": f("disable")}));
    }
    json!({
        "driver": text(read("/sys/devices/system/cpu/cpuidle/current_driver")),
        "governor": text(
            read("/sys/devices/system/cpu/cpuidle/current_governor_ro")
                .or_else(|| read("/sys/devices/system/cpu/cpuidle/current_governor"))
        ),
        "states": if states.is_empty() { Value::Null } else { Value::Array(states) },
    })
}

fn rapl() -> Value {
    let mut zones: Vec<String> = std::fs::read_dir("/sys/class/powercap")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("intel-rapl:") || n.starts_with("amd-rapl:"))
        .filter_map(|n| read(&format!("/sys/class/powercap/{n}/name")))
        .collect();
    zones.sort();
    json!({
        "available": !zones.is_empty(),
        "zones": if zones.is_empty() { Value::Null } else { json!(zones) },
    })
}

/// The commit of `repo` and whether it had uncommitted changes (the results files, which a
/// run writes, left out); from [`COMMIT_ENV`] and [`DIRTY_ENV`] where git cannot say.
/// The commit checked out at `dir` (git looks up from there) and whether tracked files
/// anywhere in the checkout other than `exclude` (pathspecs) have changed (None when git cannot say); None outside
/// a checkout.
pub fn checkout(dir: &Path, exclude: &[&str]) -> Option<(String, Option<bool>)> {
    let head = run("git", &["rev-parse", "HEAD"], Some(dir)).filter(|h| !h.is_empty())?;
    // The whole checkout (`:/`), wherever in it `dir` is.
    let mut args = vec!["status", "--porcelain", "--untracked-files=no", "--", ":/"];
    args.extend(exclude);
    let dirty = run("git", &args, Some(dir)).map(|d| !d.is_empty());
    Some((head, dirty))
}

fn commit(repo: Option<&Path>) -> (Value, Value) {
    if let Some((c, dirty)) = repo.and_then(|r| checkout(r, &[":(top,exclude)benchmarks/results"]))
    {
        return (json!(c), dirty.map_or(Value::Null, |d| json!(d)));
    }
    let env = std::env::var(COMMIT_ENV).ok().filter(|c| !c.is_empty());
    let dirty = std::env::var(DIRTY_ENV)
        .ok()
        .and_then(|d| d.parse::<bool>().ok());
    (
        env.map_or(Value::Null, Value::String),
        dirty.map_or(Value::Null, Value::Bool),
    )
}

/// Every fact, for the host this runs on and the checkout at `repo` (if known).
pub fn collect(repo: Option<&Path>) -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |n: &str| text(cpuinfo_field(&cpuinfo, n));
    let (commit, dirty) = commit(repo);
    let hostname = read("/proc/sys/kernel/hostname").filter(|h| !h.is_empty());
    let qemu = run("qemu-system-x86_64", &["--version"], None)
        .and_then(|v| v.lines().next().map(str::to_string));
    json!({
        "hostname": text(hostname),
        "date_utc": now_utc(),
        "cpu_model": field("model name"),
        "microcode": field("microcode"),
        "cpus_online": text(read("/sys/devices/system/cpu/online")),
        "smt_active": text(read("/sys/devices/system/cpu/smt/active")),
        "governor": text(read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")),
        "energy_performance_preference": text(read(
            "/sys/devices/system/cpu/cpu0/cpufreq/energy_performance_preference"
        )),
        "cpuidle": cpuidle(),
        "kernel": text(read("/proc/sys/kernel/osrelease")),
        "kernel_cmdline": text(read("/proc/cmdline")),
        "mitigations": files_of("/sys/devices/system/cpu/vulnerabilities"),
        "memory": meminfo(&std::fs::read_to_string("/proc/meminfo").unwrap_or_default()),
        "isolated_cpus": text(read("/sys/devices/system/cpu/isolated")),
        "nohz_full": text(read("/sys/devices/system/cpu/nohz_full")),
        "kvm": kvm(&cpuinfo),
        "rapl": rapl(),
        "tsc_mhz": field("cpu MHz"),
        "rustc": text(run("rustc", &["--version"], None)),
        "qemu": text(qemu),
        "commit": commit,
        "commit_dirty": dirty,
        "host_report": host_report(),
    })
}

/// `partition caps`'s host report for every online core: each setting that costs a
/// partition latency, read when the figures were taken (docs/operations.md).
fn host_report() -> Value {
    let cores = partition::config::cores::available();
    let irqbalance = partition::host::irqbalance::running().map(|d| (d.pid, false));
    serde_json::to_value(partition::host::tuning::report(
        Path::new("/"),
        &cores,
        "all online",
        irqbalance,
        &[],
    ))
    .unwrap_or(Value::Null)
}

/// UTC timestamp.
pub fn now_utc() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fields_every_result_reads_are_there_and_degrade_to_null() {
        let p = collect(Some(Path::new(env!("CARGO_MANIFEST_DIR"))));
        for key in [
            "hostname",
            "date_utc",
            "cpu_model",
            "kernel",
            "kernel_cmdline",
            "mitigations",
            "memory",
            "kvm",
            "commit",
            "commit_dirty",
            "host_report",
        ] {
            assert!(p.get(key).is_some(), "no {key} in {p}");
        }
        // The host report names the settings a figure was taken under.
        let settings: Vec<&str> = p["host_report"]["findings"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| f["setting"].as_str())
            .collect();
        for s in ["idle-states", "nohz_full", "mitigations", "irqbalance"] {
            assert!(settings.contains(&s), "{s} not in {settings:?}");
        }
        assert!(p["kernel"].is_string(), "{p}");
        assert!(p["kvm"]["dev_kvm"].is_boolean(), "{p}");
        // This checkout is a git repository: its commit is named.
        assert_eq!(p["commit"].as_str().map(str::len), Some(40), "{p}");
        // Parsing, on text of a known shape.
        let cpuinfo = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu hypervisor\n";
        assert_eq!(
            cpuinfo_field(cpuinfo, "model name").as_deref(),
            Some("AMD EPYC")
        );
        assert_eq!(cpuinfo_field(cpuinfo, "microcode"), None);
        let m = meminfo("MemTotal:  100 kB\nMemFree: 5 kB\nHugePages_Total:   2\n");
        assert_eq!(m, json!({"MemTotal": "100 kB", "HugePages_Total": "2"}));
        assert_eq!(meminfo(""), Value::Null);
    }
}
