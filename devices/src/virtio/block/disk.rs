//! A disk's backing: a regular file or a block device, opened buffered and (optionally)
//! with O_DIRECT, with the direct-I/O alignment probed from the file itself.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::request::SECTOR;

/// `BLKGETSIZE64`.
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
/// `BLKSSZGET`.
const BLKSSZGET: libc::c_ulong = 0x1268;

/// Errors opening a disk.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// open/stat failed.
    #[error("disk {path}: {what}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// Not a regular file or block device.
    #[error("disk {0}: not a regular file or block device")]
    Kind(PathBuf),
    /// A file nobody may write, asked for read-write (root could, but the owner said no).
    #[error("disk {0}: the file is read-only (no write permission for anyone); add readonly=on")]
    ReadOnlyFile(PathBuf),
    /// Empty, or not a whole number of sectors.
    #[error("disk {path}: {size} bytes is not a positive multiple of 512")]
    Size {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
    },
}

/// An open disk.
#[derive(Debug)]
pub struct Disk {
    /// Path, for messages.
    pub path: PathBuf,
    /// Buffered fd.
    pub file: File,
    /// O_DIRECT fd, when asked for.
    pub direct: Option<File>,
    /// Capacity in sectors.
    pub sectors: u64,
    /// Read-only.
    pub read_only: bool,
    /// Direct I/O: buffer address and length alignment.
    pub mem_align: u64,
    /// Direct I/O: file offset alignment.
    pub offset_align: u64,
    /// Block device (else a regular file).
    pub block_device: bool,
    /// The 20-byte device ID.
    pub id: [u8; 20],
}

fn dio_alignment(f: &File, block_device: bool) -> (u64, u64) {
    // SAFETY: statx is plain data; zero is a valid initial value.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    let empty = c"";
    // SAFETY: statx on our fd with AT_EMPTY_PATH writes one statx struct.
    let rc = unsafe {
        libc::statx(
            f.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut st,
        )
    };
    if rc == 0 && st.stx_mask & libc::STATX_DIOALIGN != 0 && st.stx_dio_offset_align != 0 {
        return (
            st.stx_dio_mem_align.max(1) as u64,
            st.stx_dio_offset_align as u64,
        );
    }
    if block_device {
        let mut ssz: libc::c_int = 0;
        // SAFETY: BLKSSZGET writes one int.
        if unsafe { libc::ioctl(f.as_raw_fd(), BLKSSZGET as _, &mut ssz) } == 0 && ssz > 0 {
            return (ssz as u64, ssz as u64);
        }
    }
    // The kernel would not say: the conservative classic answer.
    (4096, 4096)
}

