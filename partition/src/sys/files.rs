//! Opening a user-named path once, by descriptors, without following a link someone else
//! controls; and reading a file bounded.
//!
//! `partition` runs as root and is given paths in directories other users own (`--disk
//! ~user/disk.img`, `--console ~user/serial.log`). Checking a path and then opening it by
//! name again can be raced: between the two, the user swaps the file, or a directory on
//! the way, for a link to a root-only file, and root opens that (issue 33's audit: root's
//! file overwritten through `--disk`, read through `--kernel`, truncated through
//! `--console`). So every such path is opened by [`open`]: walked from `/` (or the working
//! directory) one component at a time, each opened relative to the descriptor of the one
//! before with `O_PATH | O_NOFOLLOW`; a symbolic link is read through its own descriptor and
//! followed only if the trust rule below allows it, and the last component is opened
//! relative to its directory's descriptor with `O_NOFOLLOW`. What is checked is what is
//! opened, and the caller gets the open file: nothing is opened by name twice.
//!
//! **The trust rule** (for root; another user gets the kernel's own permission checks): a
//! link is followed when the directory holding it belongs to root or to the caller and no
//! one else may write to it, or it is a sticky directory (`/tmp`) and the link belongs to
//! the directory's owner or the caller (the kernel's `protected_symlinks` rule, which this
//! host does not enforce). Any other link is refused, naming it and who controls it. A file
//! with more than one name, in a directory someone else controls and owned by another than
//! that directory's owner, is refused too (a hard link to a root-only file planted there;
//! `protected_hardlinks` normally prevents it). `/proc`'s magic links (`/dev/stdout`,
//! `/proc/self/fd/N`) are followed by the kernel, only from a directory that passes the
//! same rule.

use std::ffi::{CString, OsString};
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};

/// Why a file was not opened or read.
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
        "{} is a symbolic link in a directory controlled by uid {owner}: root does not follow it \
         (give the file's real path)",
        link.display()
    )]
    UntrustedSymlink {
        /// The link.
        link: PathBuf,
        /// Who controls it: the directory's owner, or the link's in a sticky directory.
        owner: u32,
    },
    /// A second name of someone else's file, in a directory a user controls.
    #[error(
        "{} is a hard link to a file of uid {file_owner} in a directory controlled by uid \
         {owner}: root does not open it (give the file's real path)",
        path.display()
    )]
    UntrustedHardlink {
        /// The name.
        path: PathBuf,
        /// The directory's owner.
        owner: u32,
        /// The file's owner.
        file_owner: u32,
    },
    /// More links than the kernel itself would follow (a loop).
    #[error("{}: too many symbolic links (a loop?)", path.display())]
    Loop {
        /// Where the walk was.
        path: PathBuf,
    },
    /// An empty path or one with a NUL byte.
    #[error("{0:?} is not a path")]
    BadPath(PathBuf),
    /// A directory on the way failed (the path given is not where it failed).
    #[error("{}: {source}", at.display())]
    At {
        /// The component that failed.
        at: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

impl FileError {
    /// Whether the path itself was refused (a usage error: exit status 2), rather than the
    /// system failing.
    pub fn is_refusal(&self) -> bool {
        match self {
            Self::Io(e) | Self::At { source: e, .. } => matches!(
                e.raw_os_error(),
                Some(
                    libc::ENOENT
                        | libc::ENOTDIR
                        | libc::EACCES
                        | libc::EPERM
                        | libc::EISDIR
                        | libc::ENXIO
                        | libc::ELOOP
                        | libc::EROFS
                        | libc::ETXTBSY
                        | libc::ENAMETOOLONG
                        | libc::EEXIST
                )
            ),
            _ => true,
        }
    }

    /// The underlying I/O error, if that is what it is.
    pub fn io(&self) -> Option<&std::io::Error> {
        match self {
            Self::Io(e) | Self::At { source: e, .. } => Some(e),
            _ => None,
        }
    }
}

/// How the last component is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct How {
    /// open(2) flags (`O_CLOEXEC` and `O_NOFOLLOW` are added).
    pub flags: i32,
    /// Create it (mode `mode`) if it does not exist.
    pub create: bool,
    /// Mode of a created file.
    pub mode: u32,
}

