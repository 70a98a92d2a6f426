//! Where `partition bench` writes on a user's behalf: the results file, its set-aside copy,
//! the report and the charts, in a directory the user names (`--results DIR/host.json`),
//! as root.
//!
//! Nothing there is opened by name: the directory is walked to once by descriptors
//! (`partition::sys::files`, the launch's walk: no link the trust rule forbids is
//! followed), each missing directory made relative to the one before it and opened without
//! following a link, and a file is replaced by writing a temporary made with `O_EXCL |
//! O_NOFOLLOW` under an unguessable name and renaming it over the name. A link a user
//! planted at the name is replaced by the rename, never written through (issue 52's audit:
//! `nobody` linked `r.md` to a root-only file and root's `bench --report` wrote the report
//! into it).

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use partition::sys::files::{self, How};

/// A directory held open, to make files in.
#[derive(Debug)]
pub struct OutDir {
    dir: File,
    path: PathBuf,
}

fn cstr(name: &OsStr) -> Result<CString, String> {
    CString::new(name.as_bytes()).map_err(|_| format!("{name:?}: not a file name"))
}

use pool::poolfile::openat;

/// A temporary's name nobody can guess (`O_EXCL` refuses a planted one all the same).
fn temp_name(of: &OsStr) -> std::ffi::OsString {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most `b.len()` bytes into a local array.
    unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    let tag: String = b.iter().map(|x| format!("{x:02x}")).collect();
    let mut n = std::ffi::OsString::from(".");
    n.push(of);
    n.push(format!(".{tag}.tmp"));
    n
}

impl OutDir {
    /// Directory `path`, made where it is missing (mode 0755), every component walked to or
    /// made by descriptor.
    pub fn make(path: &Path) -> Result<Self, String> {
        let shown = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
        // The deepest directory that exists, opened by the walk; the rest made below it.
        let mut missing = Vec::new();
        let mut at = path;
        let mut dir = loop {
            match files::open(at, How::DIRECTORY) {
                Ok(d) => break d,
                Err(e)
                    if e.io().map(std::io::Error::kind) == Some(std::io::ErrorKind::NotFound) =>
                {
                    match (at.file_name(), at.parent()) {
                        (Some(n), Some(p)) => {
                            missing.push(n.to_os_string());
                            at = if p.as_os_str().is_empty() {
                                Path::new(".")
                            } else {
                                p
                            };
                        }
                        _ => return Err(shown(&e)),
                    }
                }
                Err(e) => return Err(shown(&e)),
            }
        };
        for name in missing.iter().rev() {
            if path
                .components()
                .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
            {
                return Err(shown(&"`.` or `..` in a directory to be made"));
            }
            let c = cstr(name)?;
            // SAFETY: mkdirat relative to the directory descriptor we hold.
            let r = unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), 0o755) };
            if r != 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::AlreadyExists {
                    return Err(shown(&e));
                }
            }
            dir = openat(
                &dir,
                name,
                libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                0,
            )
            .map_err(|e| shown(&e))?;
        }
        Ok(Self {
            dir,
            path: path.to_path_buf(),
        })
    }

    /// The directory of file `file`, made if missing (see [`Self::make`]).
    pub fn of(file: &Path) -> Result<Self, String> {
        match file.parent() {
            Some(p) if !p.as_os_str().is_empty() => Self::make(p),
            _ => Self::make(Path::new(".")),
        }
    }

    /// Puts `bytes` at `name` in the directory (mode 0644): a temporary made with `O_EXCL |
    /// O_NOFOLLOW`, written, then renamed over `name`, whatever is there (a link is
    /// replaced, not followed; a directory there is refused by the rename). Returns the
    /// path written.
    pub fn replace(&self, name: &OsStr, bytes: &[u8]) -> Result<PathBuf, String> {
        let path = self.path.join(name);
        let shown = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
        if name.is_empty() || name.as_bytes().contains(&b'/') || name == "." || name == ".." {
            return Err(shown(&"not a file name"));
        }
        let tmp = temp_name(name);
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
        let mut f = openat(&self.dir, &tmp, flags, 0o644).map_err(|e| shown(&e))?;
        let (t, n) = (cstr(&tmp)?, cstr(name)?);
        let written = f.write_all(bytes).and_then(|()| f.sync_data());
        let renamed = written.and_then(|()| {
            // SAFETY: renameat within the directory descriptor we hold, NUL-terminated
            // names.
            let r = unsafe {
                libc::renameat(
                    self.dir.as_raw_fd(),
                    t.as_ptr(),
                    self.dir.as_raw_fd(),
                    n.as_ptr(),
                )
            };
            if r == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
        if let Err(e) = renamed {
            // SAFETY: unlinkat of our own temporary within the held directory.
            unsafe { libc::unlinkat(self.dir.as_raw_fd(), t.as_ptr(), 0) };
            return Err(shown(&e));
        }
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn a_planted_link_is_replaced_never_written_through() {
        let d = std::env::temp_dir().join(format!("outdir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let target = d.join("root-only");
        std::fs::write(&target, b"secret").unwrap();
        symlink(&target, d.join("r.md")).unwrap();
        let out = OutDir::make(&d).unwrap();
        out.replace(OsStr::new("r.md"), b"report").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"secret");
        let m = std::fs::symlink_metadata(d.join("r.md")).unwrap();
        assert!(m.is_file());
        assert_eq!(std::fs::read(d.join("r.md")).unwrap(), b"report");
        // No temporary left, and a name that is not one is refused.
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 2);
        assert!(out.replace(OsStr::new("a/b"), b"x").is_err());
        assert!(out.replace(OsStr::new(".."), b"x").is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn missing_directories_are_made_by_descriptor() {
        let d = std::env::temp_dir().join(format!("outdir-make-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let out = OutDir::make(&d.join("a/b/c")).unwrap();
        out.replace(OsStr::new("x.json"), b"{}").unwrap();
        assert_eq!(std::fs::read(d.join("a/b/c/x.json")).unwrap(), b"{}");
        // `..` in what must be made is refused.
        assert!(OutDir::make(&d.join("new/../other")).is_err());
        assert!(!d.join("other").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
