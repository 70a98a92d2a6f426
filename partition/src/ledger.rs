//! The ledger: one JSON file in the state directory recording what `reserve` took from the
//! host and which partition owns what. Changed only under an exclusive `flock` on a lock
//! file, by writing a temporary file, fsyncing it, renaming it over the ledger and fsyncing
//! the directory: a crash leaves either the old ledger or the new one, never a mix.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Default state directory.
pub const DEFAULT_STATE_DIR: &str = "/run/partition";
/// Ledger format version.
pub const VERSION: u32 = 1;
const LEDGER: &str = "ledger.json";
const LOCK: &str = "ledger.lock";

/// Errors reading or writing the ledger.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// A file operation failed.
    #[error("{path}: {what}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operation.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// The ledger does not parse.
    #[error("{path} is not a ledger this version understands: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// What was reserved, as asked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanRecord {
    /// Pool bytes.
    pub memory: u64,
    /// Hugepage size.
    pub page_size: u64,
    /// NUMA node, or system-wide.
    pub node: Option<u32>,
    /// Reserved cores.
    pub cores: Vec<usize>,
}

/// The pool as built.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolRecord {
    /// The hugetlbfs file.
    pub file: PathBuf,
    /// Bytes.
    pub size: u64,
    /// Page size.
    pub page_size: u64,
    /// sysfs directory of the hugepage counter we grew.
    pub hugepage_dir: PathBuf,
    /// Pages we added to it.
    pub hugepages_added: u64,
    /// hugetlbfs mount holding the file.
    pub mount: PathBuf,
    /// Whether we mounted it (and must unmount it).
    pub mounted_by_us: bool,
}

/// How the reserved cores were taken out of general scheduling.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, tag = "kind", rename_all = "kebab-case")]
pub enum Isolation {
    /// Not at all; the reason says why.
    None {
        /// Why not.
        reason: String,
    },
    /// cgroup v1 cpusets: every movable task of the root cpuset moved to a housekeeping
    /// cpuset; vCPU threads go to an exclusive guests cpuset.
    CgroupV1 {
        /// Root of the cpuset hierarchy.
        root: PathBuf,
        /// Housekeeping cpuset.
        housekeeping: PathBuf,
        /// Guests cpuset (exclusive).
        guests: PathBuf,
        /// Tasks moved to housekeeping.
        moved: usize,
        /// Tasks that could not be moved (per-CPU kernel threads).
        unmovable: usize,
    },
    /// cgroup v2: an "isolated" cpuset partition; the launcher process joins it.
    CgroupV2 {
        /// The partition cgroup.
        path: PathBuf,
    },
}

/// An IRQ whose affinity reserve changed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IrqRecord {
    /// The /proc/irq file we wrote (smp_affinity_list or default_smp_affinity).
    pub file: PathBuf,
    /// What it held before.
    pub old: String,
}

/// The reserved cores.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoreRecord {
    /// Cores for partitions.
    pub reserved: Vec<usize>,
    /// Cores left to the host.
    pub housekeeping: Vec<usize>,
    /// How they are isolated.
    pub isolation: Isolation,
}

/// A partition's lifecycle state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PartitionState {
    /// Recorded; KVM not yet set up.
    Launching,
    /// vCPUs running.
    Running,
    /// Guest stopped; memory being scrubbed.
    Stopping,
    /// `release` is reclaiming it.
    Releasing,
}

/// A byte range of the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtentRecord {
    /// Start.
    pub offset: u64,
    /// Length.
    pub len: u64,
}

impl From<pool::Extent> for ExtentRecord {
    fn from(e: pool::Extent) -> Self {
        Self {
            offset: e.offset,
            len: e.len,
        }
    }
}

impl From<ExtentRecord> for pool::Extent {
    fn from(e: ExtentRecord) -> Self {
        Self {
            offset: e.offset,
            len: e.len,
        }
    }
}

/// One partition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionRecord {
    /// Name.
    pub name: String,
    /// Launcher pid.
    pub pid: u32,
    /// The launcher's start time (clock ticks since boot, /proc/PID/stat field 22), so a
    /// recycled pid is not mistaken for it.
    pub pid_start: u64,
    /// Cores, vCPU order.
    pub cores: Vec<usize>,
    /// Memory.
    pub extent: ExtentRecord,
    /// Idle policy.
    pub idle: String,
    /// State.
    pub state: PartitionState,
    /// Unix time of the launch.
    pub started_at: u64,
    /// Kernel name.
    pub kernel: String,
}

