//! `reserve` and `unreserve`: take hugepages, a pool file and cores from the host once, and
//! give every bit of it back.
//!
//! Reserve is all or nothing: each step registers its undo, and a failure runs the undos in
//! reverse, so a failed reserve leaves the host as it found it. Running it again with the
//! same plan changes nothing.

use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pool::hugepages::{Counter, HugepageError};
use pool::hugetlbfs::{self, HugetlbfsError};
use pool::poolfile::{PoolFile, PoolFileError};

use crate::host::ledger::{
    CoreRecord, HugepagesAdded, IrqbalanceMode, IrqbalanceRecord, Isolation, Ledger, LedgerError,
    LedgerLock, PoolRecord, Unfinished, VERSION, now, own_mount,
};
use crate::host::plan::HostPlan;
use crate::host::{irqbalance, isolation};

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
    /// A core another state directory's reservation holds.
    #[error(
        "core {core} is reserved already, by the reservation in {} (one host, one \
         reservation per core: `partition unreserve --state-dir {}` first, or reserve other \
         cores)",
        by.display(),
        by.display()
    )]
    CoreTaken {
        /// The core.
        core: usize,
        /// The state directory whose ledger holds it.
        by: PathBuf,
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
            | Self::CoreTaken { .. }
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

/// Result of [`unreserve`].
#[derive(Debug, Default)]
pub struct UnreserveReport {
    /// Whether there was anything to give back.
    pub had_reservation: bool,
    /// Problems met while giving back (each is a thing left behind).
    pub warnings: Vec<String>,
}

/// Pool file name in the hugetlbfs mount.
fn pool_file_name(state_dir: &Path) -> String {
    format!("{}-pool", crate::host::ledger::state_tag(state_dir))
}

/// Where reservations claim their cores for the whole host, whatever state directory they
/// keep their ledger in: one file per core (`core-N`) naming the state directory that holds
/// it. Under /run, so a reboot (which ends every reservation) clears it.
pub const CORE_CLAIMS: &str = "/run/partition-cores";

/// Whether the ledger in `state_dir` reserves `core` (a claim naming a state directory
/// that no longer does is stale).
fn holds(state_dir: &Path, core: usize) -> bool {
    let Ok(bytes) = crate::sys::files::read_limited(&state_dir.join("ledger.json"), 1 << 20) else {
        return false;
    };
    serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| {
            v["cores"]["reserved"]
                .as_array()
                .map(|a| a.iter().any(|c| c.as_u64() == Some(core as u64)))
        })
        .unwrap_or(false)
}

/// The state directory whose reservation holds `core` host-wide, if any: the claim in
/// `claims` ([`CORE_CLAIMS`]) naming one whose ledger still reserves it (a stale claim names
/// nobody).
pub fn core_holder(claims: &Path, core: usize) -> Option<PathBuf> {
    let f = claims.join(format!("core-{core}"));
    let holder = crate::sys::files::read_limited(&f, 4096).ok()?;
    let by = PathBuf::from(std::ffi::OsString::from_vec(holder));
    holds(&by, core).then_some(by)
}

/// Environment variable naming a point at which `reserve` fails on purpose, once the
/// hugepages, the pool file, the cores and the IRQs are taken (`after-isolation`): how the
/// tests see every step rolled back. `kill-after-isolation` kills the process there
/// instead (SIGKILL: no undo runs), as a crash would: the next reserve or unreserve gives
/// back what it took, from its record. Only debug builds (the test builds)
/// have it.
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

/// The first of `cores` a live reservation holds host-wide (`claims`, normally
/// [`CORE_CLAIMS`]), and the state directory holding it.
pub fn claimed_by(claims: &Path, cores: &[usize]) -> Option<(usize, PathBuf)> {
    cores
        .iter()
        .find_map(|&c| core_holder(claims, c).map(|by| (c, by)))
}

