//! The state directory, opened so that it cannot be turned against root.
//!
//! `partition` runs as root and the state directory is named on its command line
//! (`--state-dir`, `PARTITION_STATE_DIR`). A directory another user controls could hold a
//! forged ledger or plant symlinks where we write, so a state directory is used only when
//! it, and every directory above it, belongs to root (or to the user running `partition`)
//! and nobody else may write to it (a sticky directory such as /tmp may sit above it). It
//! is then held open, and every file in it is reached relative to that descriptor with
//! `O_NOFOLLOW`: renaming a directory above it or planting a symlink afterwards changes
//! nothing. Files read from it must belong to root (or us) and be writable by nobody else.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

/// Errors opening or using a state directory.
#[derive(Debug, thiserror::Error)]
pub enum StateDirError {
    /// The directory (or a file in it) is not one root can trust: the user's input.
    #[error("state directory {path}: {why}")]
    Untrusted {
        /// The path refused.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// A file operation failed.
    #[error("{path}: {what}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The operation.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// Whether metadata `m` describes something only root (or we) can change: owned by root or
/// by us, not writable by group or others, unless `sticky_ok` and the sticky bit is set
/// (then others cannot rename or remove what they do not own).
fn trust(m: &std::fs::Metadata, sticky_ok: bool) -> Result<(), String> {
    let me = euid();
    if m.uid() != 0 && m.uid() != me {
        return Err(format!("belongs to uid {}, not root", m.uid()));
    }
    let writable_by_others = m.mode() & 0o022 != 0;
    let sticky = m.mode() & 0o1000 != 0;
    if writable_by_others && !(sticky_ok && sticky) {
        return Err(format!(
            "mode {:o} lets group or others write to it",
            m.mode() & 0o7777
        ));
    }
    Ok(())
}

/// An absolute path with `.` and `..` resolved by name (no symlinks followed).
fn absolute(path: &Path) -> Result<PathBuf, std::io::Error> {
    let base = if path.is_absolute() {
        PathBuf::from("/")
    } else {
        std::env::current_dir()?
    };
    let mut out = base;
    for c in path.components() {
        match c {
            Component::RootDir | Component::Prefix(_) => out = PathBuf::from("/"),
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
        }
    }
    Ok(out)
}

fn cstr(name: &str) -> Result<CString, std::io::Error> {
    CString::new(name).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))
}

/// An open, trusted state directory.
#[derive(Debug)]
pub struct StateDir {
    path: PathBuf,
    fd: OwnedFd,
}

