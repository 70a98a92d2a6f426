//! The kernel's hugepage pool, through sysfs: how many pages of a size (per NUMA node, or
//! system-wide) exist and are free, and growing/shrinking that count with a check that the
//! kernel really delivered.

use std::path::{Path, PathBuf};

/// Errors reading or changing hugepage counts.
#[derive(Debug, thiserror::Error)]
pub enum HugepageError {
    /// This page size is not offered by the kernel.
    #[error("{size} byte hugepages are not supported here (supported: {supported})")]
    Unsupported {
        /// Requested page size.
        size: u64,
        /// What the kernel offers.
        supported: String,
    },
    /// The node does not exist.
    #[error("NUMA node {0} does not exist")]
    NoNode(u32),
    /// sysfs access failed.
    #[error("{path}: {source}")]
    Io {
        /// The sysfs file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The kernel gave fewer pages than asked (fragmentation); the count was rolled back.
    #[error(
        "the kernel gave only {got} of {wanted} more {size_kib} KiB hugepages (memory is too fragmented or too small); rolled back to {before}"
    )]
    Shortfall {
        /// Pages asked for on top of `before`.
        wanted: u64,
        /// Pages actually added.
        got: u64,
        /// Count before.
        before: u64,
        /// Page size in KiB.
        size_kib: u64,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> HugepageError + '_ {
    move |source| HugepageError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Page sizes the kernel offers, in bytes, ascending.
pub fn supported_sizes() -> Vec<u64> {
    let mut v: Vec<u64> = std::fs::read_dir("/sys/kernel/mm/hugepages")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.strip_prefix("hugepages-")?
                .strip_suffix("kB")?
                .parse::<u64>()
                .ok()
                .map(|k| k << 10)
        })
        .collect();
    v.sort_unstable();
    v
}

/// The sysfs directory for `page_size` hugepages, on `node` or system-wide.
pub fn sysfs_dir(page_size: u64, node: Option<u32>) -> Result<PathBuf, HugepageError> {
    let sizes = supported_sizes();
    if !sizes.contains(&page_size) {
        return Err(HugepageError::Unsupported {
            size: page_size,
            supported: sizes
                .iter()
                .map(|s| format!("{} KiB", s >> 10))
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    let leaf = format!("hugepages-{}kB", page_size >> 10);
    Ok(match node {
        None => PathBuf::from("/sys/kernel/mm/hugepages").join(leaf),
        Some(n) => {
            let d = PathBuf::from(format!("/sys/devices/system/node/node{n}"));
            if !d.exists() {
                return Err(HugepageError::NoNode(n));
            }
            d.join("hugepages").join(leaf)
        }
    })
}

fn read_u64(path: &Path) -> Result<u64, HugepageError> {
    let s = std::fs::read_to_string(path).map_err(io(path))?;
    s.trim().parse().map_err(|_| HugepageError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, "not a number"),
    })
}

/// A count of hugepages of one size on one node (or system-wide).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counter {
    dir: PathBuf,
}

impl Counter {
    /// The counter for `page_size` on `node`.
    pub fn new(page_size: u64, node: Option<u32>) -> Result<Self, HugepageError> {
        Ok(Self {
            dir: sysfs_dir(page_size, node)?,
        })
    }

    /// The counter at an explicit sysfs directory (as recorded in a ledger).
    pub fn at(dir: PathBuf) -> Self {
        Self { dir }
    }

    /// The sysfs directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Pages that exist.
    pub fn total(&self) -> Result<u64, HugepageError> {
        read_u64(&self.dir.join("nr_hugepages"))
    }

    /// Pages not in use.
    pub fn free(&self) -> Result<u64, HugepageError> {
        read_u64(&self.dir.join("free_hugepages"))
    }

    /// Sets the count, returning what the kernel made of it.
    pub fn set(&self, n: u64) -> Result<u64, HugepageError> {
        let p = self.dir.join("nr_hugepages");
        std::fs::write(&p, n.to_string()).map_err(io(&p))?;
        self.total()
    }

    /// Adds `pages`; if the kernel cannot deliver them all, restores the old count and
    /// fails. Returns the count before.
    pub fn grow(&self, pages: u64, page_size: u64) -> Result<u64, HugepageError> {
        let before = self.total()?;
        let got = self.set(before + pages)?;
        if got < before + pages {
            let _ = self.set(before);
            return Err(HugepageError::Shortfall {
                wanted: pages,
                got: got.saturating_sub(before),
                before,
                size_kib: page_size >> 10,
            });
        }
        Ok(before)
    }

    /// Removes `pages` (as many of them as are free).
    pub fn shrink(&self, pages: u64) -> Result<u64, HugepageError> {
        let now = self.total()?;
        self.set(now.saturating_sub(pages))
    }

    /// Takes this counter's host-wide lock (an exclusive `flock` of its sysfs directory,
    /// waiting for it; released when the file is dropped). A reserve holds it from adding
    /// its pages until its pool file holds them, and a give-back while it takes pages
    /// away, so that a give-back never mistakes another reserve's pages, added but not yet
    /// in its pool file, for pages nobody holds. Nothing is left behind on the host.
    pub fn lock(&self) -> Result<std::fs::File, HugepageError> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::OpenOptionsExt;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(&self.dir)
            .map_err(io(&self.dir))?;
        loop {
            // SAFETY: flock on a descriptor we own.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(f);
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(io(&self.dir)(e));
            }
        }
    }

    /// Pages nobody holds: free and not promised to a mapping (`resv_hugepages`, which a
    /// node's counter does not have: the host-wide one for the size stands in, an upper
    /// bound of the node's).
    pub fn unowned(&self) -> Result<u64, HugepageError> {
        let free = self.free()?;
        let resv_file = self.dir.join("resv_hugepages");
        let resv = if resv_file.exists() {
            read_u64(&resv_file)?
        } else {
            match self.dir.file_name() {
                Some(leaf) => {
                    let global = Path::new("/sys/kernel/mm/hugepages")
                        .join(leaf)
                        .join("resv_hugepages");
                    read_u64(&global).unwrap_or(0)
                }
                None => 0,
            }
        };
        Ok(free.saturating_sub(resv))
    }

    /// Gives back up to `pages` pages to the kernel, but only pages nobody holds: taking
    /// away more would turn pages another reservation (or anyone) is using into surplus
    /// ones, and the host's count would lie. Returns how many went.
    pub fn give_back(&self, pages: u64) -> Result<u64, HugepageError> {
        let take = pages.min(self.unowned()?);
        if take == 0 {
            return Ok(0);
        }
        let before = self.total()?;
        let after = self.set(before.saturating_sub(take))?;
        Ok(before.saturating_sub(after))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_paths() {
        let sizes = supported_sizes();
        if sizes.is_empty() {
            skip::skip(
                "pool::hugepages::sizes_and_paths",
                "the kernel offers no hugepages",
            );
            return;
        }
        let d = sysfs_dir(sizes[0], None).unwrap();
        assert!(d.join("nr_hugepages").exists());
        assert!(matches!(
            sysfs_dir(12345, None),
            Err(HugepageError::Unsupported { .. })
        ));
        assert!(matches!(
            sysfs_dir(sizes[0], Some(999)),
            Err(HugepageError::NoNode(999))
        ));
        let c = Counter::new(sizes[0], None).unwrap();
        assert!(c.free().unwrap() <= c.total().unwrap());
    }
}