/// Claims `cores` for `state_dir` host-wide ([`CORE_CLAIMS`]); what it created is given
/// back by `undo`. A core another live reservation holds is refused, naming it.
fn claim_cores(
    claims: &Path,
    cores: &[usize],
    state_dir: &Path,
    undo: &mut Undo,
) -> Result<(), ReserveError> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let io = |path: &Path, what| {
        let path = path.to_path_buf();
        move |source| ReserveError::Io { path, what, source }
    };
    match std::fs::DirBuilder::new().mode(0o700).create(claims) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io(claims, "mkdir")(e)),
    }
    let m = std::fs::symlink_metadata(claims).map_err(io(claims, "stat"))?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !m.is_dir() || m.uid() != me || m.mode() & 0o022 != 0 {
        return Err(io(claims, "trust")(std::io::Error::other(
            "not a directory this user owns and nobody else may write",
        )));
    }
    let ours = state_dir.as_os_str().as_encoded_bytes();
    for &core in cores {
        let f = claims.join(format!("core-{core}"));
        for _ in 0..2 {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&f)
            {
                Ok(mut file) => {
                    file.write_all(ours).map_err(io(&f, "write"))?;
                    let g = f.clone();
                    undo.push(move || {
                        let _ = std::fs::remove_file(g);
                    });
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let holder = std::fs::read(&f).map_err(io(&f, "read"))?;
                    if holder == ours {
                        break;
                    }
                    let by = PathBuf::from(std::ffi::OsString::from_vec(holder));
                    if holds(&by, core) {
                        return Err(ReserveError::CoreTaken { core, by });
                    }
                    // Stale: its reservation is gone.
                    std::fs::remove_file(&f).map_err(io(&f, "remove a stale claim"))?;
                }
                Err(e) => return Err(io(&f, "create")(e)),
            }
        }
    }
    Ok(())
}

/// The state directory as claims name it: its canonical path.
fn identity(lock: &LedgerLock) -> PathBuf {
    std::fs::canonicalize(lock.dir()).unwrap_or_else(|_| lock.dir().to_path_buf())
}