impl StateDir {
    /// Opens `path` (creating it, and missing parents, mode 0755, if `create`), after
    /// checking it and every directory above it.
    pub fn open(path: &Path, create: bool) -> Result<Self, StateDirError> {
        let io = |what| {
            let p = path.to_path_buf();
            move |source| StateDirError::Io {
                path: p,
                what,
                source,
            }
        };
        let abs = absolute(path).map_err(io("resolve"))?;
        // Walk down from /, each component opened relative to its parent without following
        // symlinks, each checked before we look inside it.
        // SAFETY: opening "/" as a directory; the fd is owned below.
        let root = unsafe { libc::open(c"/".as_ptr(), libc::O_DIRECTORY | libc::O_CLOEXEC) };
        if root < 0 {
            return Err(io("open /")(std::io::Error::last_os_error()));
        }
        // SAFETY: `root` is a fresh fd we own.
        let mut fd = unsafe { OwnedFd::from_raw_fd(root) };
        let mut at = PathBuf::from("/");
        let comps: Vec<_> = abs
            .components()
            .filter_map(|c| match c {
                Component::Normal(n) => Some(n.to_owned()),
                _ => None,
            })
            .collect();
        for (i, name) in comps.iter().enumerate() {
            let last = i + 1 == comps.len();
            let m = File::from(fd.try_clone().map_err(io("dup"))?)
                .metadata()
                .map_err(io("stat"))?;
            trust(&m, true).map_err(|why| StateDirError::Untrusted {
                path: path.to_path_buf(),
                why: format!("{} {why}", at.display()),
            })?;
            let c = CString::new(name.as_bytes()).map_err(|_| StateDirError::Untrusted {
                path: path.to_path_buf(),
                why: "a NUL in the path".into(),
            })?;
            let open_next = || {
                // SAFETY: openat relative to a directory fd we own, with a NUL-terminated
                // name.
                unsafe {
                    libc::openat(
                        fd.as_raw_fd(),
                        c.as_ptr(),
                        libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_RDONLY,
                    )
                }
            };
            let mut next = open_next();
            // A missing directory is made here, inside the one just checked (never by a
            // path that could lead through a link somewhere else), then opened and checked
            // like any other.
            if next < 0
                && create
                && std::io::Error::last_os_error().kind() == std::io::ErrorKind::NotFound
            {
                // SAFETY: mkdirat relative to a directory fd we own, with a NUL-terminated
                // name.
                let r = unsafe { libc::mkdirat(fd.as_raw_fd(), c.as_ptr(), 0o755) };
                if r < 0
                    && std::io::Error::last_os_error().kind() != std::io::ErrorKind::AlreadyExists
                {
                    return Err(io("create")(std::io::Error::last_os_error()));
                }
                next = open_next();
            }
            at.push(name);
            if next < 0 {
                let e = std::io::Error::last_os_error();
                return Err(match e.raw_os_error() {
                    Some(libc::ELOOP) | Some(libc::ENOTDIR) => StateDirError::Untrusted {
                        path: path.to_path_buf(),
                        why: format!("{} is a symlink or not a directory", at.display()),
                    },
                    _ => StateDirError::Io {
                        path: at,
                        what: "open",
                        source: e,
                    },
                });
            }
            // SAFETY: `next` is a fresh fd we own.
            fd = unsafe { OwnedFd::from_raw_fd(next) };
            if last {
                let m = File::from(fd.try_clone().map_err(io("dup"))?)
                    .metadata()
                    .map_err(io("stat"))?;
                trust(&m, false).map_err(|why| StateDirError::Untrusted {
                    path: path.to_path_buf(),
                    why: format!("it {why}"),
                })?;
            }
        }
        Ok(Self { path: abs, fd })
    }

    /// The directory's path (absolute).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path of `name` in it, for messages.
    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    fn err(&self, name: &str, what: &'static str) -> impl FnOnce(std::io::Error) -> StateDirError {
        let path = self.join(name);
        move |source| StateDirError::Io { path, what, source }
    }

