//! A partition's claim on the reservation: its cores and pool extent recorded in the ledger
//! for as long as its launcher lives, and given back — the extent zeroed first — when the
//! claim ends, however the launch ends.
//!
//! The ledger is written (state `launching`, our pid) before KVM is touched, so a launcher
//! that dies at any point leaves a record `partition status` can explain and
//! `partition release` can reclaim. This module knows the ledger and the pool, nothing of
//! KVM or of the launch that uses the claim.

use std::path::{Path, PathBuf};
use std::time::Duration;

use pool::Extent;
use pool::poolfile::{ExtentFile, PoolFile, PoolFileError};

use crate::config::cores;
use crate::cpu::exits::{PartitionCounters, VcpuCounters};
use crate::host::ledger::{
    self, Isolation, Ledger, LedgerError, LedgerLock, PartitionLock, PartitionRecord,
    PartitionState,
};

/// Environment variable naming a point at which the launcher or release kills itself with
/// SIGKILL (for crash-recovery tests): `after-ledger`, `after-map`, `running`,
/// `during-release`; or at which the keeper dies (`keeper-running`, `keeper-releasing`,
/// `crate::host::keeper`). Only debug builds (the test builds) have the hook; in a release build
/// the variable does nothing.
pub const CRASH_ENV: &str = "PARTITION_TEST_CRASH_AT";

#[cfg(not(debug_assertions))]
pub(crate) fn crash_point(_name: &str) {}

#[cfg(debug_assertions)]
pub(crate) fn crash_point(name: &str) {
    if std::env::var(CRASH_ENV).as_deref() == Ok(name) {
        eprintln!("partition: {CRASH_ENV}={name}: killing myself with SIGKILL");
        // tgkill: a call the launcher's seccomp filter allows (it kicks vCPUs with it).
        let pid = std::process::id() as libc::pid_t;
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        // SAFETY: signalling ourselves; SIGKILL ends the whole process.
        unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, libc::SIGKILL) };
    }
}

/// Errors taking, using or giving back a claim.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// The reservation refused it (no reservation, cores or extent not available, name in
    /// use or malformed): the user's input.
    #[error("{0}")]
    Refused(String),
    /// The ledger could not be read or written.
    #[error("{0}")]
    Ledger(#[from] LedgerError),
    /// The pool file could not be opened, mapped or scrubbed.
    #[error("{0}")]
    PoolFile(#[from] PoolFileError),
}

/// Checks a partition name: 1-64 of `[A-Za-z0-9._-]`, not starting with `.` or `-`.
pub fn check_name(name: &str) -> Result<(), ClaimError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with(['.', '-'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(ClaimError::Refused(format!(
            "--name {name:?}: use 1 to 64 letters, digits, '.', '_' or '-', not starting with '.' or '-'"
        )))
    }
}

/// Who holds a core that a launch outside the reservation asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CoreHolder {
    /// This state directory's reservation (its ledger).
    Ledger,
    /// Another reservation on the host, by its state directory (the claims in
    /// [`crate::host::coreclaims::CORE_CLAIMS`]).
    Reservation(PathBuf),
}

impl CoreHolder {
    /// The refusal of a launch outside the reservation on `core`, naming the holder.
    pub fn refusal(&self, core: usize) -> ClaimError {
        ClaimError::Refused(match self {
            CoreHolder::Ledger => format!(
                "core {core} is reserved for partitions (see `partition status`): launch with --name to use it"
            ),
            CoreHolder::Reservation(by) => format!(
                "core {core} is reserved for partitions by the reservation in {} (see `partition \
                 status --state-dir {}`): launch with --name and that --state-dir to use it",
                by.display(),
                by.display()
            ),
        })
    }
}

/// The first of `cores` a reservation holds, and which: any reservation on the host (the
/// claims in [`crate::host::coreclaims::CORE_CLAIMS`]) first, then this state directory's
/// ledger. Read only; the launch's check refuses ([`CoreHolder::refusal`]).
pub fn reserved_core(
    state_dir: &Path,
    cores: &[usize],
) -> Result<Option<(usize, CoreHolder)>, ClaimError> {
    let claims = Path::new(crate::host::coreclaims::CORE_CLAIMS);
    if let Some((c, by)) = crate::host::coreclaims::claimed_by(claims, cores) {
        return Ok(Some((c, CoreHolder::Reservation(by))));
    }
    if !state_dir.join("ledger.json").exists() {
        return Ok(None);
    }
    let lock = LedgerLock::shared(state_dir)?;
    Ok(lock.load()?.and_then(|l| {
        cores
            .iter()
            .find(|c| l.cores.reserved.contains(c))
            .map(|&c| (c, CoreHolder::Ledger))
    }))
}

/// What a claim asks for.
#[derive(Clone, Debug)]
pub struct ClaimRequest<'a> {
    /// State directory holding the ledger.
    pub state_dir: &'a Path,
    /// Partition name.
    pub name: &'a str,
    /// Explicit extent offset in the pool; first fit if absent.
    pub offset: Option<u64>,
    /// Extent size (the guest's memory).
    pub size: u64,
    /// Host cores, all of which must be reserved and unowned.
    pub cores: &'a [usize],
    /// Idle policy name, for the record.
    pub idle: &'a str,
    /// Kernel name, for the record.
    pub kernel: &'a str,
    /// The local API socket, for the record.
    pub api_socket: Option<&'a Path>,
}

