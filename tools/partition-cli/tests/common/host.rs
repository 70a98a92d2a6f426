//! The pool tests' host: one test at a time (a lock), a state directory of its own, and
//! every host setting a reservation touches put back on drop, after a failure too (used by
//! tests/pool.rs and tests/soak.rs).

use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use super::*;

/// The lock that makes a binary's pool tests run one at a time.
pub static SERIAL: Mutex<()> = Mutex::new(());
/// How long one command may take.
pub const LIMIT: Duration = Duration::from_secs(120);

/// What a reservation may touch, snapshot for comparison.
#[derive(Debug, PartialEq, Eq, Clone)]
pub struct HostSettings {
    pub nr_hugepages: String,
    pub hugetlbfs_mounts: Vec<String>,
    /// Each top-level cpuset (v1) or cgroup (v2) and its `cpuset.cpus`.
    pub cpusets: Vec<(String, String)>,
    pub irq_affinities: Vec<(String, String)>,
    pub default_affinity: String,
}

pub fn cpuset_root() -> Option<PathBuf> {
    let m = std::fs::read_to_string("/proc/mounts").ok()?;
    m.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 3 && f[2] == "cgroup" && f[3].split(',').any(|o| o == "cpuset"))
            .then(|| PathBuf::from(f[1]))
    })
}

/// The cgroup v2 hierarchy's mount point, when its cpuset controller is available there
/// (the rig mounts only v2; docs/testing.md).
pub fn cgroup2_cpuset_root() -> Option<PathBuf> {
    let m = std::fs::read_to_string("/proc/mounts").ok()?;
    m.lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 2 && f[2] == "cgroup2").then(|| PathBuf::from(f[1]))
        })
        .filter(|r| {
            std::fs::read_to_string(r.join("cgroup.controllers"))
                .is_ok_and(|c| c.split_whitespace().any(|x| x == "cpuset"))
        })
}

pub fn settings() -> HostSettings {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    let mut irqs = Vec::new();
    for e in std::fs::read_dir("/proc/irq").unwrap().flatten() {
        let f = e.path().join("smp_affinity_list");
        if let Ok(v) = std::fs::read_to_string(&f) {
            irqs.push((f.display().to_string(), v.trim().to_string()));
        }
    }
    irqs.sort();
    // The cpusets (v1) and the cgroups (v2) at the top of each hierarchy.
    let mut cpusets: Vec<(String, String)> = [cpuset_root(), cgroup2_cpuset_root()]
        .into_iter()
        .flatten()
        .filter_map(|r| std::fs::read_dir(r).ok())
        .flatten()
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| {
            let cpus = std::fs::read_to_string(e.path().join("cpuset.cpus")).unwrap_or_default();
            (e.path().display().to_string(), cpus.trim().to_string())
        })
        .collect();
    cpusets.sort();
    HostSettings {
        nr_hugepages: std::fs::read_to_string("/proc/sys/vm/nr_hugepages").unwrap(),
        hugetlbfs_mounts: mounts
            .lines()
            .filter(|l| l.contains(" hugetlbfs "))
            .map(String::from)
            .collect(),
        cpusets,
        irq_affinities: irqs,
        default_affinity: std::fs::read_to_string("/proc/irq/default_smp_affinity")
            .unwrap_or_default(),
    }
}

/// Holds the test lock, a fresh state directory, and the host settings to restore.
pub struct Host {
    _serial: std::sync::MutexGuard<'static, ()>,
    pub dir: PathBuf,
    pub before: HostSettings,
}

impl Host {
    pub fn new(name: &str) -> Option<Self> {
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        if !kvm_available(name) {
            return None;
        }
        if host_cores() < 2 {
            skip(name, "reserving a core needs a second one for the host");
            return None;
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            skip(name, "reserving hugepages and cpusets needs root");
            return None;
        }
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("pool-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Some(Self {
            _serial: serial,
            dir,
            before: settings(),
        })
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.run_env(args, &[])
    }

    pub fn run_env(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        run_in(&self.dir, args, env)
    }

    /// Starts a probe partition that stays up, and waits until it has said so.
    pub fn hold(&self, name: &str, memory: &str, extra: &str) -> Child {
        hold_in(&self.dir, name, memory, extra)
    }

    pub fn status(&self) -> serde_json::Value {
        let out = self.run(&["status", "--json"]);
        assert_eq!(out.code(), 0, "status: {}", out.stderr);
        serde_json::from_str(&out.stdout).unwrap()
    }

    pub fn ledger(&self) -> String {
        std::fs::read_to_string(self.dir.join("ledger.json")).unwrap_or_default()
    }

    pub fn ledger_json(&self) -> serde_json::Value {
        serde_json::from_str(&self.ledger()).unwrap()
    }

    pub fn reserve(&self, memory: &str) {
        let out = self.run(&["reserve", "--memory", memory, "--cores", "1"]);
        assert_eq!(out.code(), 0, "reserve: {}", out.stderr);
        // It says which cores the host keeps (it once read "0 left to the host").
        let kept: Vec<String> = partition::config::cores::available()
            .into_iter()
            .filter(|&c| c != 1)
            .map(|c| c.to_string())
            .collect();
        let line = format!(
            "core 1 reserved for partitions; the host keeps {} {}",
            if kept.len() == 1 { "core" } else { "cores" },
            partition::config::cores::format(
                &kept
                    .iter()
                    .map(|c| c.parse().unwrap())
                    .collect::<Vec<usize>>()
            )
        );
        assert!(
            out.stderr.contains(&line),
            "want {line:?} in {}",
            out.stderr
        );
    }
}