impl How {
    /// Read only, without waiting (a FIFO's open would wait for a writer).
    pub const READ: Self = Self {
        flags: libc::O_RDONLY | libc::O_NONBLOCK,
        create: false,
        mode: 0,
    };
    /// Read and write, without waiting.
    pub const READ_WRITE: Self = Self {
        flags: libc::O_RDWR | libc::O_NONBLOCK,
        create: false,
        mode: 0,
    };
    /// Write, created (0644) if missing and truncated if present, without waiting.
    pub const CREATE_TRUNCATE: Self = Self {
        flags: libc::O_WRONLY | libc::O_TRUNC | libc::O_NONBLOCK,
        create: true,
        mode: 0o644,
    };
    /// Write, created (0644) if missing, without truncating (the caller checks what it got
    /// before it truncates).
    pub const CREATE_WRITE: Self = Self {
        flags: libc::O_WRONLY | libc::O_NONBLOCK,
        create: true,
        mode: 0o644,
    };
    /// A directory, as an `O_PATH` descriptor to open or bind things relative to.
    pub const DIRECTORY: Self = Self {
        flags: libc::O_PATH | libc::O_DIRECTORY,
        create: false,
        mode: 0,
    };
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

fn cstr(name: &[u8]) -> std::io::Result<CString> {
    CString::new(name).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))
}

