//! Giving back what a reservation took: the whole of it (`unreserve`, or a reserve
//! replacing another plan), or what a reserve killed part-way had written down.
//!
//! One rule for every give-back: it touches only what this reservation took and what is
//! still its own. Its pool file and mount are its state directory's own (a reserve never
//! adopts another's mount, and a mount holding anything but our pool file is never
//! unmounted); of the hugepages it added, only pages nobody holds go back (a count beyond
//! that, a forged or stale record's, would turn another reservation's pages into
//! surplus); IRQ affinities and cpusets go back less the cores other live reservations
//! hold ([`coreclaims::held_by_others`]). What cannot be given back now is written down
//! again (`unfinished.json`), so the next `reserve` or `unreserve` tries again, and
//! `status` says so.

use std::path::Path;

use pool::hugepages::Counter;
use pool::hugetlbfs;

use crate::host::coreclaims::{self, CORE_CLAIMS};
use crate::host::ledger::{IrqbalanceRecord, Isolation, Ledger, LedgerLock, Unfinished};
use crate::host::{irqbalance, isolation};

/// Result of a give-back.
#[derive(Debug, Default)]
pub struct UnreserveReport {
    /// Whether there was anything to give back.
    pub had_reservation: bool,
    /// Problems met while giving back (each is a thing left behind).
    pub warnings: Vec<String>,
}

/// Pool file name in the reservation's hugetlbfs mount.
pub fn pool_file_name(state_dir: &Path) -> String {
    format!("{}-pool", crate::host::ledger::state_tag(state_dir))
}

/// The cores other live reservations hold: what a give-back of the reservation in `lock`
/// keeps IRQs and cpusets off.
fn keep_off(lock: &LedgerLock) -> Vec<usize> {
    coreclaims::held_by_others(Path::new(CORE_CLAIMS), &coreclaims::identity(lock))
}

/// Whether `u` names nothing left to give back. Only the pool file and our mount are kept
/// for another try: hugepages are given back as far as they can be and then forgotten (a
/// page someone holds is not provably ours), and an IRQ the kernel will not move or an
/// irqbalance that will not listen is said once, not tried forever.
fn nothing_left(u: &Unfinished) -> bool {
    u.pool_file.is_none() && u.mount.is_none()
}

/// Hands back to the kernel up to `want(total now)` pages of `counter` that nobody holds,
/// under the counter's host-wide lock; a warning if fewer went.
fn give_back_pages(counter: &Counter, want: impl FnOnce(u64) -> u64) -> Option<String> {
    let _held = counter.lock();
    let want = match counter.total() {
        Ok(now) => want(now),
        Err(e) => return Some(e.to_string()),
    };
    if want == 0 {
        return None;
    }
    match counter.give_back(want) {
        Ok(n) if n < want => Some(format!(
            "only {n} of {want} hugepages could be given back (the others are in use: not \
             this reservation's to take)"
        )),
        Ok(_) => None,
        Err(e) => Some(e.to_string()),
    }
}

/// Gives back everything `l` records, best effort, and removes the ledger. What could not
/// be given back (the pool file, our mount, IRQ affinities) is written down as unfinished
/// for the next `reserve` or `unreserve`.
pub fn give_back(lock: &LedgerLock, l: &Ledger) -> UnreserveReport {
    let keep_off = keep_off(lock);
    let mut w = Vec::new();
    let mut left = Unfinished {
        page_size: l.pool.page_size,
        node: l.plan.node,
        ..Unfinished::default()
    };
    let name = pool_file_name(lock.dir());
    if let Some(e) = remove_pool_file(&l.pool.file) {
        w.push(e);
        left.pool_file = l.pool.mounted_by_us.then(|| l.pool.file.clone());
    }
    if l.pool.mounted_by_us {
        if let Some(e) = remove_our_mount(&l.pool.mount, &name) {
            w.push(e);
            left.mount = Some(l.pool.mount.clone());
        }
    }
    w.extend(give_back_pages(
        &Counter::at(l.pool.hugepage_dir.clone()),
        |_| l.pool.hugepages_added,
    ));
    if let Err(e) = isolation::restore(&l.cores.isolation, &keep_off) {
        w.push(e.to_string());
    }
    let irqs = isolation::restore_irqs(&l.irqs, &keep_off);
    if !irqs.is_empty() {
        w.push(format!(
            "{} IRQ affinities could not be restored",
            irqs.len()
        ));
    }
    if let Some(r) = &l.irqbalance {
        if let Err(e) = give_back_irqbalance(r) {
            w.push(e);
        }
    }
    coreclaims::release_cores(
        Path::new(CORE_CLAIMS),
        &l.cores.reserved,
        &coreclaims::identity(lock),
    );
    if let Err(e) = lock.remove() {
        w.push(e.to_string());
    }
    if !nothing_left(&left) {
        match lock.store_unfinished(&left) {
            Ok(()) => w.push(
                "what was left is written down: the next `partition reserve` or `partition \
                 unreserve` tries again"
                    .into(),
            ),
            Err(e) => w.push(e.to_string()),
        }
    }
    let _ = lock.state_dir().remove_dir("stats");
    lock.remove_locks_dir();
    UnreserveReport {
        had_reservation: true,
        warnings: w,
    }
}