/// The whole ledger.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ledger {
    /// Format version.
    pub version: u32,
    /// Unix time of the reservation.
    pub reserved_at: u64,
    /// The plan.
    pub plan: PlanRecord,
    /// The pool.
    pub pool: PoolRecord,
    /// The cores.
    pub cores: CoreRecord,
    /// IRQ affinities to restore.
    pub irqs: Vec<IrqRecord>,
    /// Partitions.
    pub partitions: Vec<PartitionRecord>,
}

impl Ledger {
    /// Free-space view of the pool: everything not owned by a partition.
    pub fn allocator(&self) -> Result<pool::ExtentAllocator, pool::ExtentError> {
        let mut a = pool::ExtentAllocator::new(self.pool.size, self.pool.page_size)?;
        for p in &self.partitions {
            a.alloc_at(p.extent.into())?;
        }
        Ok(a)
    }

    /// Whether the ledger is one this VMM could have written: a pool whose size is a
    /// multiple of a power-of-two page size of at least 4 KiB (the plan's), partitions with
    /// distinct names on reserved cores, each core in one partition, extents inside the
    /// pool, page aligned and disjoint. A ledger that fails is refused before anything
    /// acts on it (a forged one must not make `release` divide by zero or scrub outside
    /// the pool).
    pub fn check(&self) -> Result<(), String> {
        let page = self.pool.page_size;
        if page < 4096 || !page.is_power_of_two() {
            return Err(format!(
                "pool page size {page} is not a power of two of at least 4096"
            ));
        }
        if self.plan.page_size != page {
            return Err(format!(
                "the plan's page size {} is not the pool's {page}",
                self.plan.page_size
            ));
        }
        self.allocator().map_err(|e| {
            format!(
                "pool of {} bytes and its partitions' extents: {e}",
                self.pool.size
            )
        })?;
        let mut names = std::collections::HashSet::new();
        let mut cores = std::collections::HashSet::new();
        for p in &self.partitions {
            if !names.insert(p.name.as_str()) {
                return Err(format!("partition {:?} is recorded twice", p.name));
            }
            for c in &p.cores {
                if !self.cores.reserved.contains(c) {
                    return Err(format!(
                        "partition {:?} has core {c}, which is not reserved",
                        p.name
                    ));
                }
                if !cores.insert(*c) {
                    return Err(format!("core {c} is in two partitions"));
                }
            }
        }
        Ok(())
    }

    /// Cores assigned to partitions.
    pub fn assigned_cores(&self) -> Vec<usize> {
        self.partitions
            .iter()
            .flat_map(|p| p.cores.iter().copied())
            .collect()
    }

    /// The partition called `name`.
    pub fn partition(&self, name: &str) -> Option<&PartitionRecord> {
        self.partitions.iter().find(|p| p.name == name)
    }
}

/// An exclusive (or shared) lock on a state directory's ledger.
pub struct LedgerLock {
    dir: PathBuf,
    _lock: File,
}

fn io<'a>(path: &'a Path, what: &'static str) -> impl FnOnce(std::io::Error) -> LedgerError + 'a {
    move |source| LedgerError::Io {
        path: path.to_path_buf(),
        what,
        source,
    }
}

impl LedgerLock {
    /// Locks `dir`'s ledger, creating the directory if needed. Blocks until the lock is ours.
    pub fn exclusive(dir: &Path) -> Result<Self, LedgerError> {
        Self::lock(dir, libc::LOCK_EX)
    }

    /// A shared lock, for readers.
    pub fn shared(dir: &Path) -> Result<Self, LedgerError> {
        Self::lock(dir, libc::LOCK_SH)
    }

