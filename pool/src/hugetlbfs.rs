//! hugetlbfs mounts: our own, made private (mode 0700, root's), and what an open directory
//! is. A reservation never adopts a mount someone else made (a world-writable one would let
//! a user plant or map the pool file): it mounts its own in its state directory.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Errors mounting hugetlbfs.
#[derive(Debug, thiserror::Error)]
pub enum HugetlbfsError {
    /// mount(2) or umount(2) failed.
    #[error("{op} hugetlbfs at {path}: {source}")]
    Mount {
        /// "mounting" or "unmounting".
        op: &'static str,
        /// Mount point.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap_or_default()
}

/// Mounts hugetlbfs for `page_size` at `dir` (which must exist).
pub fn mount(dir: &Path, page_size: u64) -> Result<(), HugetlbfsError> {
    let src = CString::new("partition-hugetlbfs").unwrap_or_default();
    let fstype = CString::new("hugetlbfs").unwrap_or_default();
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    // SAFETY: getegid has no preconditions.
    let gid = unsafe { libc::getegid() };
    let data = CString::new(format!(
        "pagesize={}K,mode=0700,uid={uid},gid={gid}",
        page_size >> 10
    ))
    .unwrap_or_default();
    let target = cstr(dir);
    // SAFETY: all pointers are valid NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(HugetlbfsError::Mount {
            op: "mounting",
            path: dir.to_path_buf(),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// `statfs` magic of hugetlbfs.
const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;

/// Whether open file `fd` is on hugetlbfs.
pub fn is_hugetlbfs_fd(fd: std::os::fd::RawFd) -> bool {
    page_size_fd(fd).is_some()
}

/// The page size of the hugetlbfs that open file `fd` is on (its `statfs` block size); None
/// if it is not on hugetlbfs.
pub fn page_size_fd(fd: std::os::fd::RawFd) -> Option<u64> {
    // SAFETY: statfs is plain data; all-zero is valid and fstatfs overwrites it.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs on a caller's fd into a local struct.
    let ok = unsafe { libc::fstatfs(fd, &mut s) == 0 && s.f_type as i64 == HUGETLBFS_MAGIC };
    ok.then_some(s.f_bsize as u64)
}

/// Why directory `dir` (open) is not a hugetlbfs mount only this user can enter, if it is
/// not: where a reservation's pool file is made.
pub fn not_private(dir: &std::fs::File) -> Option<String> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;
    if !is_hugetlbfs_fd(dir.as_raw_fd()) {
        return Some("not on hugetlbfs".into());
    }
    let m = match dir.metadata() {
        Ok(m) => m,
        Err(e) => return Some(format!("stat: {e}")),
    };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !m.is_dir() {
        Some("not a directory".into())
    } else if m.uid() != me {
        Some(format!("owned by uid {}, not {me}", m.uid()))
    } else if m.mode() & 0o077 != 0 {
        Some(format!("mode {:o} lets others in", m.mode() & 0o7777))
    } else {
        None
    }
}

/// Opens directory `dir` without following a final link, for the `*_fd` checks.
pub fn open_dir(dir: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir)
}

/// Whether `dir` is (on) a hugetlbfs mount, looked at without following a final symlink.
pub fn is_hugetlbfs(dir: &Path) -> bool {
    use std::os::fd::AsRawFd;
    open_dir(dir).is_ok_and(|d| is_hugetlbfs_fd(d.as_raw_fd()))
}

/// Unmounts `dir`, which must be a hugetlbfs mount (nothing else is ever unmounted, whatever
/// a ledger says); a final symlink is not followed.
pub fn umount(dir: &Path) -> Result<(), HugetlbfsError> {
    if !is_hugetlbfs(dir) {
        return Err(HugetlbfsError::Mount {
            op: "unmounting",
            path: dir.to_path_buf(),
            source: std::io::Error::other("not a hugetlbfs mount: left alone"),
        });
    }
    let target = cstr(dir);
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::umount2(target.as_ptr(), libc::UMOUNT_NOFOLLOW) } != 0 {
        return Err(HugetlbfsError::Mount {
            op: "unmounting",
            path: dir.to_path_buf(),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_hugetlbfs_is_unmounted() {
        // Whatever a ledger names, a mount that is not hugetlbfs is left alone (this would
        // fail with EBUSY or EPERM otherwise; the refusal comes first and says why).
        for p in ["/", "/proc", "/nonexistent"] {
            assert!(!is_hugetlbfs(Path::new(p)), "{p}");
            let e = umount(Path::new(p)).unwrap_err();
            assert!(e.to_string().contains("not a hugetlbfs mount"), "{e}");
        }
        let root = open_dir(Path::new("/")).unwrap();
        assert_eq!(not_private(&root).as_deref(), Some("not on hugetlbfs"));
    }
}