/// Starts a probe partition on core 1 from the reservation in state directory `dir` that
/// stays up, and waits until it has said so.
pub fn hold_in(dir: &std::path::Path, name: &str, memory: &str, extra: &str) -> Child {
    let log = dir.join(format!("{name}.console"));
    let child = partition()
        .args([
            "launch", "--name", name, "--cores", "1", "--memory", memory, "--probe",
        ])
        .args(["--cmdline", &format!("probe.hold=1 {extra}"), "--console"])
        .arg(&log)
        .env("PARTITION_STATE_DIR", dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_holding(child, &log, name, LIMIT)
}

/// `partition ARGS` with state directory `dir`, within [`LIMIT`].
pub fn run_in(dir: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = partition();
    cmd.args(args)
        .env("PARTITION_STATE_DIR", dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    wait_output(cmd.spawn().unwrap(), LIMIT, &args.join(" "))
}

impl Drop for Host {
    fn drop(&mut self) {
        // Stop whatever a failed test left running, then give everything back.
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&self.ledger()) {
            for p in v["partitions"].as_array().into_iter().flatten() {
                if let Some(pid) = p["pid"].as_u64() {
                    // SAFETY: signalling a launcher this test started.
                    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                }
                let _ = self.run(&["release", p["name"].as_str().unwrap_or("")]);
            }
        }
        let _ = self.run(&["unreserve"]);
        // Whatever is still different, put back by hand.
        let now = settings();
        if now != self.before {
            eprintln!(
                "test left host settings changed; restoring by hand\n  before: {:?}\n  now:    {:?}",
                self.before, now
            );
            if let Some(root) = cpuset_root() {
                let ours = std::fs::read_dir(&root)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| {
                        let p_str = p.display().to_string();
                        p.is_dir() && !self.before.cpusets.iter().any(|(c, _)| *c == p_str)
                    });
                for p in ours {
                    if let Ok(t) = std::fs::read_to_string(p.join("tasks")) {
                        for tid in t.lines() {
                            let _ = std::fs::write(root.join("tasks"), tid);
                        }
                    }
                    let _ = std::fs::remove_dir(&p);
                }
            }
            for (f, v) in &self.before.irq_affinities {
                let _ = std::fs::write(f, v);
            }
            let _ = std::fs::write(
                "/proc/irq/default_smp_affinity",
                &self.before.default_affinity,
            );
            let mnt = self.dir.join("hugetlbfs-2048k");
            let _ = std::process::Command::new("umount").arg(&mnt).status();
            let _ = std::fs::write("/proc/sys/vm/nr_hugepages", &self.before.nr_hugepages);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Launches the probe as `name` on pool extent `64M@0` with its zero check (`cmdline`
/// added), and returns its console.
pub fn zerocheck_launch(h: &Host, name: &str, cmdline: &str) -> String {
    let log = h.dir.join(format!("{name}.console"));
    let out = h.run(&[
        "launch",
        "--name",
        name,
        "--cores",
        "1",
        "--memory",
        "64M@0",
        "--probe",
        "--cmdline",
        &format!("probe.zerocheck=1 {cmdline}"),
        "--console",
        log.to_str().unwrap(),
    ]);
    assert_eq!(out.code(), 0, "{name}: {}", out.stderr);
    std::fs::read_to_string(log).unwrap()
}

/// Whether the probe's console says its memory was all zero when it started.
pub fn probe_zero(console: &str) -> bool {
    let line = console
        .lines()
        .find(|l| l.starts_with("probe: zerocheck"))
        .unwrap_or_else(|| panic!("no zerocheck line in:\n{console}"));
    line.contains("all_zero=true")
}

/// The partition's keeper: the launcher's child named `partition-keep`.
pub fn keeper_of(launcher: u32) -> Option<u32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|&pid| {
            partition::host::ledger::proc_stat(pid).is_some_and(|st| st.ppid == launcher)
                && std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|c| c.trim() == "partition-keep")
        })
}

/// Kills a holding launcher's keeper, then the launcher (in that order, so the keeper
/// cannot start giving the partition back).
pub fn kill_launcher_and_keeper(mut c: Child) {
    let keeper = keeper_of(c.id()).expect("a keeper beside the launcher");
    // SAFETY: killing our own child's child.
    unsafe { libc::kill(keeper as i32, libc::SIGKILL) };
    // SAFETY: killing our own child.
    unsafe { libc::kill(c.id() as i32, libc::SIGKILL) };
    let _ = c.wait();
}

/// Someone else's cpuset (Docker's `docker`, podman's `libpod_parent`, libvirt's `machine`,
/// a kubelet's `kubepods`) at the top of the cpuset hierarchy (v1) or of cgroup v2, with a
/// task in it and, with `child`, a cpuset inside it with a task of its own: what a
/// reservation must take its cores from and give back exactly. Removed on drop (tasks
/// killed first).
pub struct ForeignCpuset {
    pub dir: PathBuf,
    pub child: Option<PathBuf>,
    tasks: Vec<Child>,
    v2: bool,
    /// The v2 root's subtree_control had no cpuset until this enabled it.
    enabled: Option<PathBuf>,
}

impl ForeignCpuset {
    /// `NAME` holding `cpus`; None where this host has no cpuset hierarchy to make it in.
    pub fn new(name: &str, cpus: &str, child: bool) -> Option<Self> {
        let (root, v2) = match (cpuset_root(), cgroup2_cpuset_root()) {
            (Some(r), _) => (r, false),
            (None, Some(r)) => (r, true),
            _ => return None,
        };
        let write = |p: PathBuf, v: &str| {
            std::fs::write(&p, v).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        };
        let mut enabled = None;
        if v2 {
            let ctl = root.join("cgroup.subtree_control");
            if !std::fs::read_to_string(&ctl)
                .unwrap_or_default()
                .split_whitespace()
                .any(|c| c == "cpuset")
            {
                write(ctl.clone(), "+cpuset");
                enabled = Some(ctl);
            }
        }
        let dir = root.join(format!("{name}-{}", std::process::id()));
        let mut f = Self {
            dir: dir.clone(),
            child: None,
            tasks: Vec::new(),
            v2,
            enabled,
        };
        let mems = std::fs::read_to_string(root.join(if v2 {
            "cpuset.mems.effective"
        } else {
            "cpuset.mems"
        }))
        .unwrap();
        let make = |d: &PathBuf, f: &mut Self| {
            std::fs::create_dir(d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
            write(d.join("cpuset.cpus"), cpus);
            write(d.join("cpuset.mems"), mems.trim());
            if v2 {
                let ctl = d.join("cgroup.subtree_control");
                let _ = std::fs::write(ctl, "+cpuset");
            }
            let t = std::process::Command::new("sleep")
                .arg("3600")
                .stdin(Stdio::null())
                .spawn()
                .unwrap();
            let procs = if v2 { "cgroup.procs" } else { "tasks" };
            let target = if v2 && child && d == &dir {
                // cgroup v2 allows no task beside child cgroups that use controllers: the
                // parent's task goes to a leaf of its own.
                let leaf = d.join("leaf");
                std::fs::create_dir(&leaf).unwrap();
                write(leaf.join("cpuset.cpus"), cpus);
                leaf.join(procs)
            } else {
                d.join(procs)
            };
            write(target, &t.id().to_string());
            f.tasks.push(t);
        };
        make(&dir, &mut f);
        if child {
            let c = dir.join("child");
            make(&c, &mut f);
            f.child = Some(c);
        }
        Some(f)
    }

    /// A cpuset's `cpuset.cpus` now.
    pub fn cpus(dir: &std::path::Path) -> String {
        std::fs::read_to_string(dir.join("cpuset.cpus"))
            .unwrap_or_default()
            .trim()
            .to_string()
    }

    /// The CPUs each of its tasks may run on now (`Cpus_allowed_list`).
    pub fn task_cpus(&self) -> Vec<Vec<usize>> {
        self.tasks
            .iter()
            .map(|t| {
                let st = std::fs::read_to_string(format!("/proc/{}/status", t.id())).unwrap();
                let l = st
                    .lines()
                    .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                    .unwrap();
                partition::config::cores::parse(l.trim()).unwrap()
            })
            .collect()
    }
}

impl Drop for ForeignCpuset {
    fn drop(&mut self) {
        for t in &mut self.tasks {
            let _ = t.kill();
            let _ = t.wait();
        }
        let mut dirs = vec![
            self.dir.join("child"),
            self.dir.join("leaf"),
            self.dir.clone(),
        ];
        if !self.v2 {
            dirs.remove(1);
        }
        for d in dirs {
            // An exiting task leaves its cgroup a moment after wait() returns.
            for _ in 0..100 {
                if !d.exists() || std::fs::remove_dir(&d).is_ok() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        // Busy while a reservation's partition is still there: then it stays on.
        if let Some(ctl) = &self.enabled {
            let _ = std::fs::write(ctl, "-cpuset");
        }
    }
}
