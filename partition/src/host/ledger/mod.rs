//! The ledger: one JSON file in the state directory recording what `reserve` took from the
//! host and which partition owns what. Changed only under an exclusive `flock` on a lock
//! file, by writing a temporary file and renaming it over the ledger: a writer that dies
//! leaves either the old ledger or the new one, never a mix. Not fsynced: nothing it
//! records outlives the host's boot (`StateDir::replace`).

use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::sys::statedir::StateDirError;

mod launcher;
mod lock;
pub use launcher::{ProcStat, now, pid_start_time, proc_stat, signal_launcher};
pub use lock::{LedgerLock, PartitionLock};

/// Default state directory.
pub const DEFAULT_STATE_DIR: &str = "/run/partition";
/// Ledger format version.
pub const VERSION: u32 = 1;
const LEDGER: &str = "ledger.json";
const LOCK: &str = "ledger.lock";
/// Others' cpusets a reserve is narrowing, written before the first is narrowed and
/// removed once the ledger records them: a reserve killed between the two leaves this for
/// the next reserve or unreserve to widen them back.
const NARROWING: &str = "narrowing.json";
/// What a reserve has taken so far ([`Unfinished`]), written before each step takes it and
/// removed once the ledger records it all or the reserve has given it back: a reserve
/// killed part-way leaves this for the next reserve or unreserve to give back.
const UNFINISHED: &str = "unfinished.json";
/// Directory of the partitions' liveness locks.
const LOCKS: &str = "locks";
/// Largest ledger read (a forged one cannot make us read without end).
const MAX_LEDGER: u64 = 4 << 20;
/// The page sizes a reservation can have.
pub const PAGE_SIZES: [u64; 2] = [2 << 20, 1 << 30];

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
    /// The state directory or a file in it cannot be trusted (or used).
    #[error("{0}")]
    StateDir(#[from] StateDirError),
}

impl LedgerError {
    /// Whether the state directory the user named is at fault (the CLI exits with status
    /// 2): one root must not trust, or a ledger no `partition reserve` wrote.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            Self::Corrupt { .. } | Self::StateDir(StateDirError::Untrusted { .. })
        )
    }
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
    /// Whether they were to be taken out of every cgroup.
    #[serde(default)]
    pub isolation: IsolationMode,
    /// What to do about a running irqbalance.
    #[serde(default)]
    pub irqbalance: IrqbalanceMode,
}

/// What a reservation does about a running irqbalance (host::irqbalance).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IrqbalanceMode {
    /// Ban the reserved cores through its control socket (given back at unreserve); where
    /// that cannot be done the reserve is refused.
    #[default]
    Ban,
    /// Leave it alone: it may move IRQs back onto the reserved cores (`status` shows them).
    Ignore,
}

impl IrqbalanceMode {
    /// Parses `ban` or `ignore`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "ban" => Some(Self::Ban),
            "ignore" => Some(Self::Ignore),
            _ => None,
        }
    }
}

/// The ban a reservation gave a running irqbalance, and what it banned before.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IrqbalanceRecord {
    /// The daemon's pid.
    pub pid: u32,
    /// Its start time (a restarted daemon forgot the ban, and is not given an old list).
    pub pid_start: u64,
    /// The CPUs it banned before the reservation (given back at unreserve).
    pub banned_before: Vec<usize>,
    /// The CPUs the reservation made it ban.
    pub banned: Vec<usize>,
}

/// Whether a reservation must take its cores out of every cgroup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IsolationMode {
    /// The reserved cores are taken out of every cpuset cgroup of the host (cgroup v1: every
    /// other cpuset narrowed; v2: an isolated partition); where that cannot be done the
    /// reserve is refused, naming the cgroup in the way.
    #[default]
    Cpusets,
    /// No isolation: the reserved cores stay shared with every cgroup (the ledger still
    /// keeps partitions off each other's cores).
    None,
}

impl IsolationMode {
    /// Parses `cpusets` or `none`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "cpusets" => Some(Self::Cpusets),
            "none" => Some(Self::None),
            _ => None,
        }
    }
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
        /// Other cpusets (Docker's, podman's, libvirt's, a kubelet's, ...) whose CPUs
        /// spanned the reserved cores, narrowed to the others, deepest first; widened back,
        /// shallowest first, when the reservation ends.
        #[serde(default)]
        narrowed: Vec<NarrowedCpuset>,
    },
    /// cgroup v2: an "isolated" cpuset partition; the launcher process joins it.
    CgroupV2 {
        /// The partition cgroup.
        path: PathBuf,
        /// Its siblings whose `cpuset.cpus` spanned the reserved cores (the kernel takes
        /// no cores from them for a partition), narrowed as for v1.
        #[serde(default)]
        narrowed: Vec<NarrowedCpuset>,
    },
}