    fn openat(&self, name: &str, flags: i32, mode: u32) -> Result<File, std::io::Error> {
        let c = cstr(name)?;
        // SAFETY: openat relative to our directory fd with a NUL-terminated name; the fd is
        // owned by the File.
        let fd = unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                // O_NONBLOCK: a FIFO put in place of a file must not hang the command (a
                // regular file reads and writes the same with it).
                flags | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK,
                mode as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a fresh fd we own.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    fn checked(&self, name: &str, f: File) -> Result<File, StateDirError> {
        let m = f.metadata().map_err(self.err(name, "stat"))?;
        if !m.is_file() {
            return Err(StateDirError::Untrusted {
                path: self.join(name),
                why: "not a regular file".into(),
            });
        }
        trust(&m, false).map_err(|why| StateDirError::Untrusted {
            path: self.join(name),
            why: format!("it {why}"),
        })?;
        Ok(f)
    }

    /// Opens regular file `name` for reading; None if it does not exist.
    pub fn read_file(&self, name: &str) -> Result<Option<File>, StateDirError> {
        match self.openat(name, libc::O_RDONLY, 0) {
            Ok(f) => self.checked(name, f).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => Err(StateDirError::Untrusted {
                path: self.join(name),
                why: "a symlink".into(),
            }),
            Err(e) => Err(self.err(name, "open")(e)),
        }
    }

    /// Opens (creating, mode 0600) regular file `name` for reading and writing.
    pub fn open_rw(&self, name: &str) -> Result<File, StateDirError> {
        let f = self
            .openat(name, libc::O_RDWR | libc::O_CREAT, 0o600)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP) => StateDirError::Untrusted {
                    path: self.join(name),
                    why: "a symlink".into(),
                },
                // A directory (or a FIFO without a reader) where the file goes.
                Some(libc::EISDIR) | Some(libc::ENXIO) => StateDirError::Untrusted {
                    path: self.join(name),
                    why: "not a regular file".into(),
                },
                _ => self.err(name, "open")(e),
            })?;
        self.checked(name, f)
    }

    /// Creates `name` afresh (mode 0600) for writing: whatever was there (a stale temporary
    /// file, or a planted symlink) is removed first, then the file is created exclusively.
    pub fn create_new(&self, name: &str) -> Result<File, StateDirError> {
        self.remove(name)?;
        self.openat(
            name,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC,
            0o600,
        )
        .map_err(self.err(name, "create"))
    }

    /// Renames `from` to `to`, both in this directory.
    pub fn rename(&self, from: &str, to: &str) -> Result<(), StateDirError> {
        let (a, b) = (
            cstr(from).map_err(self.err(from, "rename"))?,
            cstr(to).map_err(self.err(to, "rename"))?,
        );
        let d = self.fd.as_raw_fd();
        // SAFETY: renameat within our directory fd, NUL-terminated names.
        if unsafe { libc::renameat(d, a.as_ptr(), d, b.as_ptr()) } != 0 {
            return Err(self.err(to, "rename")(std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Removes file (or symlink) `name`; a missing one is fine.
    pub fn remove(&self, name: &str) -> Result<(), StateDirError> {
        let c = cstr(name).map_err(self.err(name, "remove"))?;
        // SAFETY: unlinkat within our directory fd (a symlink itself is removed, never its
        // target).
        if unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::NotFound {
                return Err(self.err(name, "remove")(e));
            }
        }
        Ok(())
    }

    /// Removes empty directory `name`; a missing one is fine.
    pub fn remove_dir(&self, name: &str) -> Result<(), StateDirError> {
        let c = cstr(name).map_err(self.err(name, "rmdir"))?;
        // SAFETY: unlinkat(AT_REMOVEDIR) within our directory fd.
        if unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), libc::AT_REMOVEDIR) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::NotFound {
                return Err(self.err(name, "rmdir")(e));
            }
        }
        Ok(())
    }

    /// Subdirectory `name`, created (mode 0755) if `create`; checked like the directory.
    pub fn subdir(&self, name: &str, create: bool) -> Result<Option<StateDir>, StateDirError> {
        let c = cstr(name).map_err(self.err(name, "mkdir"))?;
        if create {
            // SAFETY: mkdirat within our directory fd.
            if unsafe { libc::mkdirat(self.fd.as_raw_fd(), c.as_ptr(), 0o755) } != 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::AlreadyExists {
                    return Err(self.err(name, "mkdir")(e));
                }
            }
        }
        let d = match self.openat(name, libc::O_DIRECTORY | libc::O_RDONLY, 0) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENOTDIR)) => {
                return Err(StateDirError::Untrusted {
                    path: self.join(name),
                    why: "a symlink or not a directory".into(),
                });
            }
            Err(e) => return Err(self.err(name, "open")(e)),
        };
        let m = d.metadata().map_err(self.err(name, "stat"))?;
        trust(&m, false).map_err(|why| StateDirError::Untrusted {
            path: self.join(name),
            why: format!("it {why}"),
        })?;
        Ok(Some(StateDir {
            path: self.join(name),
            fd: d.into(),
        }))
    }

    /// Writes `data` to `name` atomically: a fresh temporary file, written whole, renamed
    /// over it. A reader sees the old file or the new one, and a writer that dies half way
    /// leaves the old one (and a `.tmp` the next writer replaces).
    ///
    /// Not fsynced: what the state directory records (hugepages, cpusets, IRQ affinities,
    /// running VMMs) does not outlive the host's boot, so a file that survived a power
    /// loss would describe nothing; on a systemd host the directory is on tmpfs anyway.
    /// The fsyncs cost launches waits for the file system's journal: a pool launch's
    /// claim took 254-406 ms in 3 of 20 launches of a memsetup run, with 1.0-1.2 ms of
    /// CPU (docs/pool.md).
    pub fn replace(&self, name: &str, data: &[u8]) -> Result<(), StateDirError> {
        use std::io::Write;
        let tmp = format!("{name}.tmp");
        {
            let mut f = self.create_new(&tmp)?;
            f.write_all(data).map_err(self.err(&tmp, "write"))?;
        }
        self.rename(&tmp, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::fs::PermissionsExt;

    fn scratch(tag: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("statedir-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        p
    }

    #[test]
    fn a_trusted_directory_reads_and_replaces_files_in_place() {
        let p = scratch("ok");
        let d = StateDir::open(&p, true).unwrap();
        assert!(d.read_file("ledger.json").unwrap().is_none());
        d.replace("ledger.json", b"{}\n").unwrap();
        let mut s = String::new();
        d.read_file("ledger.json")
            .unwrap()
            .unwrap()
            .read_to_string(&mut s)
            .unwrap();
        assert_eq!(s, "{}\n");
        assert!(!p.join("ledger.json.tmp").exists());
        let sub = d.subdir("stats", true).unwrap().unwrap();
        sub.open_rw("x").unwrap().write_all(b"1").unwrap();
        sub.remove("x").unwrap();
        d.remove_dir("stats").unwrap();
        d.remove("ledger.json").unwrap();
        d.remove("ledger.json").unwrap();
        std::fs::remove_dir(&p).unwrap();
    }

    #[test]
    fn symlinks_and_writable_directories_are_refused() {
        let p = scratch("evil");
        let d = StateDir::open(&p, true).unwrap();
        // A symlink planted where the temporary file goes is removed, not written through.
        let victim = p.with_extension("victim");
        std::fs::write(&victim, b"precious").unwrap();
        std::os::unix::fs::symlink(&victim, p.join("ledger.json.tmp")).unwrap();
        d.replace("ledger.json", b"new").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        // A symlinked ledger is not read.
        std::fs::remove_file(p.join("ledger.json")).unwrap();
        std::os::unix::fs::symlink(&victim, p.join("ledger.json")).unwrap();
        assert!(matches!(
            d.read_file("ledger.json"),
            Err(StateDirError::Untrusted { .. })
        ));
        assert!(matches!(
            d.open_rw("ledger.json"),
            Err(StateDirError::Untrusted { .. })
        ));
        // A ledger others may write is not trusted.
        std::fs::remove_file(p.join("ledger.json")).unwrap();
        std::fs::write(p.join("ledger.json"), b"{}").unwrap();
        std::fs::set_permissions(
            p.join("ledger.json"),
            std::fs::Permissions::from_mode(0o666),
        )
        .unwrap();
        assert!(matches!(
            d.read_file("ledger.json"),
            Err(StateDirError::Untrusted { .. })
        ));
        // A directory others may write is refused, and so is one below it.
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(
            StateDir::open(&p, false),
            Err(StateDirError::Untrusted { .. })
        ));
        std::fs::create_dir(p.join("inner")).unwrap();
        assert!(matches!(
            StateDir::open(&p.join("inner"), false),
            Err(StateDirError::Untrusted { .. })
        ));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        // A state directory that is a symlink is refused.
        let link = p.with_extension("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&p, &link).unwrap();
        assert!(matches!(
            StateDir::open(&link, false),
            Err(StateDirError::Untrusted { .. })
        ));
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            // Owned by another user.
            std::fs::create_dir(p.join("theirs")).unwrap();
            let c = CString::new(p.join("theirs").as_os_str().as_bytes()).unwrap();
            // SAFETY: chown of a directory we just made, to nobody.
            let r = unsafe { libc::chown(c.as_ptr(), 65534, 65534) };
            assert_eq!(r, 0);
            let e = StateDir::open(&p.join("theirs"), false).unwrap_err();
            assert!(e.to_string().contains("uid 65534"), "{e}");
        }
        std::fs::remove_file(&link).unwrap();
        std::fs::remove_file(&victim).unwrap();
        std::fs::remove_dir_all(&p).unwrap();
    }

    #[test]
    fn paths_are_made_absolute_by_name() {
        assert_eq!(
            absolute(Path::new("/a/./b/../c")).unwrap(),
            PathBuf::from("/a/c")
        );
        assert_eq!(absolute(Path::new("/../x")).unwrap(), PathBuf::from("/x"));
    }
}