/// Gives back the host-wide claims of `cores` that `state_dir` holds.
fn release_cores(claims: &Path, cores: &[usize], state_dir: &Path) {
    let ours = state_dir.as_os_str().as_encoded_bytes();
    for core in cores {
        let f = claims.join(format!("core-{core}"));
        if std::fs::read(&f).is_ok_and(|h| h == ours) {
            let _ = std::fs::remove_file(&f);
        }
    }
    let _ = std::fs::remove_dir(claims);
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
    give_back_unfinished(lock);
    if let Some(old) = lock.load()? {
        if old.plan == plan.record() {
            // A reservation made before cores were claimed host-wide gets its claims now.
            let mut keep = Undo(Vec::new());
            let _ = claim_cores(
                Path::new(CORE_CLAIMS),
                &plan.cores,
                &identity(lock),
                &mut keep,
            );
            keep.forget();
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
        outcome = ReserveOutcome::Replaced;
    }

    let mut undo = Undo(Vec::new());
    let result = claim_cores(
        Path::new(CORE_CLAIMS),
        &plan.cores,
        &identity(lock),
        &mut undo,
    )
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
    taken.hugepages = Some(HugepagesAdded {
        before: counter.total()?,
        added: pages,
    });
    lock.store_unfinished(&taken)?;
    counter.grow(pages, plan.page_size)?;
    {
        let c = counter.clone();
        undo.push(move || {
            let _ = c.shrink(pages);
        });
    }

    // 2. A hugetlbfs mount for this page size: the host's, or our own.
    let (mount, mounted_by_us) = match hugetlbfs::find_mount(plan.page_size) {
        Some(m) => (m, false),
        None => {
            let dir = own_mount(&state_dir, plan.page_size);
            taken.mount = Some(dir.clone());
            lock.store_unfinished(&taken)?;
            std::fs::create_dir_all(&dir).map_err(|source| ReserveError::Io {
                path: dir.clone(),
                what: "mkdir",
                source,
            })?;
            if let Err(e) = hugetlbfs::mount(&dir, plan.page_size) {
                let _ = std::fs::remove_dir(&dir);
                return Err(e.into());
            }
            let d = dir.clone();
            undo.push(move || {
                let _ = remove_our_mount(&d);
            });
            (dir, true)
        }
    };

    // 3. The pool file, preallocated (the kernel zeroes hugepages it hands out).
    let file = mount.join(pool_file_name(&state_dir));
    taken.pool_file = Some(file.clone());
    lock.store_unfinished(&taken)?;
    let start = Instant::now();
    let _pool = with_node(plan.node, || {
        PoolFile::create(&file, plan.memory, plan.page_size, progress)
    })?;
    let prealloc = start.elapsed();
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
        let i = isolation.clone();
        undo.push(move || {
            let _ = isolation::restore(&i);
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
        let r = taken.irqs.clone();
        undo.push(move || {
            isolation::restore_irqs(&r);
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
            mount,
            mounted_by_us,
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

fn names(l: &Ledger) -> String {
    l.partitions
        .iter()
        .map(|p| p.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Gives back everything `l` records, best effort, and removes the ledger.
fn give_back(lock: &LedgerLock, l: &Ledger) -> UnreserveReport {
    let mut w = Vec::new();
    w.extend(remove_pool_file(&l.pool.file));
    if l.pool.mounted_by_us {
        w.extend(remove_our_mount(&l.pool.mount));
    }
    let counter = Counter::at(l.pool.hugepage_dir.clone());
    match counter.total().and_then(|before| {
        counter
            .shrink(l.pool.hugepages_added)
            .map(|after| (before, after))
    }) {
        Ok((before, after)) if before - after < l.pool.hugepages_added.min(before) => {
            w.push(format!(
                "only {} of {} hugepages could be given back (others are in use)",
                before - after,
                l.pool.hugepages_added
            ))
        }
        Ok(_) => {}
        Err(e) => w.push(e.to_string()),
    }
    if let Err(e) = isolation::restore(&l.cores.isolation) {
        w.push(e.to_string());
    }
    let n = isolation::restore_irqs(&l.irqs);
    if n > 0 {
        w.push(format!("{n} IRQ affinities could not be restored"));
    }
    if let Some(r) = &l.irqbalance {
        if let Err(e) = give_back_irqbalance(r) {
            w.push(e);
        }
    }
    release_cores(Path::new(CORE_CLAIMS), &l.cores.reserved, &identity(lock));
    if let Err(e) = lock.remove() {
        w.push(e.to_string());
    }
    let _ = lock.state_dir().remove_dir("stats");
    lock.remove_locks_dir();
    UnreserveReport {
        had_reservation: true,
        warnings: w,
    }
}

/// Removes the pool file `f` (already gone is fine); what went wrong, in words.
fn remove_pool_file(f: &Path) -> Option<String> {
    match std::fs::remove_file(f) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Some(format!("{}: {e}", f.display())),
        _ => None,
    }
}

/// Unmounts the hugetlbfs mount a reservation made and removes its directory: one rule
/// for the failed reserve's undo, `unreserve` and a killed reserve's give-back. A directory
/// that is not hugetlbfs (never mounted, or unmounted since) is only removed, if empty; one
/// whose mount cannot be unmounted is kept. Gone already is done.
fn remove_our_mount(dir: &Path) -> Option<String> {
    if hugetlbfs::is_hugetlbfs(dir) {
        if let Err(e) = hugetlbfs::umount(dir) {
            return Some(e.to_string());
        }
    }
    match std::fs::remove_dir(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Some(format!("{}: {e}", dir.display()))
        }
        _ => None,
    }
}

/// Gives irqbalance back the banned CPUs it had before the reservation, if the daemon that
/// took the ban still runs (one restarted since has forgotten it).
fn give_back_irqbalance(r: &IrqbalanceRecord) -> Result<(), String> {
    let d = irqbalance::Daemon {
        pid: r.pid,
        start: r.pid_start,
    };
    if !d.alive() {
        return Ok(());
    }
    d.ban(&r.banned_before).map_err(|e| e.to_string())
}

/// A reserve killed between narrowing others' cpusets and recording them in its ledger left
/// the list of them: widen them back (one the ledger records is left to `unreserve`).
fn widen_unrecorded(lock: &LedgerLock) {
    let n = lock.take_narrowing();
    if n.is_empty() {
        return;
    }
    let recorded = match lock.load() {
        Ok(Some(l)) => match l.cores.isolation {
            Isolation::CgroupV1 { narrowed, .. } | Isolation::CgroupV2 { narrowed, .. } => narrowed,
            Isolation::None { .. } => Vec::new(),
        },
        Ok(None) => {
            // No ledger: the cpusets that reserve made hold the cores exclusively, and
            // nothing may grow back over them while they exist.
            isolation::remove_unrecorded(&crate::host::ledger::state_tag(lock.dir()));
            Vec::new()
        }
        Err(_) => Vec::new(),
    };
    let left: Vec<_> = n.into_iter().filter(|c| !recorded.contains(c)).collect();
    if left.is_empty() {
        return;
    }
    log::warn!(
        "a reserve that did not finish had narrowed {} cpuset(s): widening them back",
        left.len()
    );
    for e in isolation::widen(&left) {
        log::warn!("{e}");
    }
}

/// A reserve killed part-way left what it had taken written down ([`Unfinished`]): gives
/// it back, best effort, and removes the record once done (a ledger beside it means the
/// reserve finished, and the ledger holds it all). Each part is written before its step
/// is taken, so each is given back only as far as it was taken: the pool file and our own
/// mount if they exist (on hugetlbfs only), the IRQs as they were, and of the hugepages
/// only those the counter holds beyond its count before.
fn give_back_unfinished(lock: &LedgerLock) {
    let Some(u) = lock.unfinished() else {
        return;
    };
    if matches!(lock.load(), Ok(Some(_))) {
        lock.clear_unfinished();
        return;
    }
    log::warn!("a reserve that did not finish had taken host resources: giving them back");
    if let Some(r) = &u.irqbalance {
        if let Err(e) = give_back_irqbalance(r) {
            log::warn!("irqbalance: {e}");
        }
    }
    let n = isolation::restore_irqs(&u.irqs);
    if n > 0 {
        log::warn!("{n} IRQ affinities could not be restored");
    }
    if let Some(f) = &u.pool_file {
        // Only on hugetlbfs (our mount or the host's): nothing else is removed.
        if !f.parent().is_some_and(hugetlbfs::is_hugetlbfs) {
            log::warn!("{}: not on hugetlbfs; left", f.display());
        } else if let Some(e) = remove_pool_file(f) {
            log::warn!("{e}");
        }
    }
    if let Some(e) = u.mount.as_deref().and_then(remove_our_mount) {
        log::warn!("{e}");
    }
    if let Some(h) = u.hugepages {
        let c = Counter::at(u.hugepage_dir());
        match c.total() {
            Ok(now) => {
                let ours = h.to_give_back(now);
                if ours > 0 {
                    if let Err(e) = c.shrink(ours) {
                        log::warn!("{e}");
                    }
                }
            }
            Err(e) => log::warn!("{e}"),
        }
    }
    lock.clear_unfinished();
}

/// Gives back everything reserve took. Refused while any partition (running or dead) is
/// recorded.
pub fn unreserve(state_dir: &Path) -> Result<UnreserveReport, ReserveError> {
    let Some(lock) = LedgerLock::exclusive_existing(state_dir)? else {
        return Ok(UnreserveReport::default());
    };
    widen_unrecorded(&lock);
    give_back_unfinished(&lock);
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
    fn our_mount_directory_is_removed_only_when_empty_and_gone_is_done() {
        let d = std::env::temp_dir().join(format!("our-mount-{}", std::process::id()));
        // Never mounted (a reserve killed between mkdir and mount): the directory goes.
        std::fs::create_dir_all(&d).unwrap();
        assert_eq!(remove_our_mount(&d), None);
        assert!(!d.exists());
        // Gone already.
        assert_eq!(remove_our_mount(&d), None);
        // Not hugetlbfs and not empty: nothing in it is touched, and the caller hears why.
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("kept"), b"x").unwrap();
        let w = remove_our_mount(&d).expect("a warning");
        assert!(w.contains(&d.display().to_string()), "{w}");
        assert!(d.join("kept").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn pool_file_names_differ_by_state_dir() {
        let a = pool_file_name(Path::new("/run/partition"));
        let b = pool_file_name(Path::new("/tmp/other"));
        assert_ne!(a, b);
        assert!(a.starts_with("partition-") && a.ends_with("-pool"));
        assert_eq!(a, pool_file_name(Path::new("/run/partition")));
    }

    #[test]
    fn a_core_is_claimed_by_one_reservation_on_the_host() {
        let d = std::env::temp_dir().join(format!("claims-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let (claims, a, b) = (d.join("claims"), d.join("a"), d.join("b"));
        for s in [&a, &b] {
            std::fs::create_dir_all(s).unwrap();
        }
        let ledger = |dir: &Path, cores: &str| {
            std::fs::write(
                dir.join("ledger.json"),
                format!(r#"{{"cores":{{"reserved":{cores}}}}}"#),
            )
            .unwrap()
        };
        let mut undo = Undo(Vec::new());
        claim_cores(&claims, &[1, 2], &a, &mut undo).unwrap();
        undo.forget();
        ledger(&a, "[1,2]");
        // B asks for core 2: refused, naming A.
        let mut undo = Undo(Vec::new());
        match claim_cores(&claims, &[3, 2], &b, &mut undo) {
            Err(ReserveError::CoreTaken { core, by }) => assert_eq!((core, by), (2, a.clone())),
            r => panic!("{r:?}"),
        }
        // What B had claimed before the refusal (core 3) is given back by its undo.
        undo.run();
        assert!(!claims.join("core-3").exists());
        // A again (the same plan) is fine; A's reservation gone from its ledger: stale.
        let mut undo = Undo(Vec::new());
        claim_cores(&claims, &[1, 2], &a, &mut undo).unwrap();
        ledger(&a, "[1]");
        let mut undo = Undo(Vec::new());
        claim_cores(&claims, &[2], &b, &mut undo).unwrap();
        assert_eq!(
            std::fs::read(claims.join("core-2")).unwrap(),
            b.as_os_str().as_encoded_bytes()
        );
        undo.forget();
        // Who holds what, as an ad hoc launch asks: B core 2, A core 1, nobody core 3; and a
        // launch outside the reservation on a held core is refused naming the holder.
        // (B's ledger not yet written: its claim names nobody.)
        assert_eq!(core_holder(&claims, 2), None);
        ledger(&b, "[2]");
        assert_eq!(core_holder(&claims, 2), Some(b.clone()));
        assert_eq!(core_holder(&claims, 1), Some(a.clone()));
        assert_eq!(core_holder(&claims, 3), None);
        assert_eq!(claimed_by(&claims, &[3, 1]), Some((1, a.clone())));
        assert_eq!(claimed_by(&claims, &[3]), None);
        // Released by their holders only.
        release_cores(&claims, &[1, 2], &b);
        assert!(claims.join("core-1").exists() && !claims.join("core-2").exists());
        release_cores(&claims, &[1], &a);
        assert!(!claims.exists());
        std::fs::remove_dir_all(&d).unwrap();
    }

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
