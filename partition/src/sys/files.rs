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
    /// A symbolic link root would follow out of a directory someone else controls.
    #[error(
        "{} is a symbolic link in a directory owned by uid {owner}: root does not follow it \
         (give the file's real path)",
        link.display()
    )]
    UntrustedSymlink {
        /// The link.
        link: std::path::PathBuf,
        /// Who owns the directory it is in (or the link, in a sticky directory).
        owner: u32,
    },
}

/// Refuses `path` when this process is root and resolving it would follow a symbolic link
/// that someone other than root controls: one in a directory not owned by root, or one
/// owned by another user in a sticky world-writable directory (/tmp; what the kernel's
/// `protected_symlinks` refuses too). Otherwise a local user could point `--console
/// DIR/serial.log` or `--disk path=DIR/disk.img` in their own directory at a root-only file
/// and have root overwrite it. Components that do not exist end the walk (the open that
/// follows fails, or creates the file with `O_NOFOLLOW`). Not root: the kernel's own
/// permission checks apply, nothing to add.
pub fn check_symlinks(path: &Path) -> Result<(), FileError> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(());
    }
    check_symlinks_for(path, 0)
}

/// `O_NOFOLLOW` when `path`'s directory is not root's (or this process's): the last
/// component is then opened only if it is not a link, whatever was put there after
/// [`check_symlinks`] looked (0 otherwise, so a root-owned link is still followed).
pub fn nofollow_in(path: &Path) -> i32 {
    use std::os::unix::fs::MetadataExt;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    match std::fs::metadata(dir) {
        Ok(m) if m.uid() == 0 || m.uid() == me => 0,
        _ => libc::O_NOFOLLOW,
    }
}

/// [`check_symlinks`] for a process of uid `me` (tests use their own).
pub fn check_symlinks_for(path: &Path, me: u32) -> Result<(), FileError> {
    use std::collections::VecDeque;
    use std::os::unix::fs::MetadataExt;
    use std::path::Component;
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()?.join(path)
    };
    let mut todo: VecDeque<std::ffi::OsString> = abs
        .components()
        .filter(|c| !matches!(c, Component::RootDir | Component::Prefix(_)))
        .map(|c| c.as_os_str().to_os_string())
        .collect();
    let mut cur = std::path::PathBuf::from("/");
    let mut links = 0;
    while let Some(c) = todo.pop_front() {
        if c == "." {
            continue;
        }
        if c == ".." {
            cur.pop();
            continue;
        }
        let next = cur.join(&c);
        let Ok(m) = std::fs::symlink_metadata(&next) else {
            return Ok(());
        };
        if !m.file_type().is_symlink() {
            cur = next;
            continue;
        }
        let dir = std::fs::metadata(&cur)?;
        let sticky_shared = dir.mode() & 0o1002 == 0o1002;
        let owner = if dir.uid() != 0 && dir.uid() != me {
            Some(dir.uid())
        } else if sticky_shared && m.uid() != dir.uid() && m.uid() != me {
            Some(m.uid())
        } else {
            None
        };
        if let Some(owner) = owner {
            return Err(FileError::UntrustedSymlink { link: next, owner });
        }
        links += 1;
        if links > 40 {
            return Err(std::io::Error::from_raw_os_error(libc::ELOOP).into());
        }
        let target = std::fs::read_link(&next)?;
        if target.is_absolute() {
            cur = std::path::PathBuf::from("/");
        }
        for t in target.components().rev() {
            if !matches!(t, Component::RootDir | Component::Prefix(_)) {
                todo.push_front(t.as_os_str().to_os_string());
            }
        }
    }
    Ok(())
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
/// or socket is refused at once, never waited on; a symbolic link root should not follow
/// ([`check_symlinks`]) too.
pub fn read_limited(path: &Path, limit: u64) -> Result<Vec<u8>, FileError> {
    check_symlinks(path)?;
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
    fn symlinks_in_directories_someone_else_controls_are_not_followed() {
        use std::os::unix::fs::{PermissionsExt, symlink};
        let dir = std::env::temp_dir().join(format!("files-links-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("mine")).unwrap();
        std::fs::write(dir.join("secret"), b"root only").unwrap();
        symlink(dir.join("secret"), dir.join("mine/serial.log")).unwrap();
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        // `mine` belongs to someone else than the checking uid `other`: as root, the
        // directory is given to uid 4242 and root checks; otherwise it is ours and a
        // made-up uid checks.
        let (owner_of_mine, other) = if me == 0 {
            std::os::unix::fs::chown(dir.join("mine"), Some(4242), Some(4242)).unwrap();
            (4242, 0)
        } else {
            (me, me.wrapping_add(4242))
        };
        // Its owner follows its own links.
        assert!(check_symlinks_for(&dir.join("mine/serial.log"), owner_of_mine).is_ok());
        match check_symlinks_for(&dir.join("mine/serial.log"), other) {
            Err(FileError::UntrustedSymlink { link, owner }) => {
                assert_eq!(link, dir.join("mine/serial.log"));
                assert_eq!(owner, owner_of_mine);
            }
            r => panic!("{r:?}"),
        }
        // A link earlier in the path counts too; a path with no link passes; a missing
        // file ends the walk.
        symlink(dir.join("mine"), dir.join("mine/alias")).unwrap();
        assert!(matches!(
            check_symlinks_for(&dir.join("mine/alias/x"), other),
            Err(FileError::UntrustedSymlink { .. })
        ));
        assert!(check_symlinks_for(&dir.join("secret"), other).is_ok());
        assert!(check_symlinks_for(&dir.join("mine/nothing"), other).is_ok());
        // A sticky world-writable directory (as /tmp) of ours: a link in it owned by
        // someone else is not followed (as the kernel's protected_symlinks has it); our own
        // is.
        let sticky = dir.join("sticky");
        std::fs::create_dir(&sticky).unwrap();
        std::fs::set_permissions(&sticky, std::fs::Permissions::from_mode(0o1777)).unwrap();
        symlink(dir.join("secret"), sticky.join("l")).unwrap();
        assert!(check_symlinks_for(&sticky.join("l"), me).is_ok());
        if me == 0 {
            std::os::unix::fs::lchown(sticky.join("l"), Some(4242), Some(4242)).unwrap();
            assert!(matches!(
                check_symlinks_for(&sticky.join("l"), 0),
                Err(FileError::UntrustedSymlink { owner: 4242, .. })
            ));
        }
        // A loop is refused, not walked for ever.
        symlink(dir.join("loop"), dir.join("loop")).unwrap();
        assert!(check_symlinks_for(&dir.join("loop"), me).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

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
