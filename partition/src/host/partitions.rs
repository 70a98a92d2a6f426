//! Partitions from the reservation, seen from outside their launchers: `status` (who owns
//! what, and what a dead launcher left) and `release` (stop a launcher, or reclaim what a
//! dead one held; its extent is zeroed before it goes back). A launcher's own claim on the
//! reservation is [`crate::host::claim`].

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pool::poolfile::PoolFileError;
use serde::Serialize;

use crate::cpu::exits::PartitionCounters;
use crate::host::claim::{crash_point, forget, read_stats, scrub};
use crate::host::ledger::{self, ExtentRecord, LedgerError, LedgerLock, PartitionState};

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
    /// Something holds the partition's lock, and it is not the process the ledger
    /// recorded (so it was not signalled).
    #[error(
        "partition {name:?}: its lock is held, but not by pid {pid} as the ledger recorded it \
         (no signal was sent); find what holds {lock} and stop it"
    )]
    HeldByAnother {
        /// Name.
        name: String,
        /// The recorded pid.
        pid: u32,
        /// The lock file.
        lock: String,
    },
}

impl ReleaseError {
    /// Whether the request itself was wrong (the CLI exits with status 2).
    pub fn is_usage(&self) -> bool {
        match self {
            Self::NotFound(_) => true,
            Self::Ledger(e) => e.is_usage(),
            _ => false,
        }
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

/// Whether partition `name`'s lock is free (its launcher and keeper are gone).
fn gone(state_dir: &Path, name: &str) -> bool {
    LedgerLock::shared_existing(state_dir).is_ok_and(|l| l.is_none_or(|l| !l.partition_alive(name)))
}

fn wait_gone(state_dir: &Path, name: &str, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if gone(state_dir, name) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    gone(state_dir, name)
}

/// Stops partition `name` (SIGTERM, then SIGKILL after `grace`), or reclaims it if its
/// launcher is dead: scrub its extent, free its cores.
pub fn release(
    state_dir: &Path,
    name: &str,
    grace: Duration,
) -> Result<ReleaseReport, ReleaseError> {
    let (p, was_alive) = {
        let lock = LedgerLock::shared_existing(state_dir)?.ok_or_else(|| {
            ReleaseError::NotFound(format!("nothing is reserved in {}", state_dir.display()))
        })?;
        let l = lock.load()?.ok_or_else(|| {
            ReleaseError::NotFound(format!("nothing is reserved in {}", state_dir.display()))
        })?;
        let p = l.partition(name).cloned().ok_or_else(|| {
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
        })?;
        let alive = lock.partition_alive(name);
        (p, alive)
    };
    let mut signals = Vec::new();
    if was_alive {
        // Through a pidfd, and only to the process the ledger recorded.
        if ledger::signal_launcher(&p, libc::SIGTERM) {
            signals.push("SIGTERM");
        }
        if !wait_gone(state_dir, name, grace) {
            if ledger::signal_launcher(&p, libc::SIGKILL) {
                signals.push("SIGKILL");
            }
            if !wait_gone(state_dir, name, Duration::from_secs(10)) {
                if signals.contains(&"SIGKILL") {
                    return Err(ReleaseError::Unkillable {
                        name: name.to_string(),
                        pid: p.pid,
                    });
                }
                return Err(ReleaseError::HeldByAnother {
                    name: name.to_string(),
                    pid: p.pid,
                    lock: state_dir.join("locks").join(name).display().to_string(),
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

/// A dead partition [`reclaim_dead`] gave back.
#[derive(Clone, Debug, Serialize)]
pub struct Reclaimed {
    /// Its name.
    pub name: String,
    /// Its launcher's pid.
    pub pid: u32,
    /// What it was doing when its launcher and keeper were gone.
    pub state: PartitionState,
    /// Its memory, in bytes.
    pub bytes: u64,
    /// Its cores.
    pub cores: Vec<usize>,
    /// How long scrubbing its memory took, in milliseconds.
    pub scrub_ms: f64,
}

/// Gives back every partition whose launcher and keeper are both gone (nobody holds its
/// lock): its extent scrubbed, it and its cores freed, as `release` would. Nothing is
/// held because a process died, the keeper's own death included (killed, its launcher
/// notices and stops the guest; this gives back what it held). Needs root (the pool file
/// and the ledger are root's); `status` runs it first. A partition that cannot be
/// scrubbed stays recorded (`release` says why).
pub fn reclaim_dead(state_dir: &Path) -> Result<Vec<Reclaimed>, ReleaseError> {
    let (l, dead) = {
        let Some(lock) = LedgerLock::exclusive_existing(state_dir)? else {
            return Ok(Vec::new());
        };
        let Some(mut l) = lock.load()? else {
            return Ok(Vec::new());
        };
        let mut dead = Vec::new();
        for p in l.partitions.iter_mut() {
            if !lock.partition_alive(&p.name) {
                dead.push(p.clone());
                p.state = PartitionState::Releasing;
            }
        }
        if dead.is_empty() {
            return Ok(Vec::new());
        }
        lock.store(&l)?;
        (l, dead)
    };
    let mut out = Vec::new();
    for p in dead {
        let t = scrub(&l, p.extent.into())?;
        forget(state_dir, &p.name)?;
        out.push(Reclaimed {
            name: p.name,
            pid: p.pid,
            state: p.state,
            bytes: p.extent.len,
            cores: p.cores,
            scrub_ms: t.as_secs_f64() * 1e3,
        });
    }
    Ok(out)
}

/// The state directory as `status` shows it.
#[derive(Debug, Serialize)]
pub struct Status {
    /// State directory.
    pub state_dir: PathBuf,
    /// Whether anything is reserved.
    pub reserved: bool,
    /// With nothing reserved: a reserve that did not finish (killed part-way) left host
    /// resources taken and written down; the next `reserve` or `unreserve` gives them back.
    pub unfinished: bool,
    /// The pool.
    pub pool: Option<PoolStatus>,
    /// The cores.
    pub cores: Option<CoreStatus>,
    /// IRQ affinities changed by reserve.
    pub irqs_moved: usize,
    /// IRQs that may fire on a reserved core again since the reservation (irqbalance, a
    /// driver, an operator), with their affinity now; the ones the kernel would not let
    /// the reservation move are not listed.
    pub irqs_back: Vec<crate::host::isolation::IrqOnCore>,
    /// The irqbalance the reservation banned from its cores, if one ran then.
    pub irqbalance: Option<IrqbalanceStatus>,
    /// Partitions.
    pub partitions: Vec<PartitionStatus>,
    /// Dead partitions this `status` gave back before it looked (run as root).
    pub reclaimed: Vec<Reclaimed>,
}

/// The irqbalance part of [`Status`].
#[derive(Debug, Serialize)]
pub struct IrqbalanceStatus {
    /// Its pid.
    pub pid: u32,
    /// Whether that daemon still runs (one restarted since has forgotten the ban).
    pub alive: bool,
    /// The CPUs the reservation made it ban.
    pub banned: Vec<usize>,
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
    pub exits: Option<PartitionCounters>,
    /// What to do about it, for a dead one.
    pub note: Option<String>,
}

/// How long one partition's API may take to answer `status`.
const API_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// A running partition's counters, asked of its API, by `deadline` at the latest.
fn api_counters(socket: &Path, deadline: std::time::Instant) -> Option<PartitionCounters> {
    let by = deadline.min(std::time::Instant::now() + API_WAIT);
    match crate::sys::api_client::request_by(socket, "GET", "/counters", None, by) {
        Ok((200, v)) => serde_json::from_value(v).ok(),
        _ => None,
    }
}

/// Where a reservation's cores stand, from the ledger alone (no partition's API asked):
/// what `caps` reports the host's settings against.
#[derive(Debug, Default)]
pub struct Placement {
    /// The reserved cores (empty: nothing reserved).
    pub reserved: Vec<usize>,
    /// The idle policy of each live partition's cores, by core.
    pub in_force: Vec<(usize, String)>,
    /// The irqbalance the reservation banned, if one ran then.
    pub irqbalance: Option<IrqbalanceStatus>,
}

/// Reads [`Placement`] from the state directory (default when nothing is reserved).
pub fn placement(state_dir: &Path) -> Result<Placement, LedgerError> {
    let Some(lock) = LedgerLock::shared_existing(state_dir)? else {
        return Ok(Placement::default());
    };
    let Some(l) = lock.load()? else {
        return Ok(Placement::default());
    };
    Ok(Placement {
        reserved: l.cores.reserved.clone(),
        in_force: l
            .partitions
            .iter()
            .filter(|p| lock.partition_alive(&p.name))
            .flat_map(|p| p.cores.iter().map(|c| (*c, p.idle.clone())))
            .collect(),
        irqbalance: irqbalance_status(&l),
    })
}

fn irqbalance_status(l: &crate::host::ledger::Ledger) -> Option<IrqbalanceStatus> {
    l.irqbalance.as_ref().map(|r| IrqbalanceStatus {
        pid: r.pid,
        alive: crate::host::irqbalance::Daemon {
            pid: r.pid,
            start: r.pid_start,
        }
        .alive(),
        banned: r.banned.clone(),
    })
}

/// Reads the state directory; as root, after giving back what dead partitions held
/// ([`reclaim_dead`]: `reclaimed` lists them; one that could not be scrubbed is still
/// listed, dead, with why).
pub fn status(state_dir: &Path) -> Result<Status, LedgerError> {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let mut reclaim_failed = None;
    let reclaimed = if root {
        match reclaim_dead(state_dir) {
            Ok(r) => r,
            Err(ReleaseError::Ledger(e)) => return Err(e),
            Err(e) => {
                reclaim_failed = Some(e.to_string());
                Vec::new()
            }
        }
    } else {
        Vec::new()
    };
    let mut s = status_now(state_dir, reclaim_failed.as_deref())?;
    s.reclaimed = reclaimed;
    Ok(s)
}

/// The state directory as it is.
fn status_now(state_dir: &Path, reclaim_failed: Option<&str>) -> Result<Status, LedgerError> {
    let none = |unfinished| Status {
        state_dir: state_dir.to_path_buf(),
        reserved: false,
        unfinished,
        pool: None,
        cores: None,
        irqs_moved: 0,
        irqs_back: Vec::new(),
        irqbalance: None,
        partitions: Vec::new(),
        reclaimed: Vec::new(),
    };
    let Some(lock) = LedgerLock::shared_existing(state_dir)? else {
        return Ok(none(false));
    };
    let Some(l) = lock.load()? else {
        return Ok(none(lock.has_unfinished_reserve()));
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
    // Every API asked, together, answers within the client's deadline: a partition whose
    // API hangs costs `status` (which holds the ledger's lock meanwhile) that much at most.
    let deadline = std::time::Instant::now() + crate::sys::api_client::DEADLINE;
    let partitions = l
        .partitions
        .iter()
        .map(|p| {
            let alive = lock.partition_alive(&p.name);
            let exits = if alive {
                // From the partition's API where it serves one, else the file its keeper
                // writes.
                p.api_socket
                    .as_deref()
                    .and_then(|s| api_counters(s, deadline))
                    .or_else(|| read_stats(&lock, &p.name))
            } else {
                None
            };
            let note = (!alive).then(|| {
                let why = match reclaim_failed {
                    Some(e) => format!("giving them back failed: {e}; "),
                    None => String::new(),
                };
                format!(
                    "launcher pid {} is gone (it died while {}); {why}its cores and {} of memory \
                     are held until `partition status` as root or `partition release {}` scrubs \
                     and frees them",
                    p.pid,
                    match p.state {
                        PartitionState::Launching => "launching",
                        PartitionState::Running => "running",
                        PartitionState::Stopping => "scrubbing after the guest stopped",
                        PartitionState::Releasing => "being released",
                    },
                    crate::config::size::format(p.extent.len),
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
        unfinished: false,
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
            isolation: crate::host::reserve::describe_isolation(&l.cores.isolation),
        }),
        irqs_moved: l.irqs.len(),
        irqs_back: crate::host::isolation::irqs_on(
            Path::new("/proc/irq"),
            &l.cores.reserved,
            &l.irqs_left,
        ),
        irqbalance: irqbalance_status(&l),
        partitions,
        reclaimed: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use crate::host::claim::check_name;

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