/// Removes the pool file `f` (already gone is fine); what went wrong, in words.
pub fn remove_pool_file(f: &Path) -> Option<String> {
    match std::fs::remove_file(f) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Some(format!("{}: {e}", f.display())),
        _ => None,
    }
}

/// Unmounts the hugetlbfs mount a reservation made and removes its directory: one rule
/// for the failed reserve's undo, `unreserve` and a killed reserve's give-back. A mount
/// holding anything but this reservation's own pool file (`ours`) is left mounted, whatever
/// a record says: its files are someone else's. A directory that is not hugetlbfs (never
/// mounted, or unmounted since) is only removed, if empty; one whose mount cannot be
/// unmounted is kept. Gone already is done.
pub fn remove_our_mount(dir: &Path, ours: &str) -> Option<String> {
    if hugetlbfs::is_hugetlbfs(dir) {
        let others: Vec<String> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != ours)
            .collect();
        if !others.is_empty() {
            return Some(format!(
                "{}: holds {} besides this reservation's pool file ({}): left mounted",
                dir.display(),
                others.len(),
                others.join(", ")
            ));
        }
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
pub fn give_back_irqbalance(r: &IrqbalanceRecord) -> Result<(), String> {
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
/// the list of them: widen them back (one the ledger records is left to `unreserve`), less
/// other live reservations' cores.
pub fn widen_unrecorded(lock: &LedgerLock) {
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
    for e in isolation::widen(&left, &keep_off(lock)) {
        log::warn!("{e}");
    }
}

/// A reserve killed part-way left what it had taken written down ([`Unfinished`]): gives
/// it back, best effort (a ledger beside it means the reserve finished, and the ledger
/// holds it all). Each part is written before its step is taken, so each is given back
/// only as far as it was taken: the pool file and our own mount if they exist (on
/// hugetlbfs only, the mount only if it holds nothing else), the IRQs as they were less
/// other live reservations' cores, and of the hugepages only those the counter holds
/// beyond its count before, at most as many as it added, and only pages nobody holds.
/// What could not be given back stays written down; returns whether nothing is left.
pub fn give_back_unfinished(lock: &LedgerLock) -> bool {
    let Some(u) = lock.unfinished() else {
        return true;
    };
    if matches!(lock.load(), Ok(Some(_))) {
        lock.clear_unfinished();
        return true;
    }
    log::warn!("a reserve that did not finish had taken host resources: giving them back");
    let keep_off = keep_off(lock);
    let mut left = Unfinished {
        page_size: u.page_size,
        node: u.node,
        ..Unfinished::default()
    };
    if let Some(r) = &u.irqbalance {
        if let Err(e) = give_back_irqbalance(r) {
            log::warn!("irqbalance: {e}");
            left.irqbalance = Some(r.clone());
        }
    }
    left.irqs = isolation::restore_irqs(&u.irqs, &keep_off);
    if !left.irqs.is_empty() {
        log::warn!("{} IRQ affinities could not be restored", left.irqs.len());
    }
    if let Some(f) = &u.pool_file {
        // Only in our own mount, and only while it is hugetlbfs (unmounted, the file went
        // with it): nothing else is removed.
        if f.parent().is_some_and(hugetlbfs::is_hugetlbfs) {
            if let Some(e) = remove_pool_file(f) {
                log::warn!("{e}");
                left.pool_file = Some(f.clone());
            }
        }
    }
    if let Some(m) = &u.mount {
        if let Some(e) = remove_our_mount(m, &pool_file_name(lock.dir())) {
            log::warn!("{e}");
            left.mount = Some(m.clone());
        }
    }
    if let Some(h) = u.hugepages {
        let c = Counter::at(u.hugepage_dir());
        if let Some(w) = give_back_pages(&c, |now| h.to_give_back(now)) {
            log::warn!("{w}");
        }
    }
    if nothing_left(&left) {
        lock.clear_unfinished();
        return true;
    }
    if let Err(e) = lock.store_unfinished(&left) {
        log::warn!("{e}");
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_mount_directory_is_removed_only_when_empty_and_gone_is_done() {
        let d = std::env::temp_dir().join(format!("our-mount-{}", std::process::id()));
        // Never mounted (a reserve killed between mkdir and mount): the directory goes.
        std::fs::create_dir_all(&d).unwrap();
        assert_eq!(remove_our_mount(&d, "pool"), None);
        assert!(!d.exists());
        // Gone already.
        assert_eq!(remove_our_mount(&d, "pool"), None);
        // Not hugetlbfs and not empty: nothing in it is touched, and the caller hears why.
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("kept"), b"x").unwrap();
        let w = remove_our_mount(&d, "pool").expect("a warning");
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
}
