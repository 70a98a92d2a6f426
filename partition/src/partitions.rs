//! Partitions from the reservation: launching one on reserved cores and a pool extent,
//! status, release, and the crash-recovery rules that tie them together.
//!
//! The ledger is written (state `launching`, our pid) before KVM is touched, so a launcher
//! that dies at any point leaves a record `status` can explain and `release` can reclaim.
//! Every extent is zeroed before it goes back to the free space: by the launcher after its
//! guest stops, or by `release` for a launcher that died.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pool::Extent;
use pool::poolfile::{PoolFile, PoolFileError};
use serde::{Deserialize, Serialize};

use crate::cores;
use crate::launch::{
    self, Checked, LaunchConfig, LaunchError, LaunchReport, Observer, PoolOutcome, VcpuReport,
};
use crate::ledger::{
    self, ExtentRecord, Ledger, LedgerError, LedgerLock, PartitionRecord, PartitionState,
};

/// Environment variable naming a point at which the launcher or release kills itself with
/// SIGKILL (for crash-recovery tests): `after-ledger`, `after-map`, `running`,
/// `during-release`.
pub const CRASH_ENV: &str = "PARTITION_TEST_CRASH_AT";

fn crash_point(name: &str) {
    if std::env::var(CRASH_ENV).as_deref() == Ok(name) {
        eprintln!("partition: {CRASH_ENV}={name}: killing myself with SIGKILL");
        // SAFETY: signalling ourselves.
        unsafe { libc::kill(std::process::id() as i32, libc::SIGKILL) };
    }
}

fn stats_path(state_dir: &Path, name: &str) -> PathBuf {
    state_dir.join("stats").join(format!("{name}.json"))
}

/// Checks a partition name: 1-64 of `[A-Za-z0-9._-]`, not starting with `.` or `-`.
pub fn check_name(name: &str) -> Result<(), LaunchError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with(['.', '-'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(LaunchError::Reservation(format!(
            "--name {name:?}: use 1 to 64 letters, digits, '.', '_' or '-', not starting with '.' or '-'"
        )))
    }
}

/// Refuses a launch outside the reservation on cores the reservation holds.
pub fn check_not_reserved(state_dir: &Path, cores: &[usize]) -> Result<(), LaunchError> {
    if !state_dir.join("ledger.json").exists() {
        return Ok(());
    }
    let lock = LedgerLock::shared(state_dir)?;
    if let Some(l) = lock.load()? {
        if let Some(c) = cores.iter().find(|c| l.cores.reserved.contains(c)) {
            return Err(LaunchError::Reservation(format!(
                "core {c} is reserved for partitions (see `partition status`): launch with --name to use it"
            )));
        }
    }
    Ok(())
}

/// Takes cores and an extent from the ledger for `checked`, recording the partition as
/// `launching`. Nothing is written if anything is refused.
fn claim(
    checked: &Checked,
    name: &str,
    offset: Option<u64>,
) -> Result<(Ledger, Extent), LaunchError> {
    let cfg = checked.config();
    let lock = LedgerLock::exclusive(&cfg.state_dir)?;
    let mut l = lock.load()?.ok_or_else(|| {
        LaunchError::Reservation(format!(
            "nothing is reserved in {}: run `partition reserve` first",
            cfg.state_dir.display()
        ))
    })?;
    if let Some(p) = l.partition(name) {
        let how = if ledger::alive(p) {
            format!("running (pid {})", p.pid)
        } else {
            "dead: `partition release` it first".to_string()
        };
        return Err(LaunchError::Reservation(format!(
            "a partition named {name:?} exists, {how}"
        )));
    }
    let size = checked.memory();
    let mut free = l.allocator().map_err(|e| {
        LaunchError::Reservation(format!("the ledger's extents are inconsistent: {e}"))
    })?;
    let extent = match offset {
        Some(o) => free.alloc_at(Extent {
            offset: o,
            len: size,
        }),
        None => free.alloc(size),
    }
    .map_err(|e| {
        LaunchError::Reservation(format!(
            "--memory: the {} pool cannot give this partition {}: {e}",
            crate::size::format(l.pool.size),
            crate::size::format(size)
        ))
    })?;
    for c in checked.cores() {
        if !l.cores.reserved.contains(c) {
            return Err(LaunchError::Reservation(format!(
                "core {c} is not reserved (reserved: {})",
                cores::format(&l.cores.reserved)
            )));
        }
        if let Some(owner) = l.partitions.iter().find(|p| p.cores.contains(c)) {
            return Err(LaunchError::Reservation(format!(
                "core {c} belongs to partition {:?}",
                owner.name
            )));
        }
    }
    let pid = std::process::id();
    l.partitions.push(PartitionRecord {
        name: name.to_string(),
        pid,
        pid_start: ledger::pid_start_time(pid).unwrap_or(0),
        cores: checked.cores().to_vec(),
        extent: extent.into(),
        idle: checked.idle().policy.name().into(),
        state: PartitionState::Launching,
        started_at: ledger::now(),
        kernel: checked.kernel_name().to_string(),
    });
    lock.store(&l)?;
    Ok((l, extent))
}

