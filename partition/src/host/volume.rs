//! A pod's hugetlbfs volume as guest memory (`--memory-from DIR`, docs/kubernetes.md).
//!
//! The volume is a directory other processes may write to (a pod's emptyDir of medium
//! HugePages is mode 0777), so nothing in it is found or made by name: the directory is
//! walked to once, by descriptors ([`crate::sys::files`]: no link the trust rule forbids),
//! and everything after is read from or made through that held descriptor — its file
//! system (hugetlbfs) and page size, its owner, and the guest's memory file, made with
//! `O_TMPFILE` (never a name anyone can open, plant or guess; where the kernel does not
//! offer it, an unguessable name with `O_EXCL`, unlinked before a page is touched) and
//! checked on its own descriptor (ours, mode 0600, no name) before any page of it is used.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use pool::Extent;
use pool::poolfile::{ExtentFile, PoolFile};

use crate::host::pod::PodError;

/// A pod's volume, its directory held open: what a launch reads of it and makes in it.
#[derive(Clone, Debug)]
pub struct VolumeDir {
    dir: Arc<File>,
    path: PathBuf,
    /// Its hugetlbfs page size, read on the descriptor (None: not hugetlbfs).
    page: Option<u64>,
    /// The directory's owner.
    owner: u32,
    /// This process's effective uid when it was opened (who makes the memory file).
    me: u32,
}

impl VolumeDir {
    /// Walks to directory `path` once ([`crate::sys::files::open`]) and reads, on the held
    /// descriptor, its file system's page size and its owner.
    pub fn open(path: &Path) -> Result<Self, PodError> {
        use std::os::unix::fs::MetadataExt;
        let mem = |why: String| PodError::Memory {
            dir: path.to_path_buf(),
            why,
        };
        let dir = crate::sys::files::open(path, crate::sys::files::How::DIRECTORY)
            .map_err(|e| mem(e.to_string()))?;
        let page = pool::hugetlbfs::page_size_fd(dir.as_raw_fd());
        let owner = dir.metadata().map_err(|e| mem(format!("stat: {e}")))?.uid();
        Ok(Self {
            dir: Arc::new(dir),
            path: path.to_path_buf(),
            page,
            owner,
            // SAFETY: geteuid has no preconditions.
            me: unsafe { libc::geteuid() },
        })
    }

    /// The directory as the user named it.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its hugetlbfs page size (None: it is not hugetlbfs).
    pub fn page(&self) -> Option<u64> {
        self.page
    }

    /// Why guest memory of `size` bytes may not come from this volume, if it may not: not
    /// hugetlbfs, a size that is no multiple of its pages, or a directory another user than
    /// root or this process's owns (its mount is theirs to unmount or fill). Pure: what
    /// [`Self::open`] read.
    pub fn refusal(&self, size: u64) -> Option<PodError> {
        let Some(page) = self.page else {
            return Some(PodError::NotHugetlbfs(self.path.clone()));
        };
        if size == 0 || size % page != 0 {
            return Some(PodError::PageMultiple {
                size,
                page,
                dir: self.path.clone(),
            });
        }
        if self.owner != 0 && self.owner != self.me {
            return Some(PodError::Memory {
                dir: self.path.clone(),
                why: format!(
                    "owned by uid {}: guest memory goes only in a volume root (or this user) \
                     owns",
                    self.owner
                ),
            });
        }
        None
    }

    /// `size` bytes of guest memory from the volume: checked against the pod's hugetlb
    /// limit first, then a file with no name made through the held descriptor (module
    /// docs), preallocated (the pages are charged to the pod); nothing is left in the
    /// volume however the launch ends, and the pages go back when the VMM exits.
    pub fn memory(&self, size: u64) -> Result<ExtentFile, PodError> {
        if let Some(no) = self.refusal(size) {
            return Err(no);
        }
        let page = self.page.unwrap_or(0);
        if let Some((limit, used, cg)) = crate::host::pod::hugetlb_room(page)? {
            let left = limit.saturating_sub(used);
            if size > left {
                return Err(PodError::OverLimit {
                    want: size,
                    left,
                    limit,
                    page_kb: page >> 10,
                    dir: cg,
                });
            }
        }
        let mem = |why: String| PodError::Memory {
            dir: self.path.clone(),
            why,
        };
        // The held descriptor is still hugetlbfs of that page size (what it is cannot
        // change; checked again where it is used).
        if pool::hugetlbfs::page_size_fd(self.dir.as_raw_fd()) != Some(page) {
            return Err(PodError::NotHugetlbfs(self.path.clone()));
        }
        let pf = PoolFile::create_unnamed_in(&self.dir, &self.path, size, page)
            .map_err(|e| mem(e.to_string()))?;
        pf.extent(Extent {
            offset: 0,
            len: size,
        })
        .map_err(|e| mem(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_that_is_not_hugetlbfs_is_refused() {
        let v = VolumeDir::open(Path::new("/tmp")).unwrap();
        assert_eq!(v.page(), None);
        let e = v.memory(2 << 20).unwrap_err();
        assert!(matches!(e, PodError::NotHugetlbfs(_)), "{e}");
        assert!(e.is_usage());
        assert!(matches!(
            VolumeDir::open(Path::new("/nonexistent/dir")),
            Err(PodError::Memory { .. })
        ));
    }

    /// What the check refuses, from made-up volumes: the page multiple and the owner.
    #[test]
    fn the_refusals_name_the_page_and_the_owner() {
        let dir = Arc::new(File::open("/").unwrap());
        let v = |page, owner, me| VolumeDir {
            dir: dir.clone(),
            path: PathBuf::from("/vol"),
            page,
            owner,
            me,
        };
        assert!(v(Some(2 << 20), 0, 0).refusal(4 << 20).is_none());
        assert!(v(Some(2 << 20), 1000, 1000).refusal(4 << 20).is_none());
        assert!(v(Some(2 << 20), 0, 1000).refusal(4 << 20).is_none());
        assert!(matches!(
            v(Some(2 << 20), 0, 0).refusal(3 << 20),
            Some(PodError::PageMultiple { .. })
        ));
        assert!(matches!(
            v(None, 0, 0).refusal(4 << 20),
            Some(PodError::NotHugetlbfs(_))
        ));
        let e = v(Some(2 << 20), 4242, 0).refusal(4 << 20).unwrap();
        assert!(e.to_string().contains("owned by uid 4242"), "{e}");
        assert!(e.is_usage());
    }
}
