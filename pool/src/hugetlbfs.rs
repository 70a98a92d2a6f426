//! hugetlbfs mounts: find one for a page size, or mount our own.

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

/// The default hugepage size (Hugepagesize in /proc/meminfo), in bytes.
pub fn default_page_size() -> Option<u64> {
    let m = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = m
        .lines()
        .find_map(|l| l.strip_prefix("Hugepagesize:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb << 10)
}

fn parse_page_size(opt: &str) -> Option<u64> {
    let v = opt.strip_prefix("pagesize=")?;
    let (num, mult) = match v.as_bytes().last()? {
        b'K' | b'k' => (&v[..v.len() - 1], 1u64 << 10),
        b'M' | b'm' => (&v[..v.len() - 1], 1 << 20),
        b'G' | b'g' => (&v[..v.len() - 1], 1 << 30),
        _ => (v, 1),
    };
    num.parse::<u64>().ok().map(|n| n * mult)
}

/// hugetlbfs mount points in `mounts` (the text of /proc/mounts) serving `page_size`.
pub fn mounts_for(mounts: &str, page_size: u64, default: Option<u64>) -> Vec<PathBuf> {
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 4 || f[2] != "hugetlbfs" {
                return None;
            }
            let size = f[3].split(',').find_map(parse_page_size).or(default)?;
            (size == page_size).then(|| PathBuf::from(f[1].replace("\\040", " ")))
        })
        .collect()
}

/// An existing hugetlbfs mount for `page_size`, if any.
pub fn find_mount(page_size: u64) -> Option<PathBuf> {
    let m = std::fs::read_to_string("/proc/mounts").ok()?;
    mounts_for(&m, page_size, default_page_size())
        .into_iter()
        .next()
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap_or_default()
}

/// Mounts hugetlbfs for `page_size` at `dir` (which must exist).
pub fn mount(dir: &Path, page_size: u64) -> Result<(), HugetlbfsError> {
    let src = CString::new("partition-hugetlbfs").unwrap_or_default();
    let fstype = CString::new("hugetlbfs").unwrap_or_default();
    let data = CString::new(format!("pagesize={}K,mode=0700", page_size >> 10)).unwrap_or_default();
    let target = cstr(dir);
    // SAFETY: all pointers are valid NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
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
    // SAFETY: statfs is plain data; all-zero is valid and fstatfs overwrites it.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs on a caller's fd into a local struct.
    unsafe { libc::fstatfs(fd, &mut s) == 0 && s.f_type as i64 == HUGETLBFS_MAGIC }
}

/// Whether `dir` is (on) a hugetlbfs mount, looked at without following a final symlink.
pub fn is_hugetlbfs(dir: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(dir)
        .is_ok_and(|d| {
            use std::os::fd::AsRawFd;
            is_hugetlbfs_fd(d.as_raw_fd())
        })
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
    fn finds_mounts_by_page_size() {
        let mounts = "\
none /dev/hugepages hugetlbfs rw,relatime,pagesize=2M 0 0
none /mnt/huge1g hugetlbfs rw,relatime,pagesize=1024M 0 0
none /mnt/dflt hugetlbfs rw,relatime 0 0
tmpfs /tmp tmpfs rw 0 0
";
        assert_eq!(
            mounts_for(mounts, 2 << 20, Some(2 << 20)),
            vec![PathBuf::from("/dev/hugepages"), PathBuf::from("/mnt/dflt")]
        );
        assert_eq!(
            mounts_for(mounts, 1 << 30, Some(2 << 20)),
            vec![PathBuf::from("/mnt/huge1g")]
        );
        assert!(mounts_for(mounts, 4096, Some(2 << 20)).is_empty());
        assert_eq!(parse_page_size("pagesize=2048K"), Some(2 << 20));
        assert_eq!(parse_page_size("pagesize=1G"), Some(1 << 30));
        assert_eq!(parse_page_size("mode=0700"), None);
    }

    #[test]
    fn only_hugetlbfs_is_unmounted() {
        // Whatever a ledger names, a mount that is not hugetlbfs is left alone (this would
        // fail with EBUSY or EPERM otherwise; the refusal comes first and says why).
        for p in ["/", "/proc", "/nonexistent"] {
            assert!(!is_hugetlbfs(Path::new(p)), "{p}");
            let e = umount(Path::new(p)).unwrap_err();
            assert!(e.to_string().contains("not a hugetlbfs mount"), "{e}");
        }
        if let Some(m) = find_mount(2 << 20) {
            assert!(is_hugetlbfs(&m), "{}", m.display());
        }
    }
}