/// Updates partition `name`'s state in the ledger, if it is still ours.
fn set_state(state_dir: &Path, name: &str, state: PartitionState) -> Result<(), LedgerError> {
    let lock = LedgerLock::exclusive(state_dir)?;
    if let Some(mut l) = lock.load()? {
        if let Some(p) = l.partitions.iter_mut().find(|p| p.name == name) {
            p.state = state;
            lock.store(&l)?;
        }
    }
    Ok(())
}

/// Removes partition `name` from the ledger, freeing its cores and (already scrubbed) extent.
fn forget(state_dir: &Path, name: &str) -> Result<(), LedgerError> {
    let lock = LedgerLock::exclusive(state_dir)?;
    if let Some(mut l) = lock.load()? {
        l.partitions.retain(|p| p.name != name);
        lock.store(&l)?;
    }
    let _ = std::fs::remove_file(stats_path(state_dir, name));
    Ok(())
}

/// Zeroes `extent` of the pool through a fresh mapping; returns the time it took.
fn scrub(l: &Ledger, extent: Extent) -> Result<Duration, PoolFileError> {
    let pool = PoolFile::open(&l.pool.file, l.pool.size, l.pool.page_size)?;
    let m = pool.map(extent)?;
    Ok(m.scrub())
}

/// Per-vCPU exit counts as the launcher last wrote them.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StatsFile {
    /// Unix time written.
    pub updated_at: u64,
    /// One entry per vCPU.
    pub vcpus: Vec<VcpuStats>,
}

/// One vCPU's counters.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VcpuStats {
    /// vCPU index.
    pub vcpu: usize,
    /// Host core.
    pub core: usize,
    /// Exit counts by reason.
    pub exits: std::collections::BTreeMap<String, u64>,
    /// KVM's halt statistics.
    #[serde(default)]
    pub kvm: std::collections::BTreeMap<String, u64>,
}

fn write_stats(path: &Path, vcpus: &[VcpuReport]) {
    let s = StatsFile {
        updated_at: ledger::now(),
        vcpus: vcpus
            .iter()
            .map(|v| VcpuStats {
                vcpu: v.index,
                core: v.core,
                exits: v.exits.iter().map(|(k, n)| (k.to_string(), *n)).collect(),
                kvm: v.kvm.clone(),
            })
            .collect(),
    };
    let tmp = path.with_extension("tmp");
    if let Some(d) = path.parent() {
        let _ = std::fs::create_dir_all(d);
    }
    if let Ok(text) = serde_json::to_string(&s) {
        if std::fs::write(&tmp, text).is_ok() {
            let _ = std::fs::rename(&tmp, path);
        }
    }
}

/// Records the partition's progress in the state directory, then passes events on.
struct LedgerObserver<'a> {
    inner: &'a dyn Observer,
    state_dir: PathBuf,
    name: String,
}

