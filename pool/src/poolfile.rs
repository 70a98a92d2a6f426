//! The pool file: one hugetlbfs file holding the whole reserved pool, preallocated once.
//! A partition's memory is a mapping of one extent of it; mapping is page-table work only
//! (the pages exist), and scrubbing zeroes an extent through such a mapping.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::GuestRam;
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
    file: File,
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
            .open(path)
            .map_err(io("create"))?;
        let pf = Self {
            file,
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
    pub fn open(path: &Path, size: u64, page_size: u64) -> Result<Self, PoolFileError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
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
        if actual != size {
            return Err(PoolFileError::WrongSize {
                path: path.to_path_buf(),
                actual,
                expected: size,
            });
        }
        Ok(Self {
            file,
            path: path.to_path_buf(),
            size,
            page_size,
        })
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Maps `extent` shared and prefaulted.
    pub fn map(&self, extent: Extent) -> Result<ExtentRam, PoolFileError> {
        let bad = PoolFileError::BadExtent {
            offset: extent.offset,
            len: extent.len,
            size: self.size,
        };
        let end = extent.offset.checked_add(extent.len);
        if extent.len == 0
            || extent.offset % self.page_size != 0
            || extent.len % self.page_size != 0
            || end.is_none_or(|e| e > self.size)
        {
            return Err(bad);
        }
        let start = Instant::now();
        // SAFETY: maps a range of our own open file; the kernel checks the rest.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                extent.len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                self.file.as_raw_fd(),
                extent.offset as i64,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(self.err("mmap")(std::io::Error::last_os_error()));
        }
        Ok(ExtentRam {
            ptr: ptr.cast(),
            extent,
            page_size: self.page_size,
            map_time: start.elapsed(),
        })
    }
}

/// One extent of the pool, mapped: a partition's memory.
#[derive(Debug)]
pub struct ExtentRam {
    ptr: *mut u8,
    extent: Extent,
    page_size: u64,
    map_time: Duration,
}

// SAFETY: a plain shared mapping; users synchronise their own accesses to guest memory.
unsafe impl Send for ExtentRam {}
// SAFETY: as above.
unsafe impl Sync for ExtentRam {}

impl ExtentRam {
    /// The extent.
    pub fn extent(&self) -> Extent {
        self.extent
    }

    /// How long mmap + prefault took.
    pub fn map_time(&self) -> Duration {
        self.map_time
    }

    /// Zeroes the whole extent; returns how long it took.
    pub fn scrub(&self) -> Duration {
        let start = Instant::now();
        // SAFETY: ptr..ptr+len is our live read-write mapping; callers scrub only once the
        // guest (the only other user) has stopped.
        unsafe { std::ptr::write_bytes(self.ptr, 0, self.extent.len as usize) };
        start.elapsed()
    }

    /// Whether every byte is zero (for tests and checks).
    pub fn is_zero(&self) -> bool {
        // SAFETY: as above, read-only view of our mapping.
        let s = unsafe { std::slice::from_raw_parts(self.ptr, self.extent.len as usize) };
        s.iter().all(|&b| b == 0)
    }
}

impl Drop for ExtentRam {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what map() mapped, once.
        unsafe {
            libc::munmap(self.ptr.cast(), self.extent.len as usize);
        }
    }
}

// SAFETY: the mapping lives until drop.
unsafe impl GuestRam for ExtentRam {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.extent.len as usize
    }
    fn describe(&self) -> String {
        format!(
            "pool extent {:#x}+{:#x} ({} KiB pages)",
            self.extent.offset,
            self.extent.len,
            self.page_size >> 10
        )
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
        let m = pf.map(e).unwrap();
        assert!(m.is_zero());
        // SAFETY: byte 100 is inside the 16 KiB mapping.
        let p = unsafe { m.as_ptr().add(100) };
        // SAFETY: as above; nothing else uses the mapping.
        unsafe { p.write(7) };
        assert!(!m.is_zero());
        m.scrub();
        assert!(m.is_zero());
        assert!(m.describe().contains("0x2000+0x4000"));
        drop(m);
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
        }
        drop(pf);
        PoolFile::open(&path, 1 << 20, 4096).unwrap();
        assert!(matches!(
            PoolFile::open(&path, 2 << 20, 4096),
            Err(PoolFileError::WrongSize { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
