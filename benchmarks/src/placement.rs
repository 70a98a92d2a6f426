//! Where a VMM's threads run, the same for every VMM a section compares: each guest vCPU
//! thread on its own named core and every other thread of the VMM on the housekeeping core.
//!
//! How each VMM is placed so:
//! - ours: `--cores` pins each vCPU thread itself; the launcher is started on the
//!   housekeeping core;
//! - QEMU: started paused (`-S`, threads named with `-name ..,debug-threads=on`), on the
//!   housekeeping core; its vCPU threads (`CPU n/KVM`) are pinned over QMP's wait, then
//!   `cont` lets the guest run. The QMP round trips are inside its times;
//! - Cloud Hypervisor: `--cpus ..,affinity=[n@[core]]` pins its vCPU threads itself (its own
//!   option); the process is started on the housekeeping core;
//! - Firecracker: no option pins its vCPUs and it cannot start paused without its API, so
//!   its vCPU threads (`fc_vcpu n`) are pinned from outside as soon as each appears: the
//!   guest's first instructions may run on the housekeeping core.
//!
//! A process is started on the housekeeping core by spawning it from a thread placed there
//! ([`Placement::from_place`]), not under `taskset`: taskset's own exec and start would be
//! counted in the VMM's time and CPU (a task's schedstat keeps what it ran before exec).

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Each vCPU's core, and the core of everything else.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Placement {
    /// vCPU n runs on `vcpus[n]`.
    pub vcpus: Vec<usize>,
    /// The VMM's other threads.
    pub other: usize,
    /// A cgroup v1 `tasks` file the spawning thread joins ([`Placement::from_place`]),
    /// whose cpuset holds every core named here: while a reservation holds a core, every
    /// host process is kept in a cpuset without it ([`reservation_cpuset`]).
    pub join: Option<PathBuf>,
}

impl Placement {
    /// One vCPU on `vcpu`, the rest on `other`.
    pub fn one(vcpu: usize, other: usize) -> Self {
        Placement {
            vcpus: vec![vcpu],
            other,
            join: None,
        }
    }

    /// The same, its process joining `join` first ([`Placement::join`]).
    pub fn joining(self, join: Option<PathBuf>) -> Self {
        Placement { join, ..self }
    }

    /// As the results say it.
    pub fn describe(&self) -> String {
        let v: Vec<String> = self
            .vcpus
            .iter()
            .enumerate()
            .map(|(i, c)| format!("vCPU {i} on core {c}"))
            .collect();
        format!(
            "{}; the VMM's other threads on core {}",
            v.join(", "),
            self.other
        )
    }

    /// Runs `f` on a thread of its own that stands where a VMM's process is to start: in
    /// the cgroup `join` names and on the housekeeping core. What `f` spawns inherits both,
    /// so no step runs in the child before exec: with one, the standard library forks the
    /// whole harness instead of spawning with `posix_spawn` (CLONE_VM|CLONE_VFORK), which
    /// put 0.4 ms more into every launch's time to its first byte here.
    pub fn from_place<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T, String> {
        std::thread::scope(|s| {
            s.spawn(|| {
                if let Some(j) = &self.join {
                    // "0": the writing thread (cgroup v1 `tasks`).
                    std::fs::write(j, "0").map_err(|e| format!("joining {}: {e}", j.display()))?;
                }
                if !set_affinity(0, self.other) {
                    return Err(format!(
                        "placing the spawning thread on core {}: {}",
                        self.other,
                        std::io::Error::last_os_error()
                    ));
                }
                Ok(f())
            })
            .join()
            .unwrap_or_else(|_| Err("the spawning thread panicked".into()))
        })
    }

    /// Cloud Hypervisor's `affinity=` value: `[0@[c0],1@[c1]]`.
    pub fn cloud_hypervisor_affinity(&self) -> String {
        let v: Vec<String> = self
            .vcpus
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{i}@[{c}]"))
            .collect();
        format!("[{}]", v.join(","))
    }

    /// Adds what QEMU needs to be pinned so (`-S`, named threads, a QMP socket at `qmp`)
    /// and returns the pinning to run once it is spawned.
    pub fn qemu(&self, c: &mut Command, name: &str, qmp: &Path) -> Pin {
        let _ = std::fs::remove_file(qmp);
        c.args(["-name", &format!("{name},debug-threads=on"), "-S", "-qmp"])
            .arg(format!("unix:{},server=on,wait=off", qmp.display()));
        Pin::QemuPaused {
            qmp: qmp.to_path_buf(),
            placement: self.clone(),
        }
    }
}

/// Starts `c`'s process on `cores` (set in the child between fork and exec).
pub fn start_on(c: &mut Command, cores: &[usize]) {
    let set = cpu_set(cores);
    let apply = move || {
        // SAFETY: applies a valid set to the calling (child) process.
        let rc =
            unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    };
    // SAFETY: `apply` runs in the child between fork and exec; it makes one system call
    // (sched_setaffinity, async-signal-safe) on a set built before the fork and allocates
    // nothing.
    unsafe {
        c.pre_exec(apply);
    }
}