/// What a finished claim did with its extent.
#[derive(Clone, Debug)]
pub struct Released {
    /// Partition name.
    pub name: String,
    /// Extent offset.
    pub offset: u64,
    /// Extent length.
    pub len: u64,
    /// Time spent zeroing the extent.
    pub scrub: Duration,
}

/// A live claim. Dropping it without [`ExtentClaim::release`] still scrubs the extent and
/// frees the cores (an error path); `release` does the same and says how it went.
#[derive(Debug)]
pub struct ExtentClaim {
    state_dir: PathBuf,
    name: String,
    ledger: Ledger,
    extent: Extent,
    /// The partition's liveness lock, held for the claim's life.
    lock: Option<PartitionLock>,
    done: bool,
}

impl ExtentClaim {
    /// Takes cores and an extent from the ledger, recording the partition as `launching`.
    /// Nothing is written if anything is refused.
    pub fn take(req: &ClaimRequest<'_>) -> Result<Self, ClaimError> {
        check_name(req.name)?;
        let nothing = || {
            ClaimError::Refused(format!(
                "nothing is reserved in {}: run `partition reserve` first",
                req.state_dir.display()
            ))
        };
        let lock = LedgerLock::exclusive_existing(req.state_dir)?.ok_or_else(nothing)?;
        // The launch timeline splits the claim: waiting for the ledger's lock, reading and
        // checking it, then (the `acquire` mark) writing it and opening the extent.
        crate::sys::timeline::mark("claim_lock");
        let mut l = lock.load()?.ok_or_else(nothing)?;
        let name = req.name;
        if let Some(p) = l.partition(name) {
            let how = if lock.partition_alive(name) {
                format!("running (pid {})", p.pid)
            } else {
                "dead: `partition release` it first".to_string()
            };
            return Err(ClaimError::Refused(format!(
                "a partition named {name:?} exists, {how}"
            )));
        }
        let mut free = l.allocator().map_err(|e| {
            ClaimError::Refused(format!("the ledger's extents are inconsistent: {e}"))
        })?;
        let extent = match req.offset {
            Some(o) => free.alloc_at(Extent {
                offset: o,
                len: req.size,
            }),
            None => free.alloc(req.size),
        }
        .map_err(|e| {
            ClaimError::Refused(format!(
                "--memory: the {} pool cannot give this partition {}: {e}",
                crate::config::size::format(l.pool.size),
                crate::config::size::format(req.size)
            ))
        })?;
        for c in req.cores {
            if !l.cores.reserved.contains(c) {
                return Err(ClaimError::Refused(format!(
                    "core {c} is not reserved (reserved: {})",
                    cores::format(&l.cores.reserved)
                )));
            }
            if let Some(owner) = l.partitions.iter().find(|p| p.cores.contains(c)) {
                return Err(ClaimError::Refused(format!(
                    "core {c} belongs to partition {:?}",
                    owner.name
                )));
            }
        }
        // A core whose host-wide claim names another reservation is not this one's to give
        // (only one reservation can claim a core; this catches a ledger that says otherwise).
        let ours = std::fs::canonicalize(lock.dir()).unwrap_or_else(|_| lock.dir().to_path_buf());
        for &c in req.cores {
            if let Some(by) = crate::host::coreclaims::core_holder(
                Path::new(crate::host::coreclaims::CORE_CLAIMS),
                c,
            ) {
                if by != ours {
                    return Err(ClaimError::Refused(format!(
                        "core {c} is claimed by the reservation in {}, not by this one ({})",
                        by.display(),
                        ours.display()
                    )));
                }
            }
        }
        // Held for as long as this launcher (and its keeper) live: how `status` and
        // `release` know it is alive. Someone still holding it (a keeper finishing the
        // previous partition of this name) refuses the launch.
        let plock = lock.lock_partition(name).map_err(|e| match e {
            LedgerError::Io { source, .. } if source.raw_os_error() == Some(libc::EWOULDBLOCK) => {
                ClaimError::Refused(format!(
                    "partition {name:?} is still being given back by its last launcher"
                ))
            }
            e => e.into(),
        })?;
        let pid = std::process::id();
        l.partitions.push(PartitionRecord {
            name: name.to_string(),
            pid,
            pid_start: ledger::pid_start_time(pid).unwrap_or(0),
            cores: req.cores.to_vec(),
            extent: extent.into(),
            idle: req.idle.into(),
            state: PartitionState::Launching,
            started_at: ledger::now(),
            kernel: req.kernel.to_string(),
            api_socket: req.api_socket.map(Path::to_path_buf),
        });
        crate::sys::timeline::mark("claim_check");
        lock.store(&l)?;
        crash_point("after-ledger");
        Ok(Self {
            state_dir: lock.dir().to_path_buf(),
            name: name.to_string(),
            ledger: l,
            extent,
            lock: Some(plock),
            done: false,
        })
    }

