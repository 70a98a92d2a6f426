//! Taking reserved cores out of general scheduling, and giving them back.
//!
//! - cgroup v2 with the cpuset controller: an `isolated` cpuset partition holding the
//!   reserved cores; the kernel removes them from every other cgroup's CPUs.
//! - cgroup v1 cpusets (what the development hosts have): a housekeeping cpuset with the
//!   other cores, into which every movable task of the root cpuset is moved, and an
//!   exclusive guests cpuset with the reserved cores, which vCPU threads join.
//! - movable IRQs are pointed at the housekeeping cores (old affinities recorded).
//!
//! Where the host allows none of it, the reservation says so and still stands: the
//! ledger keeps partitions off each other's cores either way. What the kernel command line
//! would add (isolcpus, nohz_full, rcu_nocbs, boot-time hugepages) is printed by reserve.

use std::path::{Path, PathBuf};

use crate::config::cores;
use crate::host::ledger::{IrqRecord, Isolation};

/// Errors undoing isolation.
#[derive(Debug, thiserror::Error)]
pub enum IsolationError {
    /// A cgroup file operation failed.
    #[error("{path}: {what}: {source}")]
    Io {
        /// File or directory.
        path: PathBuf,
        /// Operation.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
}

fn io<'a>(
    path: &'a Path,
    what: &'static str,
) -> impl FnOnce(std::io::Error) -> IsolationError + 'a {
    move |source| IsolationError::Io {
        path: path.to_path_buf(),
        what,
        source,
    }
}

fn write(path: &Path, v: &str) -> Result<(), IsolationError> {
    std::fs::write(path, v).map_err(io(path, "write"))
}

/// Mount points of cgroup hierarchies, from /proc/mounts text: (v2 mount, v1 cpuset mount).
pub fn cgroup_mounts(mounts: &str) -> (Option<PathBuf>, Option<PathBuf>) {
    let mut v2 = None;
    let mut v1 = None;
    for l in mounts.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 4 {
            continue;
        }
        match f[2] {
            "cgroup2" => v2 = v2.or(Some(PathBuf::from(f[1]))),
            "cgroup" if f[3].split(',').any(|o| o == "cpuset") => {
                v1 = v1.or(Some(PathBuf::from(f[1])))
            }
            _ => {}
        }
    }
    (v2, v1)
}

/// Isolates `reserved`, leaving `housekeeping` to the host. `tag` names our cgroups (one
/// per state directory). Never fails: what could not be done is recorded as the reason in
/// [`Isolation::None`].
pub fn isolate(reserved: &[usize], housekeeping: &[usize], tag: &str) -> Isolation {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let (v2, v1) = cgroup_mounts(&mounts);
    let mut reasons = Vec::new();
    if let Some(root) = v2 {
        let controllers =
            std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
        if controllers.split_whitespace().any(|c| c == "cpuset") {
            match isolate_v2(&root, reserved, tag) {
                Ok(i) => return i,
                Err(e) => reasons.push(format!("cgroup v2: {e}")),
            }
        } else {
            reasons.push(format!(
                "cgroup v2 at {} has no cpuset controller",
                root.display()
            ));
        }
    }
    if let Some(root) = v1 {
        match isolate_v1(&root, reserved, housekeeping, tag) {
            Ok(i) => return i,
            Err(e) => reasons.push(format!("cgroup v1: {e}")),
        }
    } else {
        reasons.push("no cgroup v1 cpuset hierarchy is mounted".into());
    }
    Isolation::None {
        reason: reasons.join("; "),
    }
}

fn isolate_v2(root: &Path, reserved: &[usize], tag: &str) -> Result<Isolation, IsolationError> {
    write(&root.join("cgroup.subtree_control"), "+cpuset")?;
    let dir = root.join(format!("{tag}-guests"));
    if !dir.exists() {
        std::fs::create_dir(&dir).map_err(io(&dir, "mkdir"))?;
    }
    let list = cores::format(reserved);
    let undo = |e| {
        let _ = std::fs::remove_dir(&dir);
        e
    };
    let excl = dir.join("cpuset.cpus.exclusive");
    if excl.exists() {
        write(&excl, &list).map_err(undo)?;
    }
    write(&dir.join("cpuset.cpus"), &list).map_err(undo)?;
    write(&dir.join("cpuset.cpus.partition"), "isolated").map_err(undo)?;
    let state = std::fs::read_to_string(dir.join("cpuset.cpus.partition")).unwrap_or_default();
    if !state.trim().starts_with("isolated") {
        let _ = std::fs::remove_dir(&dir);
        return Err(IsolationError::Io {
            path: dir.join("cpuset.cpus.partition"),
            what: "kernel refused the isolated partition",
            source: std::io::Error::other(state.trim().to_string()),
        });
    }
    Ok(Isolation::CgroupV2 { path: dir })
}