/// The cgroup file a process started beside a reservation (the ledger in `state`) joins so
/// that its threads may be placed on the reserved cores as well as on the housekeeping
/// ones: with cgroup v1, the cpuset hierarchy's root (every core), whose child cpusets the
/// reservation made. None without isolation; an error where no such cpuset exists (cgroup
/// v2's isolated partition takes its cores from every other cgroup).
pub fn reservation_cpuset(state: &Path) -> Result<Option<PathBuf>, String> {
    let ledger: serde_json::Value = std::fs::read_to_string(state.join("ledger.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .ok_or_else(|| format!("no ledger in {}", state.display()))?;
    let iso = &ledger["cores"]["isolation"];
    match iso["kind"].as_str() {
        Some("cgroup-v1") => {
            let guests = iso["guests"]
                .as_str()
                .ok_or("the ledger's cgroup-v1 isolation names no guests cpuset")?;
            let root = Path::new(guests)
                .parent()
                .ok_or("the guests cpuset has no parent")?;
            Ok(Some(root.join("tasks")))
        }
        Some("none") | None => Ok(None),
        Some(k) => Err(format!(
            "the reservation's isolation is {k}: no cpuset holds both the reserved and the \
             housekeeping cores, so a peer's vCPU cannot be put on the reserved core"
        )),
    }
}

fn cpu_set(cores: &[usize]) -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cores {
        // SAFETY: sets one bit of a valid set (CPU_SET bounds-checks the index).
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    set
}

fn set_affinity(tid: i32, core: usize) -> bool {
    let set = cpu_set(&[core]);
    // SAFETY: applies a valid set to a thread id; a stale id only fails.
    unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0 }
}

/// What must happen once a VMM is spawned for it to stand where its placement says.
#[derive(Clone, Debug)]
pub enum Pin {
    /// Nothing: it pins itself (ours, Cloud Hypervisor) or is not pinned.
    Nothing,
    /// QEMU started paused: pin its vCPU threads, then `cont` over QMP.
    QemuPaused {
        /// Its QMP socket.
        qmp: PathBuf,
        /// Where.
        placement: Placement,
    },
    /// Threads whose names start with `prefix` then the vCPU's index, pinned from outside
    /// as they appear (Firecracker: `fc_vcpu `).
    ByName {
        /// The name before the index.
        prefix: &'static str,
        /// Where.
        placement: Placement,
    },
}

impl Pin {
    /// Does it for process `pid`.
    pub fn apply(&self, pid: u32) -> Result<(), String> {
        match self {
            Pin::Nothing => Ok(()),
            Pin::QemuPaused { qmp, placement } => qemu_pin_and_start(pid, qmp, placement),
            Pin::ByName { prefix, placement } => by_name(pid, prefix, placement),
        }
    }
}

/// The vCPU index in a thread name `PREFIX<n>...`.
fn vcpu_index(comm: &str, prefix: &str) -> Option<usize> {
    let rest = comm.strip_prefix(prefix)?;
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

/// Pins each thread of `pid`: vCPU threads (by `index`) to their cores, the others to the
/// housekeeping core. How many vCPU threads it found.
fn pin_threads(
    pid: u32,
    index: impl Fn(&str) -> Option<usize>,
    p: &Placement,
) -> Result<usize, String> {
    let mut found = 0;
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).map_err(|e| e.to_string())?;
    for t in tasks.flatten() {
        let Ok(tid) = t.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        let core = match index(comm.trim()) {
            Some(i) if i < p.vcpus.len() => {
                found += 1;
                p.vcpus[i]
            }
            _ => p.other,
        };
        if !set_affinity(tid, core) {
            return Err(format!("pinning thread {tid} of {pid} to core {core}"));
        }
    }
    Ok(found)
}

/// Pins as soon as every vCPU thread named `prefix<n>` exists (within 10 s).
fn by_name(pid: u32, prefix: &str, p: &Placement) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if pin_threads(pid, |c| vcpu_index(c, prefix), p)? >= p.vcpus.len() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "not all {} vCPU threads (\"{prefix}0\"...) within 10 s",
                p.vcpus.len()
            ));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// QEMU was started paused (`-S`): pin its vCPU threads (`CPU n/KVM`) and every other