fn openat(dir: RawFd, name: &[u8], flags: i32, mode: u32) -> std::io::Result<OwnedFd> {
    let c = cstr(name)?;
    // SAFETY: openat relative to a descriptor we hold, with a NUL-terminated name; the new
    // descriptor is owned below.
    let fd = unsafe { libc::openat(dir, c.as_ptr(), flags | libc::O_CLOEXEC, mode) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn fstat(fd: RawFd) -> std::io::Result<libc::stat> {
    // SAFETY: stat is plain data; all-zero is valid.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat on a descriptor we hold writes one stat.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st)
}

fn is_kind(st: &libc::stat, kind: libc::mode_t) -> bool {
    st.st_mode & libc::S_IFMT == kind
}

/// The text of the symbolic link `fd` (an `O_PATH | O_NOFOLLOW` descriptor of it).
fn readlink_fd(fd: RawFd) -> std::io::Result<OsString> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: readlinkat with an empty name reads the link `fd` itself into our buffer.
    let n = unsafe { libc::readlinkat(fd, c"".as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(OsString::from_vec(buf))
}

/// Whether `dir` is a directory of procfs other than its root: its links are the kernel's
/// magic links (`/proc/PID/fd/N`, `cwd`, `root`, `exe`), whose text is not a path to walk.
fn in_proc_below_root(dir: RawFd, dir_st: &libc::stat) -> bool {
    const PROC_SUPER_MAGIC: i64 = 0x9fa0;
    const PROC_ROOT_INO: u64 = 1;
    // SAFETY: statfs is plain data; all-zero is valid.
    let mut sf: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs on a descriptor we hold writes one statfs.
    let ok = unsafe { libc::fstatfs(dir, &mut sf) } == 0;
    ok && sf.f_type as i64 == PROC_SUPER_MAGIC && dir_st.st_ino != PROC_ROOT_INO
}

/// Who controls the entries of directory `dir` beyond root and `me`, if anyone: its owner
/// when that is someone else, or anyone at all when others may write to it without the
/// sticky bit (`u32::MAX` then stands for "anyone").
fn dir_controller(dir: &libc::stat, me: u32) -> Option<u32> {
    if dir.st_uid != 0 && dir.st_uid != me {
        return Some(dir.st_uid);
    }
    let others_write = dir.st_mode & 0o022 != 0;
    let sticky = dir.st_mode & 0o1000 != 0;
    if others_write && !sticky {
        return Some(u32::MAX);
    }
    None
}

/// Who controls link `link` in `dir` such that root must not follow it, if anyone.
fn untrusted_link(dir: &libc::stat, link: &libc::stat, me: u32) -> Option<u32> {
    if let Some(who) = dir_controller(dir, me) {
        return Some(if who == u32::MAX { link.st_uid } else { who });
    }
    let sticky_shared = dir.st_mode & 0o1002 == 0o1002;
    if sticky_shared && link.st_uid != dir.st_uid && link.st_uid != me {
        return Some(link.st_uid);
    }
    None
}

/// Opens `path` as `how` says, walking it by descriptors (module docs). The file is checked
/// for nothing else (kind, size): the caller does that on what it got.
pub fn open(path: &Path, how: How) -> Result<File, FileError> {
    let me = euid();
    // Not root: the kernel's permission checks are the rule; links are followed.
    open_as(path, how, if me == 0 { Some(0) } else { None })
}

/// Most symbolic links followed in one walk (the kernel's own limit).
const MAX_LINKS: usize = 40;

/// [`open`] with the trust rule of uid `me` (None: follow every link).
pub fn open_as(path: &Path, how: How, me: Option<u32>) -> Result<File, FileError> {
    if path.as_os_str().is_empty() || path.as_os_str().as_bytes().contains(&0) {
        return Err(FileError::BadPath(path.to_path_buf()));
    }
    let dir_flags = libc::O_PATH | libc::O_DIRECTORY;
    let (mut dir, mut shown) = if path.is_absolute() {
        (
            openat(libc::AT_FDCWD, b"/", dir_flags, 0)?,
            PathBuf::from("/"),
        )
    } else {
        (openat(libc::AT_FDCWD, b".", dir_flags, 0)?, PathBuf::new())
    };
    // What is left to walk, last component first.
    let mut todo: Vec<OsString> = Vec::new();
    push_components(&mut todo, path);
    let mut links = 0usize;
    let mut races = 0usize;
    loop {
        let Some(name) = todo.pop() else {
            // The walk ended on a directory itself (`/`, `a/..`).
            return finish_on_dir(&dir, how).map_err(FileError::Io);
        };
        let last = todo.is_empty();
        let bytes = name.as_bytes().to_vec();
        if bytes == b"." {
            if last {
                return finish_on_dir(&dir, how).map_err(FileError::Io);
            }
            continue;
        }
        if bytes == b".." {
            dir = openat(dir.as_raw_fd(), b"..", dir_flags, 0)?;
            shown.pop();
            if last {
                return finish_on_dir(&dir, how).map_err(FileError::Io);
            }
            continue;
        }
        let at = shown.join(&name);
        let probe = match openat(dir.as_raw_fd(), &bytes, libc::O_PATH | libc::O_NOFOLLOW, 0) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) && last && how.create => {
                // Made here, inside the directory just walked, exclusively: if something
                // appeared meanwhile, walk it again.
                match openat(
                    dir.as_raw_fd(),
                    &bytes,
                    how.flags | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
                    how.mode,
                ) {
                    Ok(fd) => return Ok(File::from(fd)),
                    Err(e) if e.raw_os_error() == Some(libc::EEXIST) && races < 8 => {
                        races += 1;
                        todo.push(name);
                        continue;
                    }
                    Err(e) => return Err(with_path(e, &at, path)),
                }
            }
            Err(e) => return Err(with_path(e, &at, path)),
        };
        let st = fstat(probe.as_raw_fd())?;
        if is_kind(&st, libc::S_IFLNK) {
            let dir_st = fstat(dir.as_raw_fd())?;
            if let Some(me) = me {
                if let Some(owner) = untrusted_link(&dir_st, &st, me) {
                    return Err(FileError::UntrustedSymlink { link: at, owner });
                }
            }
            links += 1;
            if links > MAX_LINKS {
                return Err(FileError::Loop { path: at });
            }
            if in_proc_below_root(dir.as_raw_fd(), &dir_st) {
                // A magic link: the kernel follows it to the object itself, from the
                // directory we hold (which the rule above let us use).
                let flags = if last { how.flags } else { dir_flags };
                let fd = openat(dir.as_raw_fd(), &bytes, flags, how.mode)
                    .map_err(|e| with_path(e, &at, path))?;
                if last {
                    return Ok(File::from(fd));
                }
                dir = fd;
                shown = at;
                continue;
            }
            let target = readlink_fd(probe.as_raw_fd())?;
            let target = Path::new(&target);
            if target.is_absolute() {
                dir = openat(libc::AT_FDCWD, b"/", dir_flags, 0)?;
                shown = PathBuf::from("/");
            }
            push_components(&mut todo, target);
            if todo.is_empty() {
                return finish_on_dir(&dir, how).map_err(FileError::Io);
            }
            continue;
        }
        if !last {
            if !is_kind(&st, libc::S_IFDIR) {
                return Err(with_path(
                    std::io::Error::from_raw_os_error(libc::ENOTDIR),
                    &at,
                    path,
                ));
            }
            dir = probe;
            shown = at;
            continue;
        }
        if how.flags & libc::O_PATH != 0 {
            if how.flags & libc::O_DIRECTORY != 0 && !is_kind(&st, libc::S_IFDIR) {
                return Err(with_path(
                    std::io::Error::from_raw_os_error(libc::ENOTDIR),
                    &at,
                    path,
                ));
            }
            return Ok(File::from(probe));
        }
        let fd = match openat(
            dir.as_raw_fd(),
            &bytes,
            how.flags | libc::O_NOFOLLOW,
            how.mode,
        ) {
            Ok(fd) => fd,
            // It became a link since the probe: walk it again, as a link this time.
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) && races < 8 => {
                races += 1;
                todo.push(name);
                continue;
            }
            Err(e) => return Err(with_path(e, &at, path)),
        };
        if let Some(me) = me {
            let dir_st = fstat(dir.as_raw_fd())?;
            let f_st = fstat(fd.as_raw_fd())?;
            if let Some(who) = dir_controller(&dir_st, me) {
                let owner = if who == u32::MAX { dir_st.st_uid } else { who };
                if is_kind(&f_st, libc::S_IFREG) && f_st.st_nlink > 1 && f_st.st_uid != owner {
                    return Err(FileError::UntrustedHardlink {
                        path: at,
                        owner,
                        file_owner: f_st.st_uid,
                    });
                }
            }
        }
        return Ok(File::from(fd));
    }
}