    /// The partition's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The descriptor of the partition's liveness lock (kept open by a forked keeper).
    pub fn lock_fd(&self) -> std::os::fd::RawFd {
        self.lock.as_ref().map_or(-1, PartitionLock::fd)
    }

    /// Hands the claim to a keeper process (`crate::host::keeper`), which now owns the giving
    /// back: this copy will do nothing when dropped, and its share of the partition lock is
    /// returned for the launcher to hold for its life.
    pub fn disarm(mut self) -> PartitionLock {
        self.done = true;
        match self.lock.take() {
            Some(l) => l,
            None => unreachable_lock(),
        }
    }

    /// The extent of the pool file, for the guest's memory to map.
    pub fn extent_file(&self) -> Result<ExtentFile, ClaimError> {
        let p = &self.ledger.pool;
        let m = PoolFile::open(&p.file, p.size, p.page_size).and_then(|f| f.extent(self.extent))?;
        crash_point("after-map");
        Ok(m)
    }

    /// Where the partition's vCPU threads go before they pin.
    pub fn isolation(&self) -> Isolation {
        self.ledger.cores.isolation.clone()
    }

    /// Records that the guest runs.
    pub fn running(&self) {
        if let Err(e) = set_state(&self.state_dir, &self.name, PartitionState::Running) {
            log::warn!("recording {} as running: {e}", self.name);
        }
    }

    /// Writes the vCPUs' counters where `partition status` reads them.
    pub fn record(&self, vcpus: Vec<VcpuCounters>) {
        write_stats(
            &self.state_dir,
            &self.name,
            &PartitionCounters {
                updated_at: ledger::now(),
                vcpus,
            },
        );
    }

    /// Gives the claim up without scrubbing: for an extent nothing has touched (its mapping
    /// failed).
    pub fn forget_unused(mut self) {
        self.done = true;
        if let Err(e) = forget(&self.state_dir, &self.name) {
            log::error!("removing {} from the ledger: {e}", self.name);
        }
    }

    /// The guest is gone (or never ran): scrub the extent, then free it and the cores. On
    /// a scrub failure the partition stays recorded for `partition release`.
    pub fn release(mut self) -> Result<Released, ClaimError> {
        self.done = true;
        self.finish()
    }

    fn finish(&self) -> Result<Released, ClaimError> {
        let _ = set_state(&self.state_dir, &self.name, PartitionState::Stopping);
        let scrub = match scrub(&self.ledger, self.extent) {
            Ok(t) => t,
            Err(e) => {
                log::error!(
                    "scrubbing {}'s memory failed ({e}); it stays recorded: run `partition release {}`",
                    self.name,
                    self.name
                );
                return Err(e.into());
            }
        };
        forget(&self.state_dir, &self.name)?;
        Ok(Released {
            name: self.name.clone(),
            offset: self.extent.offset,
            len: self.extent.len,
            scrub,
        })
    }
}

impl Drop for ExtentClaim {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.finish();
        }
    }
}

/// The claim always holds its lock until disarmed; a claim without one cannot exist.
fn unreachable_lock() -> PartitionLock {
    panic!("an extent claim without its partition lock")
}

const STATS: &str = "stats";

fn stats_name(name: &str) -> String {
    format!("{name}.json")
}

/// The counters the launcher of `name` last wrote, if any (bounded read).
pub(crate) fn read_stats(lock: &LedgerLock, name: &str) -> Option<PartitionCounters> {
    use std::io::Read;
    let dir = lock.state_dir().subdir(STATS, false).ok()??;
    let f = dir.read_file(&stats_name(name)).ok()??;
    let mut text = String::new();
    f.take(1 << 20).read_to_string(&mut text).ok()?;
    serde_json::from_str(&text).ok()
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
pub(crate) fn forget(state_dir: &Path, name: &str) -> Result<(), LedgerError> {
    let lock = LedgerLock::exclusive(state_dir)?;
    if let Some(mut l) = lock.load()? {
        l.partitions.retain(|p| p.name != name);
        lock.store(&l)?;
    }
    if let Ok(Some(d)) = lock.state_dir().subdir(STATS, false) {
        let _ = d.remove(&stats_name(name));
    }
    lock.remove_partition_lock(name);
    Ok(())
}

/// Zeroes `extent` of the pool through a fresh mapping; returns the time it took.
pub(crate) fn scrub(l: &Ledger, extent: Extent) -> Result<Duration, PoolFileError> {
    let pool = PoolFile::open(&l.pool.file, l.pool.size, l.pool.page_size)?;
    let mut m = pool.map(extent)?;
    Ok(m.scrub())
}

fn write_stats(state_dir: &Path, name: &str, s: &PartitionCounters) {
    let Ok(text) = serde_json::to_string(s) else {
        return;
    };
    let written = crate::sys::statedir::StateDir::open(state_dir, false)
        .and_then(|d| d.subdir(STATS, true))
        .and_then(|d| match d {
            Some(d) => d.replace(&stats_name(name), text.as_bytes()),
            None => Ok(()),
        });
    if let Err(e) = written {
        log::debug!("writing {name}'s counters: {e}");
    }
}