/// Moves every task listed in `from/tasks` to `to/tasks`; returns (moved, unmovable).
fn move_tasks(from: &Path, to: &Path) -> (usize, usize) {
    let mut moved = 0;
    let mut unmovable = 0;
    // A second pass catches tasks forked during the first; what is left after it is
    // what the kernel will not move (per-CPU kernel threads).
    for _ in 0..2 {
        unmovable = 0;
        let mut now = 0;
        let tasks = std::fs::read_to_string(from.join("tasks")).unwrap_or_default();
        for tid in tasks.lines() {
            match std::fs::write(to.join("tasks"), tid) {
                Ok(()) => now += 1,
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(_) => unmovable += 1,
            }
        }
        moved += now;
        if now == 0 {
            break;
        }
    }
    (moved, unmovable)
}

fn remove_v1_cpuset(root: &Path, dir: &Path) -> Result<(), IsolationError> {
    if !dir.exists() {
        return Ok(());
    }
    move_tasks(dir, root);
    std::fs::remove_dir(dir).map_err(io(dir, "rmdir"))
}

fn isolate_v1(
    root: &Path,
    reserved: &[usize],
    housekeeping: &[usize],
    tag: &str,
) -> Result<Isolation, IsolationError> {
    let hk = root.join(format!("{tag}-housekeeping"));
    let guests = root.join(format!("{tag}-guests"));
    // Leftovers of this state directory's reservation that crashed half-way: give their
    // tasks back first.
    remove_v1_cpuset(root, &guests)?;
    remove_v1_cpuset(root, &hk)?;
    let mems =
        std::fs::read_to_string(root.join("cpuset.mems")).map_err(io(root, "read cpuset.mems"))?;
    let setup = || -> Result<(), IsolationError> {
        std::fs::create_dir(&hk).map_err(io(&hk, "mkdir"))?;
        write(&hk.join("cpuset.cpus"), &cores::format(housekeeping))?;
        write(&hk.join("cpuset.mems"), mems.trim())?;
        std::fs::create_dir(&guests).map_err(io(&guests, "mkdir"))?;
        write(&guests.join("cpuset.cpus"), &cores::format(reserved))?;
        write(&guests.join("cpuset.mems"), mems.trim())?;
        write(&guests.join("cpuset.cpu_exclusive"), "1")?;
        Ok(())
    };
    if let Err(e) = setup() {
        let _ = remove_v1_cpuset(root, &guests);
        let _ = remove_v1_cpuset(root, &hk);
        return Err(e);
    }
    let (moved, unmovable) = move_tasks(root, &hk);
    Ok(Isolation::CgroupV1 {
        root: root.to_path_buf(),
        housekeeping: hk,
        guests,
        moved,
        unmovable,
    })
}