impl Disk {
    /// Opens `path`; `direct` adds an O_DIRECT fd used for aligned requests. For tests
    /// and tools: a VMM given a user's path opens it once, safely, and calls
    /// [`Disk::from_file`].
    pub fn open(path: &Path, read_only: bool, direct: bool, id: &str) -> Result<Self, DiskError> {
        // O_NONBLOCK: a FIFO's open would wait for its other end forever; for the regular
        // file or block device it must be, it changes nothing.
        let file = OpenOptions::new()
            .read(true)
            .write(!read_only)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path)
            .map_err(|source| DiskError::Io {
                path: path.to_path_buf(),
                what: "open",
                source,
            })?;
        Self::from_file(file, path, read_only, direct, id)
    }

    /// The disk behind `file`, already open (read-write unless `read_only`) at `path` (for
    /// messages). With `direct`, its O_DIRECT descriptor is opened from `file` itself
    /// (through `/proc/self/fd`: the same inode, never the path again).
    pub fn from_file(
        file: File,
        path: &Path,
        read_only: bool,
        direct: bool,
        id: &str,
    ) -> Result<Self, DiskError> {
        let io = |what| {
            move |source| DiskError::Io {
                path: path.to_path_buf(),
                what,
                source,
            }
        };
        let open = |flags: i32| {
            OpenOptions::new()
                .read(true)
                .write(!read_only)
                .custom_flags(flags | libc::O_CLOEXEC)
                .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
        };
        let meta = file.metadata().map_err(io("stat"))?;
        let block_device = meta.file_type().is_block_device();
        if !meta.is_file() && !block_device {
            return Err(DiskError::Kind(path.to_path_buf()));
        }
        if !read_only && meta.is_file() && meta.permissions().mode() & 0o222 == 0 {
            return Err(DiskError::ReadOnlyFile(path.to_path_buf()));
        }
        let size = if block_device {
            let mut s: u64 = 0;
            // SAFETY: BLKGETSIZE64 writes one u64.
            if unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64 as _, &mut s) } != 0 {
                return Err(io("BLKGETSIZE64")(std::io::Error::last_os_error()));
            }
            s
        } else {
            meta.len()
        };
        if size == 0 || size % SECTOR != 0 {
            return Err(DiskError::Size {
                path: path.to_path_buf(),
                size,
            });
        }
        let direct = if direct {
            Some(open(libc::O_DIRECT).map_err(io("open with O_DIRECT"))?)
        } else {
            None
        };
        let (mem_align, offset_align) = dio_alignment(&file, block_device);
        let mut idb = [0u8; 20];
        let n = id.len().min(20);
        idb[..n].copy_from_slice(&id.as_bytes()[..n]);
        Ok(Self {
            path: path.to_path_buf(),
            file,
            direct,
            sectors: size / SECTOR,
            read_only,
            mem_align,
            offset_align,
            block_device,
            id: idb,
        })
    }

    /// The fd for an I/O at `offset` over buffers `bufs` (host address, length): the direct
    /// one when everything is aligned for it, else the buffered one.
    pub fn fd_for(&self, offset: u64, bufs: impl Iterator<Item = (u64, u64)>) -> (i32, bool) {
        if let Some(d) = &self.direct {
            let mut aligned = offset % self.offset_align == 0;
            for (addr, len) in bufs {
                aligned &= addr % self.mem_align == 0 && len % self.offset_align == 0;
            }
            if aligned {
                return (d.as_raw_fd(), true);
            }
        }
        (self.file.as_raw_fd(), false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_files_and_refuses_bad_ones() {
        let dir = std::env::temp_dir().join(format!("disk-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("d.img");
        std::fs::write(&p, vec![0u8; 1 << 20]).unwrap();
        let d = Disk::open(&p, false, true, "disk0").unwrap();
        assert_eq!(d.sectors, 2048);
        assert!(d.direct.is_some() || cfg!(not(target_os = "linux")));
        assert!(d.mem_align.is_power_of_two() && d.offset_align.is_power_of_two());
        assert_eq!(&d.id[..5], b"disk0");
        // Aligned I/O goes direct, unaligned buffered.
        let (fd, direct) = d.fd_for(0, [(4096u64, 4096u64)].into_iter());
        assert!(direct);
        assert_ne!(fd, d.file.as_raw_fd());
        let (fd, direct) = d.fd_for(0, [(4097u64, 4096u64)].into_iter());
        assert!(!direct);
        assert_eq!(fd, d.file.as_raw_fd());
        std::fs::write(dir.join("odd"), [1u8; 1000]).unwrap();
        assert!(matches!(
            Disk::open(&dir.join("odd"), true, false, "x"),
            Err(DiskError::Size { .. })
        ));
        std::fs::write(dir.join("empty"), []).unwrap();
        assert!(matches!(
            Disk::open(&dir.join("empty"), true, false, "x"),
            Err(DiskError::Size { .. })
        ));
        assert!(matches!(
            Disk::open(&dir, true, false, "x"),
            Err(DiskError::Kind(_)) | Err(DiskError::Io { .. })
        ));
        assert!(matches!(
            Disk::open(&dir.join("none"), true, false, "x"),
            Err(DiskError::Io { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