/// thread as `p` says, then let it run through QMP.
fn qemu_pin_and_start(pid: u32, qmp: &Path, p: &Placement) -> Result<(), String> {
    use std::os::unix::net::UnixStream;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut s = loop {
        match UnixStream::connect(qmp) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => return Err(format!("QMP socket {}: {e}", qmp.display())),
        }
    };
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    // Reads until a line answers the command (events such as RESUME may come first).
    let reply = |s: &mut UnixStream, what: &str, key: &str| -> Result<String, String> {
        let mut acc = Vec::new();
        let mut b = [0u8; 4096];
        loop {
            let text = String::from_utf8_lossy(&acc).into_owned();
            if let Some(l) = text
                .lines()
                .find(|l| l.contains(key) || l.contains("\"error\""))
                .filter(|_| text.ends_with('\n'))
            {
                return Ok(l.to_string());
            }
            // A signal meanwhile (a child of another harness thread ending) is not an end.
            let n = match s.read(&mut b) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                r => r.map_err(|e| format!("QMP {what}: {e}"))?,
            };
            if n == 0 {
                return Err(format!("QMP {what}: closed"));
            }
            acc.extend_from_slice(&b[..n]);
        }
    };
    reply(&mut s, "greeting", "\"QMP\"")?;
    s.write_all(b"{\"execute\":\"qmp_capabilities\"}\n")
        .map_err(|e| e.to_string())?;
    reply(&mut s, "capabilities", "\"return\"")?;
    // "CPU 0/KVM": the index after "CPU ".
    let found = pin_threads(pid, |c| vcpu_index(c, "CPU "), p)?;
    if found < p.vcpus.len() {
        return Err(format!(
            "{found} of {} QEMU vCPU threads (\"CPU 0/KVM\") found",
            p.vcpus.len()
        ));
    }
    s.write_all(b"{\"execute\":\"cont\"}\n")
        .map_err(|e| e.to_string())?;
    let r = reply(&mut s, "cont", "\"return\"")?;
    if !r.contains("\"return\"") {
        return Err(format!("QMP cont: {}", r.trim()));
    }
    Ok(())
}

/// [`Pin::QemuPaused`]'s one-vCPU form, as the sections that pin one QEMU vCPU call it.
pub fn pin_and_start_qemu(
    pid: u32,
    qmp: &Path,
    vcpu_core: usize,
    other_core: usize,
) -> Result<(), String> {
    qemu_pin_and_start(pid, qmp, &Placement::one(vcpu_core, other_core))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vcpu_threads_are_told_by_name() {
        assert_eq!(vcpu_index("CPU 1/KVM", "CPU "), Some(1));
        assert_eq!(vcpu_index("fc_vcpu 0", "fc_vcpu "), Some(0));
        assert_eq!(vcpu_index("fc_vmm", "fc_vcpu "), None);
        assert_eq!(vcpu_index("CPU x/KVM", "CPU "), None);
    }

    #[test]
    fn a_placement_is_said_and_given_to_cloud_hypervisor() {
        let p = Placement {
            vcpus: vec![0, 1],
            other: 0,
            join: None,
        };
        assert_eq!(
            p.describe(),
            "vCPU 0 on core 0, vCPU 1 on core 1; the VMM's other threads on core 0"
        );
        assert_eq!(p.cloud_hypervisor_affinity(), "[0@[0],1@[1]]");
    }

    #[test]
    fn what_is_spawned_from_a_placement_starts_on_its_housekeeping_core() {
        // Core 0 exists on every host; no cgroup to join.
        let p = Placement::one(0, 0);
        let out = p
            .from_place(|| {
                Command::new("grep")
                    .args(["Cpus_allowed_list", "/proc/self/status"])
                    .output()
            })
            .unwrap()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(text.split_whitespace().nth(1), Some("0"), "{text}");
        // The calling thread is not moved.
        let mine = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let before = mine
            .lines()
            .find(|l| l.starts_with("Cpus_allowed_list"))
            .unwrap()
            .to_string();
        let _ = p.from_place(|| ());
        let mine = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        assert!(mine.contains(&before));
        // A cgroup file that cannot be joined fails the placement, not the harness.
        let bad = Placement::one(0, 0).joining(Some("/nonexistent/tasks".into()));
        assert!(
            bad.from_place(|| ())
                .unwrap_err()
                .contains("/nonexistent/tasks")
        );
    }

    #[test]
    fn a_process_started_on_a_core_runs_there_without_taskset() {
        // Core 0 exists on every host.
        let mut c = Command::new("grep");
        c.args(["Cpus_allowed_list", "/proc/self/status"]);
        start_on(&mut c, &[0]);
        let out = c.output().unwrap();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(text.split_whitespace().nth(1), Some("0"), "{text}");
    }

    #[test]
    fn a_thread_named_for_a_vcpu_goes_to_its_core() {
        // A child whose one thread is named "sleep": as a vCPU thread named "sleep" + index
        // it is found and pinned; a name that is no vCPU's is pinned to the other core.
        let mut child = Command::new("sleep").arg("5").spawn().unwrap();
        let p = Placement::one(0, 0);
        let as_vcpu = pin_threads(child.id(), |c| (c == "sleep").then_some(0), &p);
        let as_other = pin_threads(child.id(), |_| None, &p);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(as_vcpu, Ok(1));
        assert_eq!(as_other, Ok(0));
    }
}