/// A cpuset of someone else's whose CPUs a reservation narrowed, and what they were.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NarrowedCpuset {
    /// The cpuset's directory.
    pub path: PathBuf,
    /// Its `cpuset.cpus` before.
    pub cpus: String,
    /// What the reservation wrote (`cpus` less the reserved cores): it is widened back
    /// only if it still reads this, so a change its owner made since is kept.
    pub narrowed_to: String,
}

/// Another's cpuset a reservation narrowed must lie inside the hierarchy at `root`, and
/// both its core lists must parse (unreserve writes one back where the other still is).
pub(crate) fn check_narrowed(narrowed: &[NarrowedCpuset], root: &Path) -> Result<(), String> {
    for n in narrowed {
        plain(&n.path)?;
        if !n.path.starts_with(root) || n.path == root {
            return Err(format!(
                "narrowed cpuset {} is not in the hierarchy at {}",
                n.path.display(),
                root.display()
            ));
        }
        for list in [&n.cpus, &n.narrowed_to] {
            crate::config::cores::parse(list)
                .map_err(|e| format!("narrowed cpuset {}: {e}", n.path.display()))?;
        }
    }
    Ok(())
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

/// What a reserve that has not finished has taken (or is about to take: each part is
/// written before its step, and giving it back is harmless if the step never happened), so
/// that a reserve killed part-way leaves nothing behind once the next `reserve` or
/// `unreserve` has run. The cpusets it narrows have their own record ([`NARROWING`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Unfinished {
    /// The pool's page size.
    pub page_size: u64,
    /// The NUMA node its hugepages come from.
    pub node: Option<u32>,
    /// Hugepages being added to the kernel's pool.
    pub hugepages: Option<HugepagesAdded>,
    /// The hugetlbfs mount the reserve makes in its state directory.
    pub mount: Option<PathBuf>,
    /// The pool file.
    pub pool_file: Option<PathBuf>,
    /// The ban being given a running irqbalance.
    pub irqbalance: Option<IrqbalanceRecord>,
    /// IRQ affinities as they were before the reserve moved them.
    pub irqs: Vec<IrqRecord>,
}

/// Hugepages a reserve adds: the kernel's count before, and how many.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HugepagesAdded {
    /// The counter's total before.
    pub before: u64,
    /// How many are added.
    pub added: u64,
}

impl HugepagesAdded {
    /// How many of the counter's `now` pages a killed reserve's give-back takes away: those
    /// above the count before, at most those it added (none if it was killed before
    /// adding, and never pages someone else had).
    pub fn to_give_back(&self, now: u64) -> u64 {
        now.saturating_sub(self.before).min(self.added)
    }
}

impl Unfinished {
    /// Whether every path it names is one a reserve in `state_dir` could have written
    /// ([`Ledger::check_paths`]'s rules): giving it back removes, unmounts and writes what
    /// it names.
    pub fn check_paths(&self, state_dir: &Path) -> Result<(), String> {
        let page = self.page_size;
        if !PAGE_SIZES.contains(&page) {
            return Err(format!("page size {page} is neither 2 MiB nor 1 GiB"));
        }
        if let Some(m) = &self.mount {
            if *m != own_mount(state_dir, page) {
                return Err(format!(
                    "mount {} is not this state directory's own",
                    m.display()
                ));
            }
        }
        if let Some(f) = &self.pool_file {
            plain(f)?;
            let tag = state_tag(state_dir);
            let ours = own_mount(state_dir, page).join(format!("{tag}-pool"));
            if *f != ours {
                return Err(format!(
                    "pool file {} is not {} (this state directory's own mount)",
                    f.display(),
                    ours.display()
                ));
            }
        }
        check_irq_files(&self.irqs)
    }

    /// The kernel's hugepage counter it adds to.
    pub fn hugepage_dir(&self) -> PathBuf {
        hugepage_counter(self.page_size, self.node)
    }
}

/// The hugetlbfs mount a reserve in `state_dir` makes for `page`-sized pages when the host
/// has none.
pub fn own_mount(state_dir: &Path, page: u64) -> PathBuf {
    state_dir.join(format!("hugetlbfs-{}k", page >> 10))
}

