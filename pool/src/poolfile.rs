//! The pool file: one hugetlbfs file holding the whole reserved pool, preallocated once.
//! A partition's memory is a mapping of one extent of it; mapping is page-table work only
//! (the pages exist), and scrubbing zeroes an extent through such a mapping.

use std::ffi::{CString, OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::extent::Extent;

/// Bytes preallocated between progress reports.
const PROGRESS_STEP: u64 = 256 << 20;

/// Errors creating, opening or mapping the pool file.
#[derive(Debug, thiserror::Error)]
pub enum PoolFileError {
    /// A file operation failed.
    #[error("pool file {path}: {what}: {source}")]
    Io {
        /// The pool file.
        path: PathBuf,
        /// The operation.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not the size the ledger says.
    #[error("pool file {path} is {actual} bytes, expected {expected}")]
    WrongSize {
        /// The file.
        path: PathBuf,
        /// Its size.
        actual: u64,
        /// The ledger's size.
        expected: u64,
    },
    /// The file is not on hugetlbfs (a ledger naming some other file is refused).
    #[error("pool file {path} is not a file on hugetlbfs")]
    NotHugetlbfs {
        /// The file.
        path: PathBuf,
    },
    /// Something is already where a new pool file goes: a planted or leftover file is
    /// never taken over as guest memory.
    #[error("pool file {path} exists already: not reusing a file this reserve did not make")]
    Exists {
        /// The file.
        path: PathBuf,
    },
    /// The file's inode is not one only we could have made and only we can reach: another
    /// owner, a mode that lets others in, or another name (a hard link) beside ours.
    #[error("pool file {path}: {why}: not used as guest memory")]
    Untrusted {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// An extent outside the file, or not page aligned.
    #[error("extent {offset:#x}+{len:#x} is not a page-aligned range of the {size:#x}-byte pool")]
    BadExtent {
        /// Extent offset.
        offset: u64,
        /// Extent length.
        len: u64,
        /// Pool size.
        size: u64,
    },
}

/// The open pool file.
#[derive(Debug)]
pub struct PoolFile {
    file: Arc<File>,
    path: PathBuf,
    size: u64,
    page_size: u64,
}

/// `openat(2)` relative to `dir` with `flags` (`O_CLOEXEC` added); the new descriptor
/// owned.
pub fn openat(dir: &File, name: &OsStr, flags: i32, mode: u32) -> std::io::Result<File> {
    let c = CString::new(name.as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: openat relative to a directory descriptor we hold, with a NUL-terminated name.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags | libc::O_CLOEXEC, mode) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor, owned from here on.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Removes `name` from `dir` (the link itself).
fn unlinkat(dir: &File, name: &OsStr) -> std::io::Result<()> {
    let c = CString::new(name.as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: unlinkat relative to a directory descriptor we hold.
    if unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Why the inode behind `file` is not a pool file of ours with `links` names, if it is not:
/// a regular file this user owns that nobody else may read or write.
pub fn untrusted(file: &File, links: u64) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let m = match file.metadata() {
        Ok(m) => m,
        Err(e) => return Some(format!("stat: {e}")),
    };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !m.is_file() {
        Some("not a regular file".into())
    } else if m.uid() != me {
        Some(format!("owned by uid {}, not by uid {me}", m.uid()))
    } else if m.mode() & 0o077 != 0 {
        Some(format!("mode {:o} lets others in", m.mode() & 0o7777))
    } else if m.nlink() != links {
        Some(format!(
            "{} names (hard links), expected {links}",
            m.nlink()
        ))
    } else {
        None
    }
}

/// A name nobody can guess, for a file made and unlinked at once where `O_TMPFILE` is not
/// offered.
fn unguessable_name() -> OsString {
    OsString::from(format!(".partition-{}.mem", unguessable()))
}

/// 32 random hex digits (the pid and clock, in hex with a dash, with no entropy source):
/// part of a name a user must not be able to make ahead of us.
pub fn unguessable() -> String {
    let mut b = [0u8; 16];
    // SAFETY: getrandom writes at most `b.len()` bytes into a local array.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n == b.len() as isize {
        b.iter().map(|x| format!("{x:02x}")).collect()
    } else {
        // No entropy source: the clock and pid, still never reused (O_EXCL refuses a
        // planted name, it does not take it over).
        format!(
            "{:x}-{:x}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        )
    }
}

impl PoolFile {
    fn err(&self, what: &'static str) -> impl FnOnce(std::io::Error) -> PoolFileError + '_ {
        move |source| PoolFileError::Io {
            path: self.path.clone(),
            what,
            source,
        }
    }

    /// Creates the pool file `name` in directory `dir` (a descriptor held by the caller;
    /// `dir_path` only names it in messages) with `O_EXCL`, checks the new inode (ours, mode
    /// 0600, one name) and preallocates all of it, calling `progress(done, total)` as it
    /// goes. Anything already there is refused, never reused. On failure the file is
    /// removed.
    pub fn create_in(
        dir: &File,
        dir_path: &Path,
        name: &OsStr,
        size: u64,
        page_size: u64,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self, PoolFileError> {
        let path = dir_path.join(name);
        let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
        let file = openat(dir, name, flags, 0o600).map_err(|source| {
            if source.raw_os_error() == Some(libc::EEXIST) {
                PoolFileError::Exists { path: path.clone() }
            } else {
                PoolFileError::Io {
                    path: path.clone(),
                    what: "create",
                    source,
                }
            }
        })?;
        let r = match untrusted(&file, 1) {
            Some(why) => Err(PoolFileError::Untrusted {
                path: path.clone(),
                why,
            }),
            None => Self::fill(file, path, size, page_size, progress),
        };
        if r.is_err() {
            let _ = unlinkat(dir, name);
        }
        r
    }

    /// Creates a pool file with no name in directory `dir` (`O_TMPFILE`; where the file
    /// system does not offer it, a file made under an unguessable name with `O_EXCL` and
    /// unlinked before any page of it is touched), checks the inode (ours, mode 0600, no
    /// name) and preallocates it. Nobody can open it by name at any moment; it goes when
    /// the last descriptor and mapping of it go.
    pub fn create_unnamed_in(
        dir: &File,
        dir_path: &Path,
        size: u64,
        page_size: u64,
    ) -> Result<Self, PoolFileError> {
        let io = |what| {
            move |source| PoolFileError::Io {
                path: dir_path.to_path_buf(),
                what,
                source,
            }
        };
        let file = match openat(
            dir,
            OsStr::new("."),
            libc::O_TMPFILE | libc::O_RDWR | libc::O_EXCL,
            0o600,
        ) {
            Ok(f) => f,
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL)
                ) =>
            {
                let name = unguessable_name();
                let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
                let f = openat(dir, &name, flags, 0o600).map_err(io("create"))?;
                let named = untrusted(&f, 1);
                unlinkat(dir, &name).map_err(io("unlink"))?;
                if let Some(why) = named {
                    return Err(PoolFileError::Untrusted {
                        path: dir_path.join(name),
                        why,
                    });
                }
                f
            }
            Err(e) => return Err(io("create an unnamed file (O_TMPFILE)")(e)),
        };
        if let Some(why) = untrusted(&file, 0) {
            return Err(PoolFileError::Untrusted {
                path: dir_path.to_path_buf(),
                why,
            });
        }
        Self::fill(
            file,
            dir_path.to_path_buf(),
            size,
            page_size,
            &mut |_, _| {},
        )
    }

    /// [`Self::create_in`] in `path`'s directory, opened without following a final link:
    /// for tests and callers whose directory is their own.
    pub fn create(
        path: &Path,
        size: u64,
        page_size: u64,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self, PoolFileError> {
        let io = |what| {
            move |source| PoolFileError::Io {
                path: path.to_path_buf(),
                what,
                source,
            }
        };
        let name = path
            .file_name()
            .ok_or_else(|| io("name")(std::io::Error::from_raw_os_error(libc::EINVAL)))?;
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let dir = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(parent)
            .map_err(io("open its directory"))?;
        Self::create_in(&dir, parent, name, size, page_size, progress)
    }

    /// The pool file over a new, checked `file`, preallocated.
    fn fill(
        file: File,
        path: PathBuf,
        size: u64,
        page_size: u64,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self, PoolFileError> {
        let pf = Self {
            file: Arc::new(file),
            path,
            size,
            page_size,
        };
        pf.preallocate(progress)?;
        Ok(pf)
    }

    fn preallocate(&self, progress: &mut dyn FnMut(u64, u64)) -> Result<(), PoolFileError> {
        let mut done = 0;
        progress(0, self.size);
        while done < self.size {
            let n = (self.size - done).min(PROGRESS_STEP);
            // SAFETY: fallocate on our own fd with in-range arguments.
            let rc = unsafe { libc::fallocate(self.file.as_raw_fd(), 0, done as i64, n as i64) };
            if rc != 0 {
                return Err(self.err("fallocate")(std::io::Error::last_os_error()));
            }
            done += n;
            progress(done, self.size);
        }
        Ok(())
    }

    /// Opens an existing pool file of `size` bytes.
    /// The file must be a regular file on hugetlbfs, reached without following a symlink,
    /// owned by this user, mode 0600 or narrower, with one name: whatever a ledger names,
    /// nothing else (a file a user planted or linked there) is ever mapped or zeroed.
    pub fn open(path: &Path, size: u64, page_size: u64) -> Result<Self, PoolFileError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(|source| PoolFileError::Io {
                path: path.to_path_buf(),
                what: "open",
                source,
            })?;
        let actual = file
            .metadata()
            .map_err(|source| PoolFileError::Io {
                path: path.to_path_buf(),
                what: "stat",
                source,
            })?
            .len();
        if !crate::hugetlbfs::is_hugetlbfs_fd(file.as_raw_fd()) {
            return Err(PoolFileError::NotHugetlbfs {
                path: path.to_path_buf(),
            });
        }
        if let Some(why) = untrusted(&file, 1) {
            return Err(PoolFileError::Untrusted {
                path: path.to_path_buf(),
                why,
            });
        }
        if actual != size {
            return Err(PoolFileError::WrongSize {
                path: path.to_path_buf(),
                actual,
                expected: size,
            });
        }
        Ok(Self {
            file: Arc::new(file),
            path: path.to_path_buf(),
            size,
            page_size,
        })
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    fn check(&self, extent: Extent) -> Result<(), PoolFileError> {
        let end = extent.offset.checked_add(extent.len);
        if extent.len == 0
            || extent.offset % self.page_size != 0
            || extent.len % self.page_size != 0
            || end.is_none_or(|e| e > self.size)
        {
            return Err(PoolFileError::BadExtent {
                offset: extent.offset,
                len: extent.len,
                size: self.size,
            });
        }
        Ok(())
    }

    /// `extent` as guest RAM: what the VMM's guest memory maps (shared, prefaulted).
    pub fn extent(&self, extent: Extent) -> Result<ExtentFile, PoolFileError> {
        self.check(extent)?;
        Ok(ExtentFile {
            file: Arc::clone(&self.file),
            extent,
            page_size: self.page_size,
        })
    }

    /// Maps `extent` shared and prefaulted, for scrubbing and checking it.
    pub fn map(&self, extent: Extent) -> Result<ExtentRam, PoolFileError> {
        self.check(extent)?;
        // SAFETY: a shared mapping of our own pool file (mode 0600, root's, only ever
        // changed through such mappings); a concurrent truncation by someone else would
        // make accesses fault, which the ledger lock and the file's ownership rule out.
        let map = unsafe {
            memmap2::MmapOptions::new()
                .offset(extent.offset)
                .len(extent.len as usize)
                .populate()
                .map_mut(&*self.file)
        }
        .map_err(self.err("mmap"))?;
        Ok(ExtentRam { map, extent })
    }
}

/// One extent of the pool file, to be mapped as a guest's RAM. The mapping is made and owned
/// by the guest's memory, so everything holding a clone of that memory keeps it mapped.
#[derive(Clone, Debug)]
pub struct ExtentFile {
    file: Arc<File>,
    extent: Extent,
    page_size: u64,
}

impl ExtentFile {
    /// The pool file.
    pub fn file(&self) -> &Arc<File> {
        &self.file
    }

    /// The extent.
    pub fn extent(&self) -> Extent {
        self.extent
    }

    /// The pool's page size.
    pub fn page_size(&self) -> u64 {
        self.page_size
    }
}

/// One extent of the pool, mapped by the pool itself: for scrubbing and checking it.
#[derive(Debug)]
pub struct ExtentRam {
    map: memmap2::MmapMut,
    extent: Extent,
}

impl ExtentRam {
    /// The extent.
    pub fn extent(&self) -> Extent {
        self.extent
    }

    /// Zeroes the whole extent; returns how long it took. Callers scrub only once the guest
    /// (the only other user of these pages) has stopped.
    pub fn scrub(&mut self) -> Duration {
        let start = Instant::now();
        self.map.fill(0);
        start.elapsed()
    }

    /// Whether every byte is zero (for tests and checks).
    pub fn is_zero(&self) -> bool {
        self.map.iter().all(|&b| b == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool file on an ordinary filesystem (4 KiB "pages") exercises everything but the
    /// hugepages themselves.
    #[test]
    fn create_map_scrub_reopen() {
        let dir = std::env::temp_dir().join(format!("poolfile-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("pool");
        let mut steps = Vec::new();
        let pf = PoolFile::create(&path, 1 << 20, 4096, &mut |d, t| steps.push((d, t))).unwrap();
        assert_eq!(steps.first(), Some(&(0, 1 << 20)));
        assert_eq!(steps.last(), Some(&(1 << 20, 1 << 20)));
        let e = Extent {
            offset: 8192,
            len: 16384,
        };
        let mut m = pf.map(e).unwrap();
        assert!(m.is_zero());
        m.map[100] = 7;
        assert!(!m.is_zero());
        // The same bytes through a second mapping of the file: the pool is shared memory.
        assert_eq!(pf.map(e).unwrap().map[100], 7);
        m.scrub();
        assert!(m.is_zero());
        drop(m);
        let src = pf.extent(e).unwrap();
        assert_eq!((src.extent(), src.page_size()), (e, 4096));
        for bad in [
            Extent {
                offset: 1,
                len: 4096,
            },
            Extent { offset: 0, len: 0 },
            Extent {
                offset: 0,
                len: 2 << 20,
            },
            Extent {
                offset: u64::MAX - 4095,
                len: 8192,
            },
        ] {
            assert!(
                matches!(pf.map(bad), Err(PoolFileError::BadExtent { .. })),
                "{bad:?}"
            );
            assert!(
                matches!(pf.extent(bad), Err(PoolFileError::BadExtent { .. })),
                "{bad:?}"
            );
        }
        drop(pf);
        // Reopened only on hugetlbfs: a file anywhere else (as a forged ledger might name)
        // is refused, and so is a symlink.
        assert!(matches!(
            PoolFile::open(&path, 1 << 20, 4096),
            Err(PoolFileError::NotHugetlbfs { .. })
        ));
        let link = dir.join("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(matches!(
            PoolFile::open(&link, 1 << 20, 4096),
            Err(PoolFileError::Io { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A file already where a pool file goes (planted, or left over) is refused, not
    /// reused, and left as it is.
    #[test]
    fn a_file_in_the_way_is_refused_and_left_alone() {
        let dir = std::env::temp_dir().join(format!("poolfile-planted-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("pool");
        std::fs::write(&path, b"someone else's").unwrap();
        assert!(matches!(
            PoolFile::create(&path, 1 << 20, 4096, &mut |_, _| {}),
            Err(PoolFileError::Exists { .. })
        ));
        assert_eq!(std::fs::read(&path).unwrap(), b"someone else's");
        // A link there is not followed either.
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(dir.join("target"), &path).unwrap();
        assert!(PoolFile::create(&path, 1 << 20, 4096, &mut |_, _| {}).is_err());
        assert!(!dir.join("target").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// What makes an inode untrusted: another mode than private, a second name.
    #[test]
    fn only_a_private_file_with_one_name_is_trusted() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("poolfile-trust-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("pool");
        let pf = PoolFile::create(&path, 1 << 20, 4096, &mut |_, _| {}).unwrap();
        let f = File::open(&path).unwrap();
        assert_eq!(untrusted(&f, 1), None);
        assert!(untrusted(&f, 0).unwrap().contains("1 names"));
        std::fs::hard_link(&path, dir.join("second")).unwrap();
        assert!(untrusted(&f, 1).unwrap().contains("2 names"));
        std::fs::remove_file(dir.join("second")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(untrusted(&f, 1).unwrap().contains("mode 644"));
        drop(pf);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// An unnamed pool file leaves no name in its directory at any point after creation,
    /// and is the size asked for.
    #[test]
    fn an_unnamed_file_has_no_name() {
        let dir = std::env::temp_dir().join(format!("poolfile-unnamed-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let d = File::open(&dir).unwrap();
        let pf = PoolFile::create_unnamed_in(&d, &dir, 1 << 20, 4096).unwrap();
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        assert_eq!(pf.file.metadata().unwrap().len(), 1 << 20);
        assert_eq!(untrusted(&pf.file, 0), None);
        let e = Extent {
            offset: 0,
            len: 8192,
        };
        assert!(pf.map(e).unwrap().is_zero());
        // A planted name beside it is never what it maps.
        std::fs::write(dir.join(".partition-0.mem"), b"planted").unwrap();
        let again = PoolFile::create_unnamed_in(&d, &dir, 1 << 20, 4096).unwrap();
        assert!(again.map(e).unwrap().is_zero());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