/// `path`'s components onto `todo` so that the first is popped first.
fn push_components(todo: &mut Vec<OsString>, path: &Path) {
    let mut comps: Vec<OsString> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            Component::CurDir => Some(OsString::from(".")),
            Component::RootDir | Component::Prefix(_) => None,
        })
        .collect();
    comps.reverse();
    todo.extend(comps);
}

/// The walk ended on directory `dir`: it is what was asked for, or it is opened as asked.
fn finish_on_dir(dir: &OwnedFd, how: How) -> std::io::Result<File> {
    if how.flags & libc::O_PATH != 0 {
        return Ok(File::from(dir.try_clone()?));
    }
    if how.create && how.flags & (libc::O_WRONLY | libc::O_RDWR) != 0 {
        return Err(std::io::Error::from_raw_os_error(libc::EISDIR));
    }
    openat(dir.as_raw_fd(), b".", how.flags & !libc::O_TRUNC, 0).map(File::from)
}

/// `e` at component `at` of the walk: named when it is not simply the path given.
fn with_path(e: std::io::Error, at: &Path, given: &Path) -> FileError {
    if at == given {
        FileError::Io(e)
    } else {
        FileError::At {
            at: at.to_path_buf(),
            source: e,
        }
    }
}

/// A directory opened by [`open`] (`How::DIRECTORY`) and a name in it: where something is
/// made or bound by descriptor (the API socket), never by the path again.
#[derive(Debug)]
pub struct DirEntry {
    /// The directory's `O_PATH` descriptor.
    pub dir: File,
    /// The last component.
    pub name: OsString,
}

impl DirEntry {
    /// Opens `path`'s directory by [`open`] and keeps its last component.
    pub fn of(path: &Path) -> Result<Self, FileError> {
        let name = match path.components().next_back() {
            Some(Component::Normal(n)) => n.to_os_string(),
            _ => return Err(FileError::BadPath(path.to_path_buf())),
        };
        let parent = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        Ok(Self {
            dir: open(parent, How::DIRECTORY)?,
            name,
        })
    }