/// The kernel's hugepage counter for `page`-sized pages (on `node`, or the whole host's).
pub fn hugepage_counter(page: u64, node: Option<u32>) -> PathBuf {
    let kb = page >> 10;
    match node {
        None => PathBuf::from(format!("/sys/kernel/mm/hugepages/hugepages-{kb}kB")),
        Some(n) => PathBuf::from(format!(
            "/sys/devices/system/node/node{n}/hugepages/hugepages-{kb}kB"
        )),
    }
}

/// Whether each record names an IRQ affinity file (`/proc/irq/N/smp_affinity_list` or the
/// default).
fn check_irq_files(irqs: &[IrqRecord]) -> Result<(), String> {
    for irq in irqs {
        let f = irq.file.to_string_lossy();
        let ok = f == "/proc/irq/default_smp_affinity"
            || f.strip_prefix("/proc/irq/")
                .and_then(|r| r.strip_suffix("/smp_affinity_list"))
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if !ok {
            return Err(format!("IRQ record names {f}, not an IRQ affinity file"));
        }
    }
    Ok(())
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
    /// The partition's local API socket, if it serves one (`status` asks it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_socket: Option<PathBuf>,
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
    /// IRQs on the reserved cores that the kernel would not let move (managed affinity).
    #[serde(default)]
    pub irqs_left: Vec<u32>,
    /// The ban given to irqbalance, if one ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub irqbalance: Option<IrqbalanceRecord>,
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

    /// Whether every path the ledger names is one `partition reserve` in `state_dir` could
    /// have written: the pool file in its hugetlbfs mount under our own name (and that
    /// mount in the state directory if we made it), the kernel's hugepage counter for the
    /// page size, IRQ affinity files under /proc/irq, our own cgroups. `release` and
    /// `unreserve` write to, zero, unmount and remove what the ledger names; a forged one
    /// must not point them anywhere else.
    pub fn check_paths(&self, state_dir: &Path) -> Result<(), String> {
        let page = self.pool.page_size;
        if !PAGE_SIZES.contains(&page) {
            return Err(format!("page size {page} is neither 2 MiB nor 1 GiB"));
        }
        let tag = state_tag(state_dir);
        let p = &self.pool;
        plain(&p.mount)?;
        if p.mounted_by_us && p.mount != own_mount(state_dir, page) {
            return Err(format!(
                "pool mount {} is not this state directory's own",
                p.mount.display()
            ));
        }
        if p.file != p.mount.join(format!("{tag}-pool")) {
            return Err(format!(
                "pool file {} is not {tag}-pool in the pool's mount {}",
                p.file.display(),
                p.mount.display()
            ));
        }
        let counter = hugepage_counter(page, self.plan.node);
        if p.hugepage_dir != counter {
            return Err(format!(
                "hugepage counter {} is not {}",
                p.hugepage_dir.display(),
                counter.display()
            ));
        }
        check_irq_files(&self.irqs)?;
        match &self.cores.isolation {
            Isolation::None { .. } => {}
            Isolation::CgroupV1 {
                root,
                housekeeping,
                guests,
                narrowed,
                ..
            } => {
                plain(root)?;
                if *housekeeping != root.join(format!("{tag}-housekeeping"))
                    || *guests != root.join(format!("{tag}-guests"))
                {
                    return Err("the cpusets are not this state directory's own".into());
                }
                check_narrowed(narrowed, root)?;
            }
            Isolation::CgroupV2 { path, narrowed } => {
                plain(path)?;
                if path.file_name() != Some(std::ffi::OsStr::new(&format!("{tag}-guests"))) {
                    return Err(format!(
                        "cgroup {} is not this state directory's own",
                        path.display()
                    ));
                }
                check_narrowed(narrowed, path.parent().unwrap_or(Path::new("/")))?;
            }
        }
        if self.cores.reserved.is_empty()
            || self
                .cores
                .reserved
                .iter()
                .any(|c| self.cores.housekeeping.contains(c))
        {
            return Err("reserved cores are empty or also the host's".into());
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

/// A name unique to a state directory, for the host objects a reservation creates (the pool
/// file, cgroups): `partition-<FNV-1a of the path, 12 hex digits>`.
pub fn state_tag(state_dir: &Path) -> String {
    let h = state_dir
        .to_string_lossy()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        });
    format!("partition-{:012x}", h >> 16)
}

/// An absolute path of plain components (no `.` or `..`).
fn plain(p: &Path) -> Result<(), String> {
    let ok = p.is_absolute()
        && p.components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    if ok {
        Ok(())
    } else {
        Err(format!("{} is not a plain absolute path", p.display()))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A ledger `reserve` could have written in `dir`.
    pub(crate) fn sample_in(dir: &Path) -> Ledger {
        let mount = dir.join("hugetlbfs-2048k");
        Ledger {
            version: VERSION,
            reserved_at: 1,
            plan: PlanRecord {
                memory: 64 << 20,
                page_size: 2 << 20,
                node: None,
                cores: vec![1],
                isolation: IsolationMode::Cpusets,
                irqbalance: IrqbalanceMode::Ban,
            },
            pool: PoolRecord {
                file: mount.join(format!("{}-pool", state_tag(dir))),
                size: 64 << 20,
                page_size: 2 << 20,
                hugepage_dir: "/sys/kernel/mm/hugepages/hugepages-2048kB".into(),
                hugepages_added: 32,
                mount,
                mounted_by_us: true,
            },
            cores: CoreRecord {
                reserved: vec![1],
                housekeeping: vec![0],
                isolation: Isolation::None {
                    reason: "test".into(),
                },
            },
            irqs: vec![IrqRecord {
                file: "/proc/irq/7/smp_affinity_list".into(),
                old: "0-1".into(),
            }],
            irqs_left: Vec::new(),
            irqbalance: None,
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
                api_socket: None,
            }],
        }
    }

    pub(crate) fn sample() -> Ledger {
        sample_in(Path::new("/run/partition"))
    }

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ledger-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    type Forge = Box<dyn Fn(&mut Ledger)>;

    #[test]
    fn a_ledger_no_reserve_could_write_is_refused() {
        assert_eq!(sample().check(), Ok(()));
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
        let dir = scratch("forged");
        let lock = LedgerLock::exclusive(&dir).unwrap();
        for (what, f) in bad {
            let mut l = sample_in(lock.dir());
            f(&mut l);
            assert!(l.check().is_err(), "{what}: accepted");
            // Written by someone else, it is refused on load with the reason.
            std::fs::write(lock.path(), serde_json::to_string(&l).unwrap()).unwrap();
            match lock.load() {
                Err(e @ LedgerError::Corrupt { .. }) => assert!(e.is_usage(), "{what}"),
                other => panic!("{what}: loaded as {other:?}"),
            }
        }
        lock.remove().unwrap();
        drop(lock);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_unfinished_record_names_only_what_a_reserve_here_takes() {
        let dir = scratch("unfinished");
        let lock = LedgerLock::exclusive(&dir).unwrap();
        let here = lock.dir().to_path_buf();
        let tag = state_tag(&here);
        let good = Unfinished {
            page_size: 2 << 20,
            node: None,
            hugepages: Some(HugepagesAdded {
                before: 4,
                added: 32,
            }),
            mount: Some(own_mount(&here, 2 << 20)),
            pool_file: Some(own_mount(&here, 2 << 20).join(format!("{tag}-pool"))),
            irqbalance: None,
            irqs: vec![IrqRecord {
                file: "/proc/irq/24/smp_affinity_list".into(),
                old: "0-1".into(),
            }],
        };
        assert_eq!(good.check_paths(&here), Ok(()));
        assert_eq!(
            good.hugepage_dir(),
            PathBuf::from("/sys/kernel/mm/hugepages/hugepages-2048kB")
        );
        // Of the hugepages: none if the reserve died before adding them (or someone took
        // the count below where it was), all it added once added, never more.
        let h = good.hugepages.unwrap();
        assert_eq!(
            [3, 4, 20, 36, 50].map(|now| h.to_give_back(now)),
            [0, 0, 16, 32, 32]
        );
        // Stored, it is read back as written, and stays until cleared.
        assert_eq!(lock.unfinished(), None);
        lock.store_unfinished(&good).unwrap();
        assert_eq!(lock.unfinished(), Some(good.clone()));
        assert_eq!(lock.unfinished(), Some(good.clone()));
        lock.clear_unfinished();
        assert_eq!(lock.unfinished(), None);
        // Forged: each is refused, and the record removed.
        let forged: Vec<(&str, Unfinished)> = vec![
            (
                "a mount elsewhere",
                Unfinished {
                    mount: Some("/dev/hugepages".into()),
                    ..good.clone()
                },
            ),
            (
                "a pool file under another name",
                Unfinished {
                    pool_file: Some("/etc/shadow".into()),
                    ..good.clone()
                },
            ),
            (
                "an IRQ record on another file",
                Unfinished {
                    irqs: vec![IrqRecord {
                        file: "/etc/passwd".into(),
                        old: "x".into(),
                    }],
                    ..good.clone()
                },
            ),
            (
                "a 4 KiB page",
                Unfinished {
                    page_size: 4096,
                    ..good.clone()
                },
            ),
        ];
        for (what, u) in forged {
            assert!(u.check_paths(&here).is_err(), "{what}");
            lock.store_unfinished(&u).unwrap();
            assert_eq!(lock.unfinished(), None, "{what}");
            assert!(!here.join(UNFINISHED).exists(), "{what}");
        }
        drop(lock);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_ledger_pointing_outside_its_reservation_is_refused() {
        let dir = scratch("paths");
        let lock = LedgerLock::exclusive(&dir).unwrap();
        let here = lock.dir().to_path_buf();
        assert_eq!(sample_in(&here).check_paths(&here), Ok(()));
        let here_for_bad = here.clone();
        let bad: Vec<(&str, Forge)> = vec![
            (
                "a 4 KiB page size",
                Box::new(|l| {
                    l.pool.page_size = 4096;
                    l.plan.page_size = 4096;
                }),
            ),
            (
                "pool file elsewhere",
                Box::new(|l| l.pool.file = "/etc/shadow".into()),
            ),
            (
                "pool file beside its name",
                Box::new(|l| {
                    l.pool.file = l.pool.mount.join("other-pool");
                }),
            ),
            (
                "a mount of ours outside the state directory",
                Box::new(|l| {
                    l.pool.mount = "/dev/hugepages".into();
                    l.pool.file = format!(
                        "/dev/hugepages/{}",
                        l.pool.file.file_name().unwrap().to_string_lossy()
                    )
                    .into();
                }),
            ),
            (
                "dots in the mount",
                Box::new(|l| {
                    l.pool.mounted_by_us = false;
                    l.pool.mount = "/dev/hugepages/../../etc".into();
                }),
            ),
            (
                "hugepage counter elsewhere",
                Box::new(|l| {
                    l.pool.hugepage_dir = "/proc/sys/kernel".into();
                }),
            ),
            (
                "hugepage counter of another size",
                Box::new(|l| {
                    l.pool.hugepage_dir = "/sys/kernel/mm/hugepages/hugepages-1048576kB".into();
                }),
            ),
            (
                "an IRQ record naming another file",
                Box::new(|l| {
                    l.irqs[0].file = "/etc/passwd".into();
                }),
            ),
            (
                "an IRQ record naming a sibling",
                Box::new(|l| {
                    l.irqs[0].file = "/proc/irq/7/../../sys/kernel/core_pattern".into();
                }),
            ),
            (
                "cpusets of another reservation",
                Box::new(|l| {
                    l.cores.isolation = Isolation::CgroupV1 {
                        root: "/sys/fs/cgroup/cpuset".into(),
                        housekeeping: "/sys/fs/cgroup/cpuset/system".into(),
                        guests: "/sys/fs/cgroup/cpuset/partition-000000000000-guests".into(),
                        moved: 0,
                        unmovable: 0,
                        narrowed: Vec::new(),
                    };
                }),
            ),
            (
                "a narrowed cpuset outside the hierarchy",
                Box::new(move |l| {
                    l.cores.isolation =
                        ours_narrowing(&here_for_bad, "/sys/fs/cgroup/memory/docker");
                }),
            ),
            (
                "host cores reserved",
                Box::new(|l| l.cores.housekeeping = vec![0, 1]),
            ),
        ];
        for (what, f) in bad {
            let mut l = sample_in(&here);
            f(&mut l);
            assert!(l.check_paths(&here).is_err(), "{what}: accepted");
            std::fs::write(lock.path(), serde_json::to_string(&l).unwrap()).unwrap();
            assert!(
                matches!(lock.load(), Err(LedgerError::Corrupt { .. })),
                "{what}: loaded"
            );
        }
        // Our own cpusets pass.
        let mut l = sample_in(&here);
        l.cores.isolation = ours_narrowing(&here, "/sys/fs/cgroup/cpuset/docker");
        assert_eq!(l.check_paths(&here), Ok(()));
        lock.remove().unwrap();
        drop(lock);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Our own v1 cpusets for state directory `here`, having narrowed `other` 0-1 to 0.
    fn ours_narrowing(here: &Path, other: &str) -> Isolation {
        let tag = state_tag(here);
        Isolation::CgroupV1 {
            root: "/sys/fs/cgroup/cpuset".into(),
            housekeeping: format!("/sys/fs/cgroup/cpuset/{tag}-housekeeping").into(),
            guests: format!("/sys/fs/cgroup/cpuset/{tag}-guests").into(),
            moved: 0,
            unmovable: 0,
            narrowed: vec![NarrowedCpuset {
                path: other.into(),
                cpus: "0-1".into(),
                narrowed_to: "0".into(),
            }],
        }
    }

    #[test]
    fn round_trip_and_atomic_replace() {
        let dir = scratch("test");
        let lock = LedgerLock::exclusive(&dir).unwrap();
        assert_eq!(lock.load().unwrap(), None);
        let l = sample_in(lock.dir());
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
    fn unknown_fields_versions_and_huge_files_are_refused() {
        let dir = scratch("bad");
        let lock = LedgerLock::exclusive(&dir).unwrap();
        let mut v = serde_json::to_value(sample_in(lock.dir())).unwrap();
        v["pool"]["hugepages_addded"] = 1.into();
        std::fs::write(lock.path(), v.to_string()).unwrap();
        assert!(matches!(lock.load(), Err(LedgerError::Corrupt { .. })));
        let mut v = serde_json::to_value(sample_in(lock.dir())).unwrap();
        v["version"] = 99.into();
        std::fs::write(lock.path(), v.to_string()).unwrap();
        assert!(matches!(lock.load(), Err(LedgerError::Corrupt { .. })));
        std::fs::write(lock.path(), "{").unwrap();
        assert!(matches!(lock.load(), Err(LedgerError::Corrupt { .. })));
        // Not UTF-8: corrupt (exit 2), not an I/O failure.
        std::fs::write(lock.path(), b"{\"version\": \xff\xfe}").unwrap();
        match lock.load() {
            Err(e @ LedgerError::Corrupt { .. }) => {
                assert!(e.is_usage() && e.to_string().contains("not UTF-8"), "{e}")
            }
            r => panic!("{r:?}"),
        }
        std::fs::write(lock.path(), vec![b' '; (MAX_LEDGER + 10) as usize]).unwrap();
        assert!(matches!(lock.load(), Err(LedgerError::Corrupt { .. })));
        drop(lock);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn liveness_is_the_partition_lock() {
        let dir = scratch("live");
        let lock = LedgerLock::exclusive(&dir).unwrap();
        assert!(!lock.partition_alive("a"));
        let held = lock.lock_partition("a").unwrap();
        assert!(lock.partition_alive("a"));
        // A second launcher cannot take it.
        assert!(lock.lock_partition("a").is_err());
        // A forked child shares it: still held until both have closed it.
        // SAFETY: the child only sleeps and exits (async-signal-safe).
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: as above.
            unsafe { libc::usleep(300_000) };
            // SAFETY: as above.
            unsafe { libc::_exit(0) };
        }
        drop(held);
        assert!(lock.partition_alive("a"), "the child holds it");
        let mut st = 0;
        // SAFETY: reaping our own child.
        unsafe { libc::waitpid(pid, &mut st, 0) };
        assert!(!lock.partition_alive("a"));
        lock.remove_partition_lock("a");
        assert!(!dir.join("locks/a").exists());
        drop(lock);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn pid_identity_and_signals_go_only_to_the_recorded_process() {
        let me = std::process::id();
        let t = pid_start_time(me).unwrap();
        assert_eq!(pid_start_time(u32::MAX), None);
        // A child that waits for SIGTERM: signalled only while its record matches.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let mut p = sample().partitions[0].clone();
        p.pid = child.id();
        p.pid_start = pid_start_time(p.pid).unwrap();
        let wrong = PartitionRecord {
            pid_start: p.pid_start + 1,
            ..p.clone()
        };
        assert!(!signal_launcher(&wrong, libc::SIGTERM));
        assert!(child.try_wait().unwrap().is_none(), "signalled a stranger");
        assert!(signal_launcher(&p, libc::SIGTERM));
        let st = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(st.signal(), Some(libc::SIGTERM));
        // Gone: nothing to signal.
        assert!(!signal_launcher(&p, libc::SIGTERM));
        let _ = t;
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
