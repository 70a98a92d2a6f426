//! Holding the ledger: the exclusive or shared `flock` on its lock file under which it is
//! read and changed (written whole, renamed into place), and a partition's own
//! lock that says its launcher is alive.

use super::{
    LEDGER, LOCK, LOCKS, Ledger, LedgerError, MAX_LEDGER, NARROWING, NarrowedCpuset, UNFINISHED,
    Unfinished, VERSION,
};
use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::sys::statedir::{StateDir, StateDirError};

/// An exclusive (or shared) lock on a state directory's ledger.
pub struct LedgerLock {
    dir: StateDir,
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

    /// A shared lock on an existing state directory: None if the directory does not exist
    /// (a reader creates nothing: `status` of a directory nobody reserved in leaves none).
    pub fn shared_existing(dir: &Path) -> Result<Option<Self>, LedgerError> {
        Self::existing(dir, libc::LOCK_SH)
    }

    /// [`LedgerLock::exclusive`] on an existing state directory only (None if it does not
    /// exist): what only uses a reservation (unreserve, a launch's claim) creates nothing.
    pub fn exclusive_existing(dir: &Path) -> Result<Option<Self>, LedgerError> {
        Self::existing(dir, libc::LOCK_EX)
    }

    fn existing(dir: &Path, how: i32) -> Result<Option<Self>, LedgerError> {
        let d = match StateDir::open(dir, false) {
            Ok(d) => d,
            Err(StateDirError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        };
        let f = d.open_rw(LOCK)?;
        flock(&f, how, false).map_err(io(&d.join(LOCK), "flock"))?;
        Ok(Some(Self { dir: d, _lock: f }))
    }

    fn lock(dir: &Path, how: i32) -> Result<Self, LedgerError> {
        let dir = StateDir::open(dir, true)?;
        let f = dir.open_rw(LOCK)?;
        flock(&f, how, false).map_err(io(&dir.join(LOCK), "flock"))?;
        Ok(Self { dir, _lock: f })
    }

    /// For a request refused where no ledger exists: removes the lock file, then the
    /// directories from the state directory up to (not including) `kept`, the deepest one
    /// that existed before, while they are empty. A refused `reserve` leaves nothing.
    pub fn discard(self, kept: &Path) {
        let _ = self.dir.remove(LOCK);
        let mut at = self.dir.path().to_path_buf();
        drop(self);
        while at != kept && at.starts_with(kept) {
            if std::fs::remove_dir(&at).is_err() {
                break;
            }
            if !at.pop() {
                break;
            }
        }
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The state directory, open.
    pub fn state_dir(&self) -> &StateDir {
        &self.dir
    }

    /// The ledger file's path.
    pub fn path(&self) -> PathBuf {
        self.dir.join(LEDGER)
    }

    /// Reads the ledger, if there is one: it must be root's, writable by nobody else, parse,
    /// and describe a reservation `partition reserve` could have made here.
    pub fn load(&self) -> Result<Option<Ledger>, LedgerError> {
        let p = self.path();
        let Some(f) = self.dir.read_file(LEDGER)? else {
            return Ok(None);
        };
        let mut text = String::new();
        f.take(MAX_LEDGER + 1)
            .read_to_string(&mut text)
            .map_err(|e| match e.kind() {
                // Not UTF-8: not a ledger reserve wrote (exit 2, as any corrupt one).
                std::io::ErrorKind::InvalidData => LedgerError::Corrupt {
                    path: p.clone(),
                    reason: "not UTF-8 text".into(),
                },
                _ => io(&p, "read")(e),
            })?;
        if text.len() as u64 > MAX_LEDGER {
            return Err(LedgerError::Corrupt {
                path: p,
                reason: format!("larger than {MAX_LEDGER} bytes"),
            });
        }
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
            .and_then(|()| l.check_paths(self.dir()))
            .map_err(|reason| LedgerError::Corrupt { path: p, reason })?;
        Ok(Some(l))
    }

    /// Replaces the ledger atomically.
    pub fn store(&self, l: &Ledger) -> Result<(), LedgerError> {
        let mut text = serde_json::to_string_pretty(l).map_err(|e| LedgerError::Corrupt {
            path: self.path(),
            reason: e.to_string(),
        })?;
        text.push('\n');
        self.dir.replace(LEDGER, text.as_bytes())?;
        Ok(())
    }

    /// Replaces the reserve's record `name` (in the state directory) with `v`, as JSON.
    fn store_record(&self, name: &str, v: &impl serde::Serialize) -> Result<(), LedgerError> {
        let text = serde_json::to_string(v).map_err(|e| LedgerError::Corrupt {
            path: self.dir.join(name),
            reason: e.to_string(),
        })?;
        self.dir.replace(name, text.as_bytes())?;
        Ok(())
    }

    /// The reserve's record `name`, if there is one: read (bounded) and parsed, or the
    /// error in words.
    fn read_record<T: serde::de::DeserializeOwned>(&self, name: &str) -> Option<Result<T, String>> {
        let Ok(Some(f)) = self.dir.read_file(name) else {
            return None;
        };
        let mut text = String::new();
        Some(match f.take(MAX_LEDGER).read_to_string(&mut text) {
            Ok(_) => serde_json::from_str(&text).map_err(|_| "unreadable".to_string()),
            Err(_) => Err("unreadable".into()),
        })
    }

    /// Whether a reserve that did not finish left a record of what it took (the cpusets it
    /// narrowed, or the rest): the next reserve or unreserve gives it back.
    pub fn has_unfinished_reserve(&self) -> bool {
        [NARROWING, UNFINISHED]
            .iter()
            .any(|n| matches!(self.dir.read_file(n), Ok(Some(_))))
    }

    /// Records the cpusets a reserve is about to narrow (see [`NARROWING`]).
    pub fn store_narrowing(&self, n: &[NarrowedCpuset]) -> Result<(), LedgerError> {
        self.store_record(NARROWING, &n)
    }

    /// The cpusets a reserve that did not finish had narrowed, if it left a record (which
    /// is removed): each in a cgroup hierarchy, with core lists, or the record is ignored.
    pub fn take_narrowing(&self) -> Vec<NarrowedCpuset> {
        let Some(read) = self.read_record::<Vec<NarrowedCpuset>>(NARROWING) else {
            return Vec::new();
        };
        let _ = self.dir.remove(NARROWING);
        let checked =
            read.and_then(|n| super::check_narrowed(&n, Path::new("/sys/fs/cgroup")).map(|()| n));
        checked.unwrap_or_else(|e| {
            log::warn!("{}: {e}; ignored", self.dir.join(NARROWING).display());
            Vec::new()
        })
    }

    /// Records what a reserve has taken so far (see [`UNFINISHED`]), before its next step.
    pub fn store_unfinished(&self, u: &Unfinished) -> Result<(), LedgerError> {
        self.store_record(UNFINISHED, u)
    }

    /// What a reserve that did not finish had taken, if it left a record naming only what
    /// a reserve here could have taken (kept until [`Self::clear_unfinished`], so a give
    /// back cut short is done again); a record that is not is removed, and None.
    pub fn unfinished(&self) -> Option<Unfinished> {
        let read = self.read_record::<Unfinished>(UNFINISHED)?;
        let path = self.dir.join(UNFINISHED);
        let checked = read.and_then(|u| u.check_paths(self.dir()).map(|()| u));
        checked
            .inspect_err(|e| {
                log::warn!("{}: {e}; ignored", path.display());
                let _ = self.dir.remove(UNFINISHED);
            })
            .ok()
    }

    /// Removes the record of what a reserve has taken (the ledger has it now, or it was
    /// given back).
    pub fn clear_unfinished(&self) {
        let _ = self.dir.remove(UNFINISHED);
    }

    /// Removes the record of cpusets being narrowed (the ledger has them now, or they were
    /// widened back).
    pub fn clear_narrowing(&self) {
        let _ = self.dir.remove(NARROWING);
    }

    /// Removes the ledger.
    pub fn remove(&self) -> Result<(), LedgerError> {
        self.dir.remove(LEDGER)?;
        Ok(())
    }

    fn locks(&self, create: bool) -> Result<Option<StateDir>, LedgerError> {
        Ok(self.dir.subdir(LOCKS, create)?)
    }

    /// Takes partition `name`'s liveness lock: held by its launcher (and the launcher's
    /// keeper, which shares it) for as long as either lives. Refused if someone holds it.
    pub fn lock_partition(&self, name: &str) -> Result<PartitionLock, LedgerError> {
        let dir = self.locks(true)?.ok_or_else(|| LedgerError::Io {
            path: self.dir.join(LOCKS),
            what: "mkdir",
            source: std::io::Error::from_raw_os_error(libc::ENOENT),
        })?;
        let f = dir.open_rw(name)?;
        flock(&f, libc::LOCK_EX, true).map_err(io(&dir.join(name), "flock"))?;
        Ok(PartitionLock(f))
    }

    /// Whether partition `name`'s launcher (or its keeper) is alive: whether its lock is
    /// held. A process that has exited, a zombie included, holds no lock; a recycled pid
    /// does not matter.
    pub fn partition_alive(&self, name: &str) -> bool {
        let Ok(Some(dir)) = self.locks(false) else {
            return false;
        };
        let Ok(Some(f)) = dir.read_file(name) else {
            return false;
        };
        match flock(&f, libc::LOCK_SH, true) {
            Ok(()) => {
                let _ = flock(&f, libc::LOCK_UN, true);
                false
            }
            Err(e) => e.raw_os_error() == Some(libc::EWOULDBLOCK),
        }
    }

    /// Removes partition `name`'s lock file (once nobody holds it).
    pub fn remove_partition_lock(&self, name: &str) {
        if let Ok(Some(dir)) = self.locks(false) {
            let _ = dir.remove(name);
        }
    }

    /// Removes the locks directory (unreserve), if empty.
    pub fn remove_locks_dir(&self) {
        let _ = self.dir.remove_dir(LOCKS);
    }
}

/// A partition's liveness lock (see [`LedgerLock::lock_partition`]); released when every
/// process sharing it has closed it.
#[derive(Debug)]
pub struct PartitionLock(File);

impl PartitionLock {
    /// Its descriptor (a forked keeper keeps it open).
    pub fn fd(&self) -> std::os::fd::RawFd {
        self.0.as_raw_fd()
    }
}

fn flock(f: &File, how: i32, nonblocking: bool) -> std::io::Result<()> {
    let how = if nonblocking {
        how | libc::LOCK_NB
    } else {
        how
    };
    loop {
        // SAFETY: flock on a file we hold open.
        if unsafe { libc::flock(f.as_raw_fd(), how) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}