impl Observer for LedgerObserver<'_> {
    fn booting(&self, c: &Checked, b: &boot::BootInfo, m: &str) {
        self.inner.booting(c, b, m);
    }
    fn running(&self) {
        if let Err(e) = set_state(&self.state_dir, &self.name, PartitionState::Running) {
            log::warn!("recording {} as running: {e}", self.name);
        }
        crash_point("running");
        self.inner.running();
    }
    fn tick(&self, vcpus: &[VcpuReport]) {
        write_stats(&stats_path(&self.state_dir, &self.name), vcpus);
        self.inner.tick(vcpus);
    }
}

/// Launches a partition from the reservation; see the module docs for the order of steps.
pub fn launch_from_pool(
    cfg: LaunchConfig,
    observer: &dyn Observer,
) -> Result<LaunchReport, LaunchError> {
    let req = cfg
        .pool
        .clone()
        .ok_or_else(|| LaunchError::Reservation("no partition name".into()))?;
    check_name(&req.name)?;
    let state_dir = cfg.state_dir.clone();
    let checked = launch::check(cfg)?;
    let (l, extent) = claim(&checked, &req.name, req.offset)?;
    crash_point("after-ledger");

    let started = Instant::now();
    let mapped =
        PoolFile::open(&l.pool.file, l.pool.size, l.pool.page_size).and_then(|p| p.map(extent));
    let ram = match mapped {
        Ok(r) => r,
        Err(e) => {
            // Nothing touched the extent: it is still clean.
            let _ = forget(&state_dir, &req.name);
            return Err(e.into());
        }
    };
    crash_point("after-map");
    let obs = LedgerObserver {
        inner: observer,
        state_dir: state_dir.clone(),
        name: req.name.clone(),
    };
    let isolation = Some(l.cores.isolation.clone());
    let result = launch::run(checked, Box::new(ram), started, isolation, &obs);

    // The guest is gone (or never ran): scrub, then free the cores and the extent.
    let _ = set_state(&state_dir, &req.name, PartitionState::Stopping);
    let scrubbed = scrub(&l, extent);
    match &scrubbed {
        Ok(_) => forget(&state_dir, &req.name)?,
        Err(e) => log::error!(
            "scrubbing {}'s memory failed ({e}); it stays recorded: run `partition release {}`",
            req.name,
            req.name
        ),
    }
    let mut report = result?;
    report.pool = Some(PoolOutcome {
        name: req.name,
        offset: extent.offset,
        len: extent.len,
        scrub: scrubbed?,
    });
    Ok(report)
}

