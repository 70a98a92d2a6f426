//! The pool file: one hugetlbfs file holding the whole reserved pool, preallocated once.
//! A partition's memory is a mapping of one extent of it; mapping is page-table work only
//! (the pages exist), and scrubbing zeroes an extent through such a mapping.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
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

impl PoolFile {
    fn err(&self, what: &'static str) -> impl FnOnce(std::io::Error) -> PoolFileError + '_ {
        move |source| PoolFileError::Io {
            path: self.path.clone(),
            what,
            source,
        }
    }

    /// Creates (or reuses, if it already has the size) the pool file and preallocates all of
    /// it, calling `progress(done, total)` as it goes. On failure the file is removed.
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
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            // A link planted where the pool file goes is refused, never written through.
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(io("create"))?;
        let pf = Self {
            file: Arc::new(file),
            path: path.to_path_buf(),
            size,
            page_size,
        };
        let r = pf.preallocate(progress);
        if let Err(e) = r {
            drop(pf);
            let _ = std::fs::remove_file(path);
            return Err(e);
        }
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
    /// The file must be a regular file on hugetlbfs, reached without following a symlink:
    /// whatever a ledger names, nothing else is ever mapped or zeroed.
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
}