/// Undoes [`isolate`].
pub fn restore(iso: &Isolation) -> Result<(), IsolationError> {
    match iso {
        Isolation::None { .. } => Ok(()),
        Isolation::CgroupV1 {
            root,
            housekeeping,
            guests,
            ..
        } => {
            let a = remove_v1_cpuset(root, guests);
            let b = remove_v1_cpuset(root, housekeeping);
            a.and(b)
        }
        Isolation::CgroupV2 { path } => {
            if !path.exists() {
                return Ok(());
            }
            let parent = path.parent().unwrap_or(Path::new("/"));
            let procs = std::fs::read_to_string(path.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines() {
                let _ = std::fs::write(parent.join("cgroup.procs"), pid);
            }
            let _ = write(&path.join("cpuset.cpus.partition"), "member");
            std::fs::remove_dir(path).map_err(io(path, "rmdir"))
        }
    }
}

/// The reserved cores' cpuset, opened by the launcher while it is root so that vCPU threads
/// started after it gave up root can still join it: the kernel checks a cgroup file's
/// writer against the credentials it was opened with.
#[derive(Debug)]
pub struct GuestsCpuset {
    tasks: std::fs::File,
    path: PathBuf,
}

impl GuestsCpuset {
    /// For cgroup v1, the guests cpuset's `tasks` file, to be joined thread by thread
    /// ([`GuestsCpuset::join`]). For cgroup v2 the whole launcher joins the isolated
    /// partition here and now (`None`); without isolation there is nothing to join.
    pub fn open(iso: &Isolation) -> Result<Option<Self>, IsolationError> {
        match iso {
            Isolation::None { .. } => Ok(None),
            Isolation::CgroupV1 { guests, .. } => {
                let path = guests.join("tasks");
                let tasks = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map_err(io(&path, "open"))?;
                Ok(Some(Self { tasks, path }))
            }
            Isolation::CgroupV2 { path } => {
                write(&path.join("cgroup.procs"), &std::process::id().to_string())?;
                Ok(None)
            }
        }
    }

    /// Moves the calling thread into the cpuset. Call from each vCPU thread before it pins
    /// itself.
    pub fn join(&self) -> Result<(), IsolationError> {
        use std::io::Write;
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        (&self.tasks)
            .write_all(tid.to_string().as_bytes())
            .map_err(io(&self.path, "write"))
    }
}

/// Hex mask in the /proc/irq format ("3", "ff,ffffffff").
pub fn cpu_mask(cores: &[usize]) -> String {
    let words = cores.iter().map(|c| c / 32 + 1).max().unwrap_or(1);
    let mut w = vec![0u32; words];
    for &c in cores {
        w[c / 32] |= 1 << (c % 32);
    }
    let mut parts: Vec<String> = w.iter().rev().map(|x| format!("{x:08x}")).collect();
    let first = parts[0].trim_start_matches('0');
    parts[0] = if first.is_empty() {
        "0".into()
    } else {
        first.into()
    };
    parts.join(",")
}

/// Points every movable IRQ that may fire on a reserved core at the housekeeping cores.
/// Returns the records to restore and how many IRQs refused.
pub fn move_irqs(reserved: &[usize], housekeeping: &[usize]) -> (Vec<IrqRecord>, usize) {
    let mut records = Vec::new();
    let mut refused = 0;
    let hk = cores::format(housekeeping);
    let entries = std::fs::read_dir("/proc/irq")
        .into_iter()
        .flatten()
        .flatten();
    for e in entries {
        let file = e.path().join("smp_affinity_list");
        let Ok(old) = std::fs::read_to_string(&file) else {
            continue;
        };
        let old = old.trim().to_string();
        let Ok(cur) = cores::parse(&old) else {
            continue;
        };
        if !cur.iter().any(|c| reserved.contains(c)) {
            continue;
        }
        match std::fs::write(&file, &hk) {
            Ok(()) => records.push(IrqRecord { file, old }),
            Err(_) => refused += 1,
        }
    }
    let dflt = PathBuf::from("/proc/irq/default_smp_affinity");
    if let Ok(old) = std::fs::read_to_string(&dflt) {
        if std::fs::write(&dflt, cpu_mask(housekeeping)).is_ok() {
            records.push(IrqRecord {
                file: dflt,
                old: old.trim().to_string(),
            });
        }
    }
    (records, refused)
}

/// Writes back recorded IRQ affinities (IRQs that went away are skipped).
pub fn restore_irqs(records: &[IrqRecord]) -> usize {
    records
        .iter()
        .filter(|r| r.file.exists() && std::fs::write(&r.file, &r.old).is_err())
        .count()
}

/// Kernel command-line parameters that would isolate `reserved` fully and reserve the pool
/// at boot, for those the running kernel's `cmdline` lacks.
pub fn cmdline_advice(
    cmdline: &str,
    reserved: &[usize],
    page_size: u64,
    pages: u64,
) -> Option<String> {
    let has = |k: &str| cmdline.split_whitespace().any(|w| w.starts_with(k));
    let list = cores::format(reserved);
    let mut add = Vec::new();
    if !has("isolcpus=") {
        add.push(format!("isolcpus=managed_irq,domain,{list}"));
    }
    if !has("nohz_full=") {
        add.push(format!("nohz_full={list}"));
    }
    if !has("rcu_nocbs=") {
        add.push(format!("rcu_nocbs={list}"));
    }
    if !has("hugepages=") {
        let sz = if page_size >= 1 << 30 { "1G" } else { "2M" };
        add.push(format!("hugepagesz={sz} hugepages={pages}"));
    }
    (!add.is_empty()).then(|| add.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_cgroup_mounts() {
        let m = "\
tmpfs /sys/fs/cgroup tmpfs rw 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/cpuset cgroup rw,relatime,cpuset 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
";
        assert_eq!(
            cgroup_mounts(m),
            (
                Some("/sys/fs/cgroup/unified".into()),
                Some("/sys/fs/cgroup/cpuset".into())
            )
        );
        assert_eq!(cgroup_mounts(""), (None, None));
    }

    #[test]
    fn masks() {
        assert_eq!(cpu_mask(&[0]), "1");
        assert_eq!(cpu_mask(&[0, 1]), "3");
        assert_eq!(cpu_mask(&[4]), "10");
        assert_eq!(cpu_mask(&[32]), "1,00000000");
        assert_eq!(cpu_mask(&[]), "0");
    }

    #[test]
    fn advice_lists_only_what_is_missing() {
        let a = cmdline_advice("quiet", &[2, 3], 2 << 20, 512).unwrap();
        assert_eq!(
            a,
            "isolcpus=managed_irq,domain,2-3 nohz_full=2-3 rcu_nocbs=2-3 hugepagesz=2M hugepages=512"
        );
        let b = cmdline_advice("isolcpus=2-3 nohz_full=2-3 quiet", &[2, 3], 1 << 30, 4).unwrap();
        assert_eq!(b, "rcu_nocbs=2-3 hugepagesz=1G hugepages=4");
        assert_eq!(
            cmdline_advice(
                "isolcpus=1 nohz_full=1 rcu_nocbs=1 hugepages=8",
                &[1],
                2 << 20,
                8
            ),
            None
        );
    }
}