    fn lock(dir: &Path, how: i32) -> Result<Self, LedgerError> {
        std::fs::create_dir_all(dir).map_err(io(dir, "create state directory"))?;
        let p = dir.join(LOCK);
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&p)
            .map_err(io(&p, "open lock"))?;
        loop {
            // SAFETY: flock on our own fd.
            if unsafe { libc::flock(f.as_raw_fd(), how) } == 0 {
                break;
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(io(&p, "flock")(e));
            }
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            _lock: f,
        })
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The ledger file's path.
    pub fn path(&self) -> PathBuf {
        self.dir.join(LEDGER)
    }

    /// Reads the ledger, if there is one.
    pub fn load(&self) -> Result<Option<Ledger>, LedgerError> {
        let p = self.path();
        let text = match std::fs::read_to_string(&p) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(&p, "read")(e)),
        };
        let l: Ledger = serde_json::from_str(&text).map_err(|e| LedgerError::Corrupt {
            path: p.clone(),
            reason: e.to_string(),
        })?;
        if l.version != VERSION {
            return Err(LedgerError::Corrupt {
                path: p,
                reason: format!("version {} (this build writes {VERSION})", l.version),
            });
        }
        l.check()
            .map_err(|reason| LedgerError::Corrupt { path: p, reason })?;
        Ok(Some(l))
    }

    /// Replaces the ledger atomically.
    pub fn store(&self, l: &Ledger) -> Result<(), LedgerError> {
        let p = self.path();
        let tmp = self.dir.join(format!("{LEDGER}.tmp"));
        let text = serde_json::to_string_pretty(l).map_err(|e| LedgerError::Corrupt {
            path: p.clone(),
            reason: e.to_string(),
        })?;
        {
            let mut f = File::create(&tmp).map_err(io(&tmp, "create"))?;
            f.write_all(text.as_bytes()).map_err(io(&tmp, "write"))?;
            f.write_all(b"\n").map_err(io(&tmp, "write"))?;
            f.sync_all().map_err(io(&tmp, "fsync"))?;
        }
        std::fs::rename(&tmp, &p).map_err(io(&p, "rename"))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io(&self.dir, "fsync directory"))?;
        Ok(())
    }

    /// Removes the ledger.
    pub fn remove(&self) -> Result<(), LedgerError> {
        let p = self.path();
        match std::fs::remove_file(&p) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io(&p, "remove")(e)),
        }
    }
}

/// The fields of /proc/PID/stat this project reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// State letter (field 3): R, S, D, Z, ...
    pub state: char,
    /// Parent pid (field 4).
    pub ppid: u32,
    /// Start time in clock ticks after boot (field 22): with the pid, names a process.
    pub start_time: u64,
}

/// Reads /proc/PID/stat; None if there is no such process.
pub fn proc_stat(pid: u32) -> Option<ProcStat> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses: fields start after the last ')'.
    let f: Vec<&str> = s.get(s.rfind(')')? + 1..)?.split_whitespace().collect();
    // f[0] is field 3 (state), f[1] field 4 (ppid), f[19] field 22 (start time).
    Some(ProcStat {
        state: f.first()?.chars().next()?,
        ppid: f.get(1)?.parse().ok()?,
        start_time: f.get(19)?.parse().ok()?,
    })
}

/// Start time of `pid` (field 22 of /proc/PID/stat), if it is running (not a zombie).
pub fn pid_start_time(pid: u32) -> Option<u64> {
    proc_stat(pid)
        .filter(|st| st.state != 'Z')
        .map(|st| st.start_time)
}

/// Whether the partition's launcher is still the process running under its pid.
pub fn alive(p: &PartitionRecord) -> bool {
    pid_start_time(p.pid) == Some(p.pid_start)
}

