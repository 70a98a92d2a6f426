//! Reading a user-named file, bounded: only regular files, and never more than a limit
//! (a `--plan /dev/zero` or a huge file must not take the host's memory).

use std::io::Read;
use std::path::Path;

/// Why a file was not read.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// open, stat or read failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// A directory, device, FIFO or socket.
    #[error("not a regular file")]
    NotRegular,
    /// Larger than the limit.
    #[error("larger than the {limit} bytes accepted")]
    TooLarge {
        /// The limit.
        limit: u64,
    },
}

/// Opens `path` for reading without waiting: a FIFO's open would block until a writer
/// came (issue 24: `--kernel FIFO` hung forever); O_NONBLOCK changes nothing for the
/// regular file the caller then checks it is.
pub fn open_nonblocking(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
}

/// The contents of regular file `path`, refused if it holds more than `limit` bytes (read
/// through a bound, so a file that grows while it is read is refused too). A FIFO, device
/// or socket is refused at once, never waited on.
pub fn read_limited(path: &Path, limit: u64) -> Result<Vec<u8>, FileError> {
    let f = open_nonblocking(path)?;
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(FileError::NotRegular);
    }
    if meta.len() > limit {
        return Err(FileError::TooLarge { limit });
    }
    let mut out = Vec::with_capacity(meta.len() as usize);
    f.take(limit.saturating_add(1)).read_to_end(&mut out)?;
    if out.len() as u64 > limit {
        return Err(FileError::TooLarge { limit });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_is_refused_without_waiting_for_a_writer() {
        let dir = std::env::temp_dir().join(format!("files-fifo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("fifo");
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo with a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // Without O_NONBLOCK this open would wait for a writer forever.
        assert!(matches!(
            read_limited(&p, 1 << 20),
            Err(FileError::NotRegular)
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn only_regular_files_within_the_limit() {
        let dir = std::env::temp_dir().join(format!("files-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("f");
        std::fs::write(&p, b"0123456789").unwrap();
        assert_eq!(read_limited(&p, 10).unwrap(), b"0123456789");
        assert!(matches!(
            read_limited(&p, 9),
            Err(FileError::TooLarge { limit: 9 })
        ));
        assert!(matches!(
            read_limited(&dir, 1 << 20),
            Err(FileError::NotRegular)
        ));
        assert!(matches!(
            read_limited(Path::new("/dev/zero"), 1 << 20),
            Err(FileError::NotRegular)
        ));
        assert!(matches!(
            read_limited(&dir.join("none"), 1),
            Err(FileError::Io(_))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