    /// The entry as a path through this process's descriptor of its directory
    /// (`/proc/self/fd/N/NAME`): for calls that take only a path (bind), so that the
    /// directory is the one held, whatever was renamed since.
    pub fn fd_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.dir.as_raw_fd())).join(&self.name)
    }

    /// The entry's `stat` without following a link; None if nothing is there.
    pub fn lstat(&self) -> std::io::Result<Option<libc::stat>> {
        let c = cstr(self.name.as_bytes())?;
        // SAFETY: stat is plain data; all-zero is valid.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstatat relative to our directory descriptor, not following a link.
        let r = unsafe {
            libc::fstatat(
                self.dir.as_raw_fd(),
                c.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENOENT) => Ok(None),
                _ => Err(e),
            };
        }
        Ok(Some(st))
    }

    /// Removes the entry (a link itself, never what it points to).
    pub fn unlink(&self) -> std::io::Result<()> {
        let c = cstr(self.name.as_bytes())?;
        // SAFETY: unlinkat relative to our directory descriptor.
        if unsafe { libc::unlinkat(self.dir.as_raw_fd(), c.as_ptr(), 0) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// An `O_PATH | O_NOFOLLOW` descriptor of the entry, to change it through (fchownat
    /// with `AT_EMPTY_PATH`, chmod through `/proc/self/fd`) without a second lookup.
    pub fn open_path(&self) -> std::io::Result<File> {
        openat(
            self.dir.as_raw_fd(),
            self.name.as_bytes(),
            libc::O_PATH | libc::O_NOFOLLOW,
            0,
        )
        .map(File::from)
    }
}

/// The contents of regular file `path`, opened by [`open`], refused if it holds more than
/// `limit` bytes (read through a bound, so a file that grows while it is read is refused
/// too). A FIFO, device or socket is refused at once, never waited on.
pub fn read_limited(path: &Path, limit: u64) -> Result<Vec<u8>, FileError> {
    read_file_limited(open(path, How::READ)?, limit)
}

/// [`read_limited`] of a file already open.
pub fn read_file_limited(f: File, limit: u64) -> Result<Vec<u8>, FileError> {
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

/// Writes `bytes` to `path` (created with `mode`, or truncated if it is a regular file),
/// opened by [`open`]: a `-o` output of root's.
pub fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), FileError> {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let mut f = open(
        path,
        How {
            mode,
            ..How::CREATE_WRITE
        },
    )?;
    if !f.metadata()?.is_file() {
        return Err(FileError::NotRegular);
    }
    f.set_len(0)?;
    f.write_all(bytes)?;
    f.set_permissions(std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{PermissionsExt, symlink};

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("files-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn read(p: &Path, me: Option<u32>) -> Result<Vec<u8>, FileError> {
        read_file_limited(open_as(p, How::READ, me)?, 1 << 20)
    }

    #[test]
    fn links_in_directories_someone_else_controls_are_not_followed() {
        let dir = scratch("links");
        std::fs::create_dir_all(dir.join("mine")).unwrap();
        std::fs::write(dir.join("secret"), b"root only").unwrap();
        symlink(dir.join("secret"), dir.join("mine/serial.log")).unwrap();
        let me = euid();
        // `mine` belongs to someone else than the checking uid `other`: as root, the
        // directory is given to uid 4242 and root checks; otherwise it is ours and a
        // made-up uid checks.
        let (owner_of_mine, other) = if me == 0 {
            std::os::unix::fs::chown(dir.join("mine"), Some(4242), Some(4242)).unwrap();
            (4242, 0)
        } else {
            (me, me.wrapping_add(4242))
        };
        // Its owner follows its own links; without a rule every link is followed.
        assert_eq!(
            read(&dir.join("mine/serial.log"), Some(owner_of_mine)).unwrap(),
            b"root only"
        );
        assert!(read(&dir.join("mine/serial.log"), None).is_ok());
        match read(&dir.join("mine/serial.log"), Some(other)) {
            Err(FileError::UntrustedSymlink { link, owner }) => {
                assert_eq!(link, dir.join("mine/serial.log"));
                assert_eq!(owner, owner_of_mine);
            }
            r => panic!("{r:?}"),
        }
        // A link earlier in the path counts too (a directory swapped for a link); a path
        // with no link opens; a missing file is an error naming it.
        std::fs::create_dir(dir.join("real")).unwrap();
        std::fs::write(dir.join("real/x"), b"x").unwrap();
        symlink(dir.join("real"), dir.join("mine/alias")).unwrap();
        assert!(matches!(
            read(&dir.join("mine/alias/x"), Some(other)),
            Err(FileError::UntrustedSymlink { .. })
        ));
        // A directory on the way that is missing is named.
        match read(&dir.join("gone/x"), Some(other)) {
            Err(e @ FileError::At { .. }) => assert!(e.to_string().contains("gone"), "{e}"),
            r => panic!("{r:?}"),
        }
        assert_eq!(
            read(&dir.join("secret"), Some(other)).unwrap(),
            b"root only"
        );
        match read(&dir.join("mine/nothing"), Some(other)) {
            Err(FileError::Io(e)) => assert_eq!(e.kind(), std::io::ErrorKind::NotFound),
            r => panic!("{r:?}"),
        }
        // A link in a directory of the checking uid's (here: root's scratch) is followed,
        // relative targets and `..` included.
        symlink("real/../secret", dir.join("rel")).unwrap();
        assert_eq!(read(&dir.join("rel"), Some(me)).unwrap(), b"root only");
        // A sticky world-writable directory (as /tmp) of ours: a link in it owned by
        // someone else is not followed (as the kernel's protected_symlinks has it); our own
        // is.
        let sticky = dir.join("sticky");
        std::fs::create_dir(&sticky).unwrap();
        std::fs::set_permissions(&sticky, std::fs::Permissions::from_mode(0o1777)).unwrap();
        symlink(dir.join("secret"), sticky.join("l")).unwrap();
        assert!(read(&sticky.join("l"), Some(me)).is_ok());
        if me == 0 {
            std::os::unix::fs::lchown(sticky.join("l"), Some(4242), Some(4242)).unwrap();
            assert!(matches!(
                read(&sticky.join("l"), Some(0)),
                Err(FileError::UntrustedSymlink { owner: 4242, .. })
            ));
        }
        // A world-writable directory without the sticky bit: anyone may replace a link
        // there, so none is followed, even root's own.
        let open_dir = dir.join("open");
        std::fs::create_dir(&open_dir).unwrap();
        std::fs::set_permissions(&open_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        symlink(dir.join("secret"), open_dir.join("l")).unwrap();
        assert!(matches!(
            read(&open_dir.join("l"), Some(me)),
            Err(FileError::UntrustedSymlink { .. })
        ));
        // A loop is refused, not walked for ever.
        symlink(dir.join("loop"), dir.join("loop")).unwrap();
        assert!(matches!(
            read(&dir.join("loop"), Some(me)),
            Err(FileError::Loop { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_hard_link_to_someone_elses_file_in_a_users_directory_is_refused() {
        if euid() != 0 {
            skip::skip(
                "partition::sys::files::a_hard_link_to_someone_elses_file_in_a_users_directory_is_refused",
                "needs root to give a directory to another uid",
            );
            return;
        }
        let dir = scratch("hard");
        std::fs::create_dir(dir.join("user")).unwrap();
        std::fs::write(dir.join("secret"), b"root only").unwrap();
        std::fs::hard_link(dir.join("secret"), dir.join("user/disk.img")).unwrap();
        std::os::unix::fs::chown(dir.join("user"), Some(4242), Some(4242)).unwrap();
        assert!(matches!(
            read(&dir.join("user/disk.img"), Some(0)),
            Err(FileError::UntrustedHardlink {
                owner: 4242,
                file_owner: 0,
                ..
            })
        ));
        // The user's own file with two names is theirs to give.
        std::fs::write(dir.join("user/own"), b"mine").unwrap();
        std::os::unix::fs::chown(dir.join("user/own"), Some(4242), Some(4242)).unwrap();
        std::fs::hard_link(dir.join("user/own"), dir.join("user/own2")).unwrap();
        assert_eq!(read(&dir.join("user/own2"), Some(0)).unwrap(), b"mine");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn magic_links_and_relative_paths_open_what_they_name() {
        let dir = scratch("magic");
        std::fs::write(dir.join("f"), b"through the descriptor").unwrap();
        let f = File::open(dir.join("f")).unwrap();
        let magic = PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()));
        assert_eq!(
            read(&magic, Some(euid())).unwrap(),
            b"through the descriptor"
        );
        // /dev/null is a device: opened, then refused by the regular-file check.
        assert!(matches!(
            read(Path::new("/dev/null"), Some(euid())),
            Err(FileError::NotRegular)
        ));
        // A relative path from the working directory (the test's: the crate's).
        let rel = Path::new("src/sys/files.rs");
        assert!(read(rel, Some(euid())).is_ok());
        assert!(matches!(
            open_as(Path::new(""), How::READ, None),
            Err(FileError::BadPath(_))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn files_are_created_where_the_walk_ended_and_never_through_a_link() {
        let dir = scratch("create");
        let p = dir.join("serial.log");
        {
            use std::io::Write;
            let mut f = open_as(&p, How::CREATE_TRUNCATE, Some(euid())).unwrap();
            f.write_all(b"first").unwrap();
        }
        assert_eq!(std::fs::read(&p).unwrap(), b"first");
        open_as(&p, How::CREATE_TRUNCATE, Some(euid())).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"");
        write_new(&dir.join("out"), b"elf", 0o755).unwrap();
        let m = std::fs::metadata(dir.join("out")).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o755);
        assert_eq!(std::fs::read(dir.join("out")).unwrap(), b"elf");
        // A directory asked for as one, and a file asked for as a directory.
        let d = open_as(&dir, How::DIRECTORY, Some(euid())).unwrap();
        assert!(d.metadata().unwrap().is_dir());
        assert!(open_as(&p, How::DIRECTORY, Some(euid())).is_err());
        let e = DirEntry::of(&dir.join("sock")).unwrap();
        assert!(e.lstat().unwrap().is_none());
        assert!(e.fd_path().starts_with("/proc/self/fd"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_fifo_is_refused_without_waiting_for_a_writer() {
        let dir = scratch("fifo");
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
        let dir = scratch("limit");
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