/// Seconds since the Unix epoch.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample() -> Ledger {
        Ledger {
            version: VERSION,
            reserved_at: 1,
            plan: PlanRecord {
                memory: 64 << 20,
                page_size: 2 << 20,
                node: None,
                cores: vec![1],
            },
            pool: PoolRecord {
                file: "/x/pool".into(),
                size: 64 << 20,
                page_size: 2 << 20,
                hugepage_dir: "/sys/kernel/mm/hugepages/hugepages-2048kB".into(),
                hugepages_added: 32,
                mount: "/x".into(),
                mounted_by_us: true,
            },
            cores: CoreRecord {
                reserved: vec![1],
                housekeeping: vec![0],
                isolation: Isolation::None {
                    reason: "test".into(),
                },
            },
            irqs: vec![],
            partitions: vec![PartitionRecord {
                name: "a".into(),
                pid: 1,
                pid_start: 0,
                cores: vec![1],
                extent: ExtentRecord {
                    offset: 4 << 20,
                    len: 8 << 20,
                },
                idle: "default".into(),
                state: PartitionState::Running,
                started_at: 0,
                kernel: "probe".into(),
            }],
        }
    }

    #[test]
    fn a_ledger_no_reserve_could_write_is_refused() {
        assert_eq!(sample().check(), Ok(()));
        type Forge = Box<dyn Fn(&mut Ledger)>;
        let bad: Vec<(&str, Forge)> = vec![
            (
                "page size 0",
                Box::new(|l| {
                    l.pool.page_size = 0;
                    l.plan.page_size = 0;
                }),
            ),
            ("page size 3000", Box::new(|l| l.pool.page_size = 3000)),
            (
                "plan and pool disagree",
                Box::new(|l| l.plan.page_size = 4096),
            ),
            (
                "extent past the pool",
                Box::new(|l| l.partitions[0].extent.offset = 60 << 20),
            ),
            (
                "extent not page aligned",
                Box::new(|l| l.partitions[0].extent.offset = 4096),
            ),
            ("empty extent", Box::new(|l| l.partitions[0].extent.len = 0)),
            ("pool not whole pages", Box::new(|l| l.pool.size += 4096)),
            (
                "unreserved core",
                Box::new(|l| l.partitions[0].cores = vec![0]),
            ),
            (
                "overlapping extents",
                Box::new(|l| {
                    let mut b = l.partitions[0].clone();
                    b.name = "b".into();
                    b.cores = vec![];
                    b.extent.offset += 2 << 20;
                    l.partitions.push(b);
                }),
            ),
            (
                "one name twice",
                Box::new(|l| {
                    let mut b = l.partitions[0].clone();
                    b.cores = vec![];
                    b.extent.offset = 32 << 20;
                    l.partitions.push(b);
                }),
            ),
        ];
        let dir = std::env::temp_dir().join(format!("ledger-forged-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let lock = LedgerLock::exclusive(&dir).unwrap();
        for (what, f) in bad {
            let mut l = sample();
            f(&mut l);
            assert!(l.check().is_err(), "{what}: accepted");
            // Written by someone else, it is refused on load with the reason.
            std::fs::write(lock.path(), serde_json::to_string(&l).unwrap()).unwrap();
            match lock.load() {
                Err(LedgerError::Corrupt { reason, .. }) => assert!(!reason.is_empty(), "{what}"),
                other => panic!("{what}: loaded as {other:?}"),
            }
        }
        lock.remove().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn round_trip_and_atomic_replace() {
        let dir = std::env::temp_dir().join(format!("ledger-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let lock = LedgerLock::exclusive(&dir).unwrap();
        assert_eq!(lock.load().unwrap(), None);
        let l = sample();
        lock.store(&l).unwrap();
        assert_eq!(lock.load().unwrap(), Some(l.clone()));
        assert!(!dir.join("ledger.json.tmp").exists());
        let free = l.allocator().unwrap();
        assert_eq!(free.free_bytes(), (64 - 8) << 20);
        assert_eq!(l.assigned_cores(), vec![1]);
        lock.remove().unwrap();
        assert_eq!(lock.load().unwrap(), None);
        drop(lock);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unknown_fields_and_versions_are_refused() {
        let dir = std::env::temp_dir().join(format!("ledger-bad-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let lock = LedgerLock::exclusive(&dir).unwrap();
        let mut v = serde_json::to_value(sample()).unwrap();
        v["pool"]["hugepages_addded"] = 1.into();
        std::fs::write(lock.path(), v.to_string()).unwrap();
        assert!(matches!(lock.load(), Err(LedgerError::Corrupt { .. })));
        let mut v = serde_json::to_value(sample()).unwrap();
        v["version"] = 99.into();
        std::fs::write(lock.path(), v.to_string()).unwrap();
        assert!(matches!(lock.load(), Err(LedgerError::Corrupt { .. })));
        std::fs::write(lock.path(), "{").unwrap();
        assert!(matches!(lock.load(), Err(LedgerError::Corrupt { .. })));
        drop(lock);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn pid_identity() {
        let me = std::process::id();
        let t = pid_start_time(me).unwrap();
        let mut p = sample().partitions[0].clone();
        p.pid = me;
        p.pid_start = t;
        assert!(alive(&p));
        p.pid_start = t + 1;
        assert!(!alive(&p));
        assert_eq!(pid_start_time(u32::MAX), None);
    }

    #[test]
    fn overlapping_records_are_detected() {
        let mut l = sample();
        let mut q = l.partitions[0].clone();
        q.name = "b".into();
        q.extent.offset = 10 << 20;
        l.partitions.push(q);
        assert!(l.allocator().is_err());
    }
}
