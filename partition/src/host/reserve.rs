//! `reserve` and `unreserve`: take hugepages, a pool file and cores from the host once, and
//! give every bit of it back.
//!
//! Reserve is all or nothing: each step registers its undo, and a failure runs the undos in
//! reverse, so a failed reserve leaves the host as it found it. Running it again with the
//! same plan changes nothing.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pool::hugepages::{Counter, HugepageError};
use pool::hugetlbfs::{self, HugetlbfsError};
use pool::poolfile::{PoolFile, PoolFileError};

use crate::host::coreclaims::{self, CORE_CLAIMS, ClaimsError};
use crate::host::giveback::{
    give_back, give_back_irqbalance, give_back_unfinished, pool_file_name, remove_our_mount,
    widen_unrecorded,
};
use crate::host::ledger::{
    CoreRecord, HugepagesAdded, IrqbalanceMode, IrqbalanceRecord, Isolation, Ledger, LedgerError,
    LedgerLock, PoolRecord, Unfinished, VERSION, now, own_mount,
};
use crate::host::plan::HostPlan;
use crate::host::{irqbalance, isolation};

pub use crate::host::giveback::UnreserveReport;

/// Errors reserving or unreserving.
#[derive(Debug, thiserror::Error)]
pub enum ReserveError {
    /// The ledger could not be read or written.
    #[error("{0}")]
    Ledger(#[from] LedgerError),
    /// Hugepages could not be had.
    #[error("{0}")]
    Hugepages(#[from] HugepageError),
    /// hugetlbfs could not be mounted.
    #[error("{0}")]
    Hugetlbfs(#[from] HugetlbfsError),
    /// The pool file could not be made.
    #[error("{0}")]
    PoolFile(#[from] PoolFileError),
    /// Partitions exist: the reservation cannot change under them.
    #[error("partitions exist ({names}): release them first{hint}")]
    Busy {
        /// Their names.
        names: String,
        /// What the caller was trying to do.
        hint: String,
    },
    /// A core another reservation holds, or the host-wide claims could not be written.
    #[error("{0}")]
    Claims(#[from] ClaimsError),
    /// What a reserve that did not finish took could not all be given back: a new one is
    /// not made over it.
    #[error(
        "an earlier reserve in this state directory did not finish, and what it took could \
         not all be given back (left: {0}); see the warnings above, then run `partition \
         unreserve` again"
    )]
    Leftover(String),
    /// Our own hugetlbfs mount could not be made, or is not what it must be.
    #[error("{path}: {why}")]
    OurMount {
        /// The mount point in the state directory.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// The reserved cores cannot be kept from the host's other cgroups (and the plan did
    /// not accept shared cores).
    #[error("{0}")]
    Isolation(#[from] isolation::IsolationError),
    /// The host cannot give the pool without leaving itself too little memory.
    #[error("--memory: {0}")]
    HostMemory(String),
    /// A running irqbalance could not be told to keep off the reserved cores.
    #[error(
        "{0}; it would move IRQs back onto the reserved cores within its interval: stop it, \
         ban the cores in its configuration (IRQBALANCE_BANNED_CPULIST), or reserve with \
         --irqbalance ignore to accept that"
    )]
    Irqbalance(#[from] irqbalance::IrqbalanceError),
    /// A filesystem operation failed.
    #[error("{path}: {what}: {source}")]
    Io {
        /// Path.
        path: PathBuf,
        /// Operation.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
}

impl ReserveError {
    /// Whether the request itself was refused (the CLI exits with status 2).
    pub fn is_usage(&self) -> bool {
        match self {
            Self::Busy { .. }
            | Self::Claims(ClaimsError::CoreTaken { .. })
            | Self::HostMemory(_)
            | Self::Irqbalance(_) => true,
            // The host's cgroups refused (named); an error writing our own record is not
            // the request's fault.
            Self::Isolation(e) => !matches!(e, isolation::IsolationError::Record(_)),
            Self::Ledger(e) => e.is_usage(),
            _ => false,
        }
    }
}

/// What reserve did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReserveOutcome {
    /// A new reservation.
    Created,
    /// The same plan was already reserved; nothing changed.
    Unchanged,
    /// A different plan was reserved (and no partition ran): it was given back first.
    Replaced,
}

/// Result of [`reserve`].
#[derive(Debug)]
pub struct ReserveReport {
    /// What happened.
    pub outcome: ReserveOutcome,
    /// The ledger now.
    pub ledger: Ledger,
    /// Time spent preallocating the pool.
    pub prealloc: Duration,
    /// IRQs that refused to move.
    pub irqs_refused: usize,
    /// Kernel command-line parameters the running kernel lacks.
    pub cmdline_advice: Option<String>,
}

/// Environment variable naming a point at which `reserve` fails on purpose: once the
/// hugepages and the pool file are taken (`after-pool`), or those and the cores and the
/// IRQs (`after-isolation`): how the tests see every step rolled back. `kill-` before
/// either kills the process there instead (SIGKILL: no undo runs), as a crash would: the
/// next reserve or unreserve gives back what it took, from its record. Only debug builds
/// (the test builds) have it.
pub const FAIL_ENV: &str = "PARTITION_TEST_RESERVE_FAIL_AT";

#[cfg(debug_assertions)]
fn fail_point(name: &str) -> Result<(), ReserveError> {
    let at = std::env::var(FAIL_ENV).unwrap_or_default();
    if at.strip_prefix("kill-") == Some(name) {
        eprintln!("partition: {FAIL_ENV}={at}: killing this reserve");
        let me = std::process::id() as libc::pid_t;
        // SAFETY: kill on our own pid; no pointers.
        unsafe { libc::kill(me, libc::SIGKILL) };
    }
    if at == name {
        return Err(ReserveError::Io {
            path: PathBuf::from(FAIL_ENV),
            what: "failing on purpose",
            source: std::io::Error::other(format!("{FAIL_ENV}={name}")),
        });
    }
    Ok(())
}

#[cfg(not(debug_assertions))]
fn fail_point(_: &str) -> Result<(), ReserveError> {
    Ok(())
}

/// Undo actions registered by completed steps.
struct Undo(Vec<Box<dyn FnOnce()>>);

impl Undo {
    fn push(&mut self, f: impl FnOnce() + 'static) {
        self.0.push(Box::new(f));
    }
    fn run(mut self) {
        while let Some(f) = self.0.pop() {
            f();
        }
    }
    fn forget(mut self) {
        self.0.clear();
    }
}

/// Reserves `plan` in `state_dir`. `progress(done, total)` reports preallocation.
pub fn reserve(
    plan: &HostPlan,
    state_dir: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ReserveReport, ReserveError> {
    // The deepest directory of the path that exists now: a refused reserve takes away
    // whatever it made below it.
    let kept = state_dir
        .ancestors()
        .find(|a| std::fs::symlink_metadata(a).is_ok())
        .unwrap_or(Path::new("/"))
        .to_path_buf();
    let lock = LedgerLock::exclusive(state_dir)?;
    let r = reserve_locked(plan, &lock, progress);
    if r.is_err() && matches!(lock.load(), Ok(None)) {
        lock.discard(&kept);
    }
    r
}

fn reserve_locked(
    plan: &HostPlan,
    lock: &LedgerLock,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ReserveReport, ReserveError> {
    let mut outcome = ReserveOutcome::Created;
    widen_unrecorded(lock);
    if !give_back_unfinished(lock) {
        return Err(ReserveError::Leftover(leftover(lock)));
    }
    if let Some(old) = lock.load()? {
        if old.plan == plan.record() {
            // A reservation made before cores were claimed host-wide gets its claims now.
            let _ = coreclaims::claim_cores(
                Path::new(CORE_CLAIMS),
                &plan.cores,
                &coreclaims::identity(lock),
                &mut Vec::new(),
            );
            return Ok(ReserveReport {
                outcome: ReserveOutcome::Unchanged,
                ledger: old,
                prealloc: Duration::ZERO,
                irqs_refused: 0,
                cmdline_advice: None,
            });
        }
        if !old.partitions.is_empty() {
            return Err(ReserveError::Busy {
                names: names(&old),
                hint: "; a different plan cannot replace a reservation partitions run on".into(),
            });
        }
        let r = give_back(lock, &old);
        if !r.warnings.is_empty() {
            log::warn!("replacing the reservation: {}", r.warnings.join("; "));
        }
        if lock.unfinished().is_some() {
            return Err(ReserveError::Leftover(leftover(lock)));
        }
        outcome = ReserveOutcome::Replaced;
    }

    let mut undo = Undo(Vec::new());
    let mut claimed = Vec::new();
    let claims = coreclaims::claim_cores(
        Path::new(CORE_CLAIMS),
        &plan.cores,
        &coreclaims::identity(lock),
        &mut claimed,
    );
    for f in claimed {
        undo.push(move || {
            let _ = std::fs::remove_file(f);
        });
    }
    let result = claims
        .map_err(ReserveError::from)
        .and_then(|()| build(plan, lock, &mut undo, progress));
    match result {
        Ok((ledger, prealloc, irqs_refused)) => {
            undo.forget();
            let pages = plan.memory / plan.page_size;
            let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
            Ok(ReserveReport {
                outcome,
                cmdline_advice: isolation::cmdline_advice(
                    &cmdline,
                    &plan.cores,
                    plan.page_size,
                    pages,
                ),
                ledger,
                prealloc,
                irqs_refused,
            })
        }
        Err(e) => {
            // The undos gave back what was taken and widened what was narrowed: their
            // records go too.
            undo.run();
            lock.clear_narrowing();
            lock.clear_unfinished();
            Err(e)
        }
    }
}

/// Why a pool of `bytes` would leave the host too little memory, given `/proc/meminfo`
/// (None: it fits, or the host does not say). The host keeps at least 256 MiB or a
/// twentieth of its memory, whichever is more, of what it has available now; hugepages are
/// never swapped or reclaimed, so a pool that takes the rest starves the host for as long
/// as it is reserved.
fn too_much(bytes: u64, meminfo: &str) -> Option<String> {
    use crate::config::size::format;
    let kb = |k: &str| {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .map(|v| v * 1024)
    };
    let (available, total) = (kb("MemAvailable")?, kb("MemTotal")?);
    let keep = (256 << 20).max(total / 20);
    let room = available.saturating_sub(keep);
    (bytes > room).then(|| {
        format!(
            "a {} pool is more than this host can spare: {} available now, of which it keeps \
             {} for itself (a reserved pool is never reclaimed); reserve at most {}",
            format(bytes),
            format(available),
            format(keep),
            format(room)
        )
    })
}

fn build(
    plan: &HostPlan,
    lock: &LedgerLock,
    undo: &mut Undo,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(Ledger, Duration, usize), ReserveError> {
    let state_dir = lock.dir().to_path_buf();
    // 0. A running irqbalance must answer before anything is taken (it is banned in 4).
    let balancer = match (plan.irqbalance, irqbalance::running()) {
        (IrqbalanceMode::Ban, Some(d)) => Some((d, d.setup()?.banned)),
        _ => None,
    };
    // 1. Hugepages, checked against what the host can spare first and what the kernel
    // delivered after.
    let pages = plan.memory / plan.page_size;
    if let Some(why) = too_much(
        plan.memory,
        &std::fs::read_to_string("/proc/meminfo").unwrap_or_default(),
    ) {
        return Err(ReserveError::HostMemory(why));
    }
    // What each step takes is written down before the step (`Unfinished`): a reserve
    // killed part-way leaves it for the next reserve or unreserve to give back.
    let mut taken = Unfinished {
        page_size: plan.page_size,
        node: plan.node,
        ..Unfinished::default()
    };
    let counter = Counter::new(plan.page_size, plan.node)?;
    // The counter's host-wide lock, from adding the pages until the pool file holds them: a
    // give-back elsewhere meanwhile must not take them for pages nobody holds. The undo
    // takes it itself when this step no longer holds it.
    let held = std::rc::Rc::new(std::cell::RefCell::new(Some(counter.lock()?)));
    taken.hugepages = Some(HugepagesAdded {
        before: counter.total()?,
        added: pages,
    });
    lock.store_unfinished(&taken)?;
    counter.grow(pages, plan.page_size)?;
    {
        let (c, held) = (counter.clone(), held.clone());
        undo.push(move || {
            let _lock = match held.borrow().is_some() {
                true => None,
                false => c.lock().ok(),
            };
            let _ = c.give_back(pages);
        });
    }

    // 2. A hugetlbfs mount of our own in the state directory, private (mode 0700, ours):
    // never one someone else made (a world-writable one would let a user plant or map the
    // pool file) and never another reservation's (each has its own).
    let dir = own_mount(&state_dir, plan.page_size);
    taken.mount = Some(dir.clone());
    lock.store_unfinished(&taken)?;
    let mount = make_our_mount(&dir, plan.page_size)?;
    {
        let (d, ours) = (dir.clone(), pool_file_name(&state_dir));
        undo.push(move || {
            let _ = remove_our_mount(&d, &ours);
        });
    }

    // 3. The pool file, made with O_EXCL in that mount's held descriptor, checked (ours,
    // mode 0600, one name) and preallocated (the kernel zeroes hugepages it hands out).
    let name = pool_file_name(&state_dir);
    let file = dir.join(&name);
    taken.pool_file = Some(file.clone());
    lock.store_unfinished(&taken)?;
    let start = Instant::now();
    let _pool = with_node(plan.node, || {
        PoolFile::create_in(
            &mount,
            &dir,
            std::ffi::OsStr::new(&name),
            plan.memory,
            plan.page_size,
            progress,
        )
    })?;
    let prealloc = start.elapsed();
    held.borrow_mut().take();
    fail_point("after-pool")?;
    {
        let f = file.clone();
        undo.push(move || {
            let _ = std::fs::remove_file(&f);
        });
    }

    // 4. Cores and IRQs. The others' cpusets about to be narrowed are written down first,
    // and the record goes once the ledger holds them.
    let isolation = isolation::isolate(
        &plan.cores,
        &plan.housekeeping,
        &crate::host::ledger::state_tag(&state_dir),
        plan.isolation,
        &mut |n| lock.store_narrowing(n).map_err(|e| e.to_string()),
    );
    let isolation = match isolation {
        Ok(i) => i,
        Err(e) => {
            lock.clear_narrowing();
            return Err(e.into());
        }
    };
    {
        let (i, dir) = (isolation.clone(), state_dir.clone());
        undo.push(move || {
            let _ = isolation::restore(&i, &held_by_others(&dir));
        });
    }
    // irqbalance first, so its next round cannot put back what the next step moves.
    let irqbalance = match balancer {
        Some((d, before)) => {
            let mut banned = before.clone();
            banned.extend(plan.cores.iter().filter(|c| !before.contains(c)));
            banned.sort_unstable();
            let r = IrqbalanceRecord {
                pid: d.pid,
                pid_start: d.start,
                banned_before: before,
                banned,
            };
            {
                let r = r.clone();
                undo.push(move || {
                    let _ = give_back_irqbalance(&r);
                });
            }
            taken.irqbalance = Some(r.clone());
            lock.store_unfinished(&taken)?;
            d.ban_and_wait(&r.banned)?;
            Some(r)
        }
        None => None,
    };
    taken.irqs = isolation::irqs_to_move(&plan.cores);
    lock.store_unfinished(&taken)?;
    {
        // Put back as written down: a move the kernel refused is put back as it was.
        let (r, dir) = (taken.irqs.clone(), state_dir.clone());
        undo.push(move || {
            isolation::restore_irqs(&r, &held_by_others(&dir));
        });
    }
    let (irqs, irqs_left) = isolation::point_irqs(&taken.irqs, &plan.housekeeping);
    let irqs_refused = irqs_left.len();
    fail_point("after-isolation")?;

    let mut reserved = plan.cores.clone();
    reserved.sort_unstable();
    let ledger = Ledger {
        version: VERSION,
        reserved_at: now(),
        plan: plan.record(),
        pool: PoolRecord {
            file,
            size: plan.memory,
            page_size: plan.page_size,
            hugepage_dir: counter.dir().to_path_buf(),
            hugepages_added: pages,
            mount: dir,
            mounted_by_us: true,
        },
        cores: CoreRecord {
            reserved,
            housekeeping: plan.housekeeping.clone(),
            isolation,
        },
        irqs,
        irqs_left,
        irqbalance,
        partitions: Vec::new(),
    };
    lock.store(&ledger)?;
    lock.clear_narrowing();
    lock.clear_unfinished();
    Ok((ledger, prealloc, irqs_refused))
}

/// Makes the reservation's own hugetlbfs mount at `dir` (in the state directory) for
/// `page`-sized pages and returns its directory, opened and checked: hugetlbfs of that page
/// size, ours, mode 0700. A mount already there (one a killed reserve left that could not
/// be given back) or a directory holding anything is refused, never used.
fn make_our_mount(dir: &Path, page: u64) -> Result<std::fs::File, ReserveError> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::DirBuilderExt;
    let refuse = |why: String| ReserveError::OurMount {
        path: dir.to_path_buf(),
        why,
    };
    if hugetlbfs::is_hugetlbfs(dir) {
        return Err(refuse(
            "a hugetlbfs mount is already there (left by an earlier reserve): not reused".into(),
        ));
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let any = std::fs::read_dir(dir)
                .map_err(|e| refuse(format!("read: {e}")))?
                .next()
                .is_some();
            if any {
                return Err(refuse("not empty: not mounted over".into()));
            }
        }
        Err(e) => return Err(refuse(format!("mkdir: {e}"))),
    }
    if let Err(e) = hugetlbfs::mount(dir, page) {
        let _ = std::fs::remove_dir(dir);
        return Err(e.into());
    }
    let checked = hugetlbfs::open_dir(dir)
        .map_err(|e| refuse(format!("open: {e}")))
        .and_then(|d| match hugetlbfs::not_private(&d) {
            Some(why) => Err(refuse(why)),
            None if hugetlbfs::page_size_fd(d.as_raw_fd()) != Some(page) => {
                Err(refuse(format!("not a mount of {} KiB pages", page >> 10)))
            }
            None => Ok(d),
        });
    if checked.is_err() {
        let _ = remove_our_mount(dir, "");
    }
    checked
}

/// Runs `f` with memory allocation bound to `node`, when one is given.
fn with_node<T>(node: Option<u32>, f: impl FnOnce() -> T) -> T {
    const MPOL_DEFAULT: i64 = 0;
    const MPOL_BIND: i64 = 2;
    let Some(n) = node.filter(|n| *n < 64) else {
        return f();
    };
    let mask: u64 = 1 << n;
    // SAFETY: set_mempolicy reads `mask` (one word, maxnode 64) for the calling thread.
    let bound = unsafe {
        libc::syscall(
            libc::SYS_set_mempolicy,
            MPOL_BIND,
            &mask as *const u64,
            64u64,
        )
    } == 0;
    if !bound {
        log::warn!("could not bind allocations to NUMA node {n}; using any node");
    }
    let r = f();
    if bound {
        // SAFETY: resets the calling thread's policy; no pointers.
        unsafe {
            libc::syscall(
                libc::SYS_set_mempolicy,
                MPOL_DEFAULT,
                std::ptr::null::<u64>(),
                0u64,
            )
        };
    }
    r
}

/// The cores other live reservations hold, seen from the reservation in `state_dir`.
fn held_by_others(state_dir: &Path) -> Vec<usize> {
    let us = std::fs::canonicalize(state_dir).unwrap_or_else(|_| state_dir.to_path_buf());
    coreclaims::held_by_others(Path::new(CORE_CLAIMS), &us)
}

/// What an unfinished reserve's record still names, in words.
fn leftover(lock: &LedgerLock) -> String {
    let Some(u) = lock.unfinished() else {
        return "nothing now".into();
    };
    let mut parts: Vec<String> = Vec::new();
    parts.extend(u.mount.map(|m| format!("the mount {}", m.display())));
    parts.extend(
        u.pool_file
            .map(|f| format!("the pool file {}", f.display())),
    );
    if !u.irqs.is_empty() {
        parts.push(format!("{} IRQ affinities", u.irqs.len()));
    }
    if u.irqbalance.is_some() {
        parts.push("irqbalance's ban".into());
    }
    parts.join(", ")
}

fn names(l: &Ledger) -> String {
    l.partitions
        .iter()
        .map(|p| p.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Gives back everything reserve took. Refused while any partition (running or dead) is
/// recorded.
pub fn unreserve(state_dir: &Path) -> Result<UnreserveReport, ReserveError> {
    let Some(lock) = LedgerLock::exclusive_existing(state_dir)? else {
        return Ok(UnreserveReport::default());
    };
    widen_unrecorded(&lock);
    if !give_back_unfinished(&lock) && lock.load()?.is_none() {
        return Ok(UnreserveReport {
            had_reservation: true,
            warnings: vec![format!(
                "an earlier reserve did not finish and {} could not be given back yet \
                 (`partition status` shows it; run `partition unreserve` again)",
                leftover(&lock)
            )],
        });
    }
    let Some(l) = lock.load()? else {
        return Ok(UnreserveReport::default());
    };
    if !l.partitions.is_empty() {
        return Err(ReserveError::Busy {
            names: names(&l),
            hint: " (partition release NAME)".into(),
        });
    }
    Ok(give_back(&lock, &l))
}

/// Describes an isolation record for people.
pub fn describe_isolation(i: &Isolation) -> String {
    match i {
        Isolation::None { reason } => format!("none ({reason})"),
        Isolation::CgroupV1 {
            housekeeping,
            guests,
            moved,
            unmovable,
            narrowed,
            ..
        } => format!(
            "cgroup v1 cpusets: {moved} tasks moved to {}, vCPUs join {} ({unmovable} per-CPU kernel threads stay){}",
            housekeeping.display(),
            guests.display(),
            describe_narrowed(narrowed)
        ),
        Isolation::CgroupV2 { path, narrowed } => format!(
            "cgroup v2 isolated partition {}{}",
            path.display(),
            describe_narrowed(narrowed)
        ),
    }
}

fn describe_narrowed(narrowed: &[crate::host::ledger::NarrowedCpuset]) -> String {
    if narrowed.is_empty() {
        return "; no other cpuset held the cores".into();
    }
    let each: Vec<String> = narrowed
        .iter()
        .map(|n| format!("{} {} -> {}", n.path.display(), n.cpus, n.narrowed_to))
        .collect();
    format!(
        "; other cpusets narrowed off the cores: {}",
        each.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_that_would_starve_the_host_is_refused() {
        let info = "MemTotal:       24000000 kB\nMemFree:        23000000 kB\nMemAvailable:   20000000 kB\n";
        // The host keeps a twentieth of 24 GB (1.2 GB) of the 20 GB available.
        assert_eq!(too_much(8 << 30, info), None);
        let why = too_much(19 << 30, info).unwrap();
        assert!(why.contains("more than this host can spare"), "{why}");
        // A small host keeps at least 256 MiB.
        let small = "MemTotal: 1000000 kB\nMemAvailable: 600000 kB\n";
        assert_eq!(too_much(256 << 20, small), None);
        assert!(too_much(400 << 20, small).is_some());
        // A host that does not say is not refused.
        assert_eq!(too_much(1 << 40, ""), None);
    }

    #[test]
    fn undo_runs_in_reverse_and_forget_drops() {
        use std::cell::RefCell;
        use std::rc::Rc;
        let log = Rc::new(RefCell::new(Vec::new()));
        let mut u = Undo(Vec::new());
        for i in 0..3 {
            let l = log.clone();
            u.push(move || l.borrow_mut().push(i));
        }
        u.run();
        assert_eq!(*log.borrow(), vec![2, 1, 0]);
        let mut u = Undo(Vec::new());
        let l = log.clone();
        u.push(move || l.borrow_mut().push(9));
        u.forget();
        assert_eq!(log.borrow().len(), 3);
    }
}