/// Errors releasing a partition.
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    /// The ledger could not be read or written.
    #[error("{0}")]
    Ledger(#[from] LedgerError),
    /// No such partition (or no reservation).
    #[error("{0}")]
    NotFound(String),
    /// The extent could not be scrubbed.
    #[error("scrubbing the partition's memory: {0}")]
    Scrub(#[from] PoolFileError),
    /// The launcher would not die.
    #[error("partition {name:?}: pid {pid} is still alive after SIGKILL")]
    Unkillable {
        /// Name.
        name: String,
        /// Pid.
        pid: u32,
    },
}

impl ReleaseError {
    /// Whether the request itself was wrong (the CLI exits with status 2).
    pub fn is_usage(&self) -> bool {
        matches!(self, Self::NotFound(_))
    }
}

/// What release did.
#[derive(Debug)]
pub struct ReleaseReport {
    /// Whether the launcher was running.
    pub was_alive: bool,
    /// Signals sent to it.
    pub signals: Vec<&'static str>,
    /// Whether the launcher cleaned up after itself.
    pub launcher_cleaned_up: bool,
    /// Scrub time, when release scrubbed.
    pub scrubbed: Option<Duration>,
}

fn wait_gone(p: &PartitionRecord, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if !ledger::alive(p) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    !ledger::alive(p)
}

/// Stops partition `name` (SIGTERM, then SIGKILL after `grace`), or reclaims it if its
/// launcher is dead: scrub its extent, free its cores.
pub fn release(
    state_dir: &Path,
    name: &str,
    grace: Duration,
) -> Result<ReleaseReport, ReleaseError> {
    let p = {
        let lock = LedgerLock::shared(state_dir)?;
        let l = lock.load()?.ok_or_else(|| {
            ReleaseError::NotFound(format!("nothing is reserved in {}", state_dir.display()))
        })?;
        l.partition(name).cloned().ok_or_else(|| {
            ReleaseError::NotFound(format!(
                "no partition named {name:?} (partitions: {})",
                if l.partitions.is_empty() {
                    "none".to_string()
                } else {
                    l.partitions
                        .iter()
                        .map(|p| p.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ))
        })?
    };
    let was_alive = ledger::alive(&p);
    let mut signals = Vec::new();
    if was_alive {
        // SAFETY: signalling a pid whose start time we just matched.
        unsafe { libc::kill(p.pid as i32, libc::SIGTERM) };
        signals.push("SIGTERM");
        if !wait_gone(&p, grace) {
            // SAFETY: as above.
            unsafe { libc::kill(p.pid as i32, libc::SIGKILL) };
            signals.push("SIGKILL");
            if !wait_gone(&p, Duration::from_secs(10)) {
                return Err(ReleaseError::Unkillable {
                    name: name.to_string(),
                    pid: p.pid,
                });
            }
        }
    }
    // Did the launcher clean up? If not, reclaim.
    let l = {
        let lock = LedgerLock::exclusive(state_dir)?;
        let Some(mut l) = lock.load()? else {
            return Ok(ReleaseReport {
                was_alive,
                signals,
                launcher_cleaned_up: true,
                scrubbed: None,
            });
        };
        match l.partitions.iter_mut().find(|q| q.name == name) {
            None => {
                return Ok(ReleaseReport {
                    was_alive,
                    signals,
                    launcher_cleaned_up: true,
                    scrubbed: None,
                });
            }
            Some(q) => {
                q.state = PartitionState::Releasing;
            }
        }
        lock.store(&l)?;
        l
    };
    crash_point("during-release");
    let t = scrub(&l, p.extent.into())?;
    forget(state_dir, name)?;
    Ok(ReleaseReport {
        was_alive,
        signals,
        launcher_cleaned_up: false,
        scrubbed: Some(t),
    })
}

/// The state directory as `status` shows it.
#[derive(Debug, Serialize)]
pub struct Status {
    /// State directory.
    pub state_dir: PathBuf,
    /// Whether anything is reserved.
    pub reserved: bool,
    /// The pool.
    pub pool: Option<PoolStatus>,
    /// The cores.
    pub cores: Option<CoreStatus>,
    /// IRQ affinities changed by reserve.
    pub irqs_moved: usize,
    /// Partitions.
    pub partitions: Vec<PartitionStatus>,
}

/// Pool part of [`Status`].
#[derive(Debug, Serialize)]
pub struct PoolStatus {
    /// Pool file.
    pub file: PathBuf,
    /// Bytes.
    pub size: u64,
    /// Page size.
    pub page_size: u64,
    /// Free bytes.
    pub free_bytes: u64,
    /// Free extents.
    pub free: Vec<ExtentRecord>,
    /// Used extents, by partition.
    pub used: Vec<UsedExtent>,
}

/// An extent owned by a partition.
#[derive(Debug, Serialize)]
pub struct UsedExtent {
    /// Owner.
    pub partition: String,
    /// Extent.
    pub extent: ExtentRecord,
}

/// Cores part of [`Status`].
#[derive(Debug, Serialize)]
pub struct CoreStatus {
    /// Reserved for partitions.
    pub reserved: Vec<usize>,
    /// Left to the host.
    pub housekeeping: Vec<usize>,
    /// Reserved cores in use, with their owner.
    pub assigned: Vec<(usize, String)>,
    /// Reserved cores not in use.
    pub free: Vec<usize>,
    /// How they are isolated.
    pub isolation: String,
}

/// One partition in [`Status`].
#[derive(Debug, Serialize)]
pub struct PartitionStatus {
    /// Name.
    pub name: String,
    /// Launcher pid.
    pub pid: u32,
    /// Whether that launcher is still running.
    pub alive: bool,
    /// Recorded state.
    pub state: PartitionState,
    /// Cores.
    pub cores: Vec<usize>,
    /// Extent.
    pub extent: ExtentRecord,
    /// Idle policy.
    pub idle: String,
    /// Kernel.
    pub kernel: String,
    /// Seconds since launch.
    pub uptime_secs: u64,
    /// Exit counters (as of the last second), when the launcher is alive.
    pub exits: Option<StatsFile>,
    /// What to do about it, for a dead one.
    pub note: Option<String>,
}

/// Reads the state directory.
pub fn status(state_dir: &Path) -> Result<Status, LedgerError> {
    let lock = LedgerLock::shared(state_dir)?;
    let Some(l) = lock.load()? else {
        return Ok(Status {
            state_dir: state_dir.to_path_buf(),
            reserved: false,
            pool: None,
            cores: None,
            irqs_moved: 0,
            partitions: Vec::new(),
        });
    };
    let free = l
        .allocator()
        .map(|a| (a.free_bytes(), a.free_extents().to_vec()));
    let (free_bytes, free) = match free {
        Ok((b, f)) => (b, f.into_iter().map(ExtentRecord::from).collect()),
        Err(_) => (0, Vec::new()),
    };
    let assigned: Vec<(usize, String)> = l
        .partitions
        .iter()
        .flat_map(|p| p.cores.iter().map(|c| (*c, p.name.clone())))
        .collect();
    let now = ledger::now();
    let partitions = l
        .partitions
        .iter()
        .map(|p| {
            let alive = ledger::alive(p);
            let exits = if alive {
                std::fs::read_to_string(stats_path(state_dir, &p.name))
                    .ok()
                    .and_then(|t| serde_json::from_str(&t).ok())
            } else {
                None
            };
            let note = (!alive).then(|| {
                format!(
                    "launcher pid {} is gone (it died while {}); its cores and {} of memory are held \
                     until `partition release {}` scrubs and frees them",
                    p.pid,
                    match p.state {
                        PartitionState::Launching => "launching",
                        PartitionState::Running => "running",
                        PartitionState::Stopping => "scrubbing after the guest stopped",
                        PartitionState::Releasing => "being released",
                    },
                    crate::size::format(p.extent.len),
                    p.name
                )
            });
            PartitionStatus {
                name: p.name.clone(),
                pid: p.pid,
                alive,
                state: p.state,
                cores: p.cores.clone(),
                extent: p.extent,
                idle: p.idle.clone(),
                kernel: p.kernel.clone(),
                uptime_secs: now.saturating_sub(p.started_at),
                exits,
                note,
            }
        })
        .collect();
    Ok(Status {
        state_dir: state_dir.to_path_buf(),
        reserved: true,
        pool: Some(PoolStatus {
            file: l.pool.file.clone(),
            size: l.pool.size,
            page_size: l.pool.page_size,
            free_bytes,
            free,
            used: l
                .partitions
                .iter()
                .map(|p| UsedExtent {
                    partition: p.name.clone(),
                    extent: p.extent,
                })
                .collect(),
        }),
        cores: Some(CoreStatus {
            reserved: l.cores.reserved.clone(),
            housekeeping: l.cores.housekeeping.clone(),
            free: l
                .cores
                .reserved
                .iter()
                .copied()
                .filter(|c| !assigned.iter().any(|(a, _)| a == c))
                .collect(),
            assigned,
            isolation: crate::reserve::describe_isolation(&l.cores.isolation),
        }),
        irqs_moved: l.irqs.len(),
        partitions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["a", "web-1", "db_2.prod", &"x".repeat(64)] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-x", ".x", "a b", "a/b", "é", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }
}
