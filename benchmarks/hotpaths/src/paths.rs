//! The kernel hot paths, each the loop lmbench times (names in brackets):
//! system calls [lat_syscall], signals [lat_sig], two-process IPC [lat_pipe, lat_unix,
//! lat_ctx] and process creation [lat_proc].

use std::ffi::CString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::counted::Counted;
use crate::timing::{Enough, per_iteration};

/// Errors setting a benchmark up (the measured loops themselves do not fail).
#[derive(Debug)]
pub enum PathError {
    /// A system call failed.
    Sys(&'static str, io::Error),
    /// A child process did not behave.
    Child(String),
    /// A device read came back short.
    Short(String),
}

impl std::fmt::Display for PathError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PathError::Sys(what, e) => write!(f, "{what}: {e}"),
            PathError::Child(why) | PathError::Short(why) => write!(f, "{why}"),
        }
    }
}

fn check(rc: i32, what: &'static str) -> Result<i32, PathError> {
    if rc < 0 {
        Err(PathError::Sys(what, io::Error::last_os_error()))
    } else {
        Ok(rc)
    }
}

/// Pins the calling thread (and the children it forks afterwards) to `cpu`.
pub fn pin(cpu: usize) -> bool {
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET bounds-checks the index against the set's size.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: applies a valid set to the calling thread.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0 }
}

/// What the path benchmarks share.
pub struct Ctx {
    /// Minimum duration of a repetition.
    pub enough: Enough,
    /// Empty-loop cost per iteration, microseconds.
    pub overhead: f64,
    /// The file `stat` and `open` use.
    pub file: PathBuf,
    /// The do-nothing program the exec benchmarks run.
    pub hello: PathBuf,
    /// Counted mode (`--count`): loops run fixed counts between marks, nothing is timed.
    pub counted: Option<Counted>,
}

impl Ctx {
    /// Microseconds per iteration of `f` (lmbench's discipline), or, counted, `f` run
    /// between marks (and 0).
    pub fn measure(&self, f: &mut dyn FnMut(u64)) -> f64 {
        match &self.counted {
            Some(k) => {
                k.run(f);
                0.0
            }
            None => per_iteration(f, self.enough, self.overhead),
        }
    }
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_encoded_bytes()).unwrap_or_default()
}

/// getppid() [lat_syscall null].
pub fn null_syscall(c: &Ctx) -> f64 {
    let mut f = |n: u64| {
        for _ in 0..n {
            // SAFETY: getppid has no preconditions.
            std::hint::black_box(unsafe { libc::getppid() });
        }
    };
    c.measure(&mut f)
}

fn open_raw(path: &Path, flags: i32) -> Result<i32, PathError> {
    let p = cstr(path);
    // SAFETY: a NUL-terminated path.
    check(
        unsafe { libc::open(p.as_ptr(), flags | libc::O_CLOEXEC) },
        "open",
    )
}

/// read() of one byte from /dev/zero [lat_syscall read].
pub fn read_byte(c: &Ctx) -> Result<f64, PathError> {
    let fd = open_raw(Path::new("/dev/zero"), libc::O_RDONLY)?;
    let mut b = 0u8;
    let mut f = |n: u64| {
        for _ in 0..n {
            // SAFETY: reads one byte into a live local.
            unsafe { libc::read(fd, (&raw mut b).cast(), 1) };
        }
    };
    let r = c.measure(&mut f);
    // SAFETY: our fd.
    unsafe { libc::close(fd) };
    Ok(r)
}

/// write() of one byte to /dev/null [lat_syscall write].
pub fn write_byte(c: &Ctx) -> Result<f64, PathError> {
    let fd = open_raw(Path::new("/dev/null"), libc::O_WRONLY)?;
    let b = 0u8;
    let mut f = |n: u64| {
        for _ in 0..n {
            // SAFETY: writes one byte from a live local.
            unsafe { libc::write(fd, (&raw const b).cast(), 1) };
        }
    };
    let r = c.measure(&mut f);
    // SAFETY: our fd.
    unsafe { libc::close(fd) };
    Ok(r)
}

/// stat() of a file [lat_syscall stat].
pub fn stat(c: &Ctx) -> Result<f64, PathError> {
    let p = cstr(&c.file);
    // SAFETY: stat is plain data.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a live buffer.
    check(unsafe { libc::stat(p.as_ptr(), &mut st) }, "stat")?;
    let mut f = |n: u64| {
        for _ in 0..n {
            // SAFETY: as above.
            unsafe { libc::stat(p.as_ptr(), &mut st) };
        }
    };
    Ok(c.measure(&mut f))
}

/// open() then close() of a file [lat_syscall open].
pub fn open_close(c: &Ctx) -> Result<f64, PathError> {
    let p = cstr(&c.file);
    // SAFETY: a NUL-terminated path.
    let fd = check(unsafe { libc::open(p.as_ptr(), libc::O_RDONLY) }, "open")?;
    // SAFETY: our fd.
    unsafe { libc::close(fd) };
    let mut f = |n: u64| {
        for _ in 0..n {
            // SAFETY: a NUL-terminated path; closing the fd we just got.
            unsafe { libc::close(libc::open(p.as_ptr(), libc::O_RDONLY)) };
        }
    };
    Ok(c.measure(&mut f))
}

static CAUGHT: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_usr1(_: libc::c_int) {
    CAUGHT.fetch_add(1, Ordering::Relaxed);
}

fn handler() -> libc::sigaction {
    // SAFETY: sigaction is plain data.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = on_usr1 as *const () as usize;
    // SAFETY: initialises the mask inside sa.
    unsafe { libc::sigemptyset(&mut sa.sa_mask) };
    sa
}

/// sigaction() installing a handler [lat_sig install].
pub fn sig_install(c: &Ctx) -> f64 {
    let sa = handler();
    // SAFETY: as above.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    let mut f = |n: u64| {
        for _ in 0..n {
            // SAFETY: valid sigaction structs; SIGUSR1's handler is ours to set.
            unsafe { libc::sigaction(libc::SIGUSR1, &sa, &mut old) };
        }
    };
    let r = c.measure(&mut f);
    // SAFETY: restores the default disposition.
    unsafe { libc::signal(libc::SIGUSR1, libc::SIG_DFL) };
    r
}

/// A signal to ourselves and the handler running, less the cost of sending a signal
/// [lat_sig catch].
pub fn sig_catch(c: &Ctx) -> Result<f64, PathError> {
    let sa = handler();
    // SAFETY: installs our handler for SIGUSR1.
    let rc = unsafe { libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()) };
    check(rc, "sigaction")?;
    // lmbench's kill(getpid()) lands on its only thread; tgkill aims at the calling thread
    // the same way in a process that has others (a test harness), so no signal merges.
    // SAFETY: getpid and gettid have no preconditions.
    let (me, tid) = unsafe { (libc::getpid(), libc::gettid()) };
    let before = CAUGHT.load(Ordering::Relaxed);
    let mut sent = 0u64;
    let mut f = |n: u64| {
        for _ in 0..n {
            // SAFETY: signals this thread; the handler is installed.
            unsafe { libc::syscall(libc::SYS_tgkill, me, tid, libc::SIGUSR1) };
        }
        sent += n;
    };
    let catch = c.measure(&mut f);
    // As lmbench does: less the cost of sending a signal (the null signal, which only
    // checks permission) so what remains is delivering it and running the handler.
    let mut g = |n: u64| {
        for _ in 0..n {
            // SAFETY: signal 0 is never delivered.
            unsafe { libc::syscall(libc::SYS_tgkill, me, tid, 0) };
        }
    };
    let send = c.measure(&mut g);
    let r = (catch - send).max(0.0);
    // SAFETY: restores the default disposition.
    unsafe { libc::signal(libc::SIGUSR1, libc::SIG_DFL) };
    let got = CAUGHT.load(Ordering::Relaxed) - before;
    if got != sent {
        return Err(PathError::Child(format!(
            "sent {sent} signals, caught {got}"
        )));
    }
    Ok(r)
}

/// A child process that echoes one byte from `rx` to `tx` until `rx` ends, pinned to
/// `cpu` if given. Returns its pid.
fn echo_child(
    rx: i32,
    tx: i32,
    close_in_child: &[i32],
    cpu: Option<usize>,
) -> Result<i32, PathError> {
    // SAFETY: fork; the child only calls async-signal-safe functions and _exit.
    let pid = check(unsafe { libc::fork() }, "fork")?;
    if pid == 0 {
        if let Some(c) = cpu {
            pin(c);
        }
        for &fd in close_in_child {
            // SAFETY: the parent's ends, not ours to keep.
            unsafe { libc::close(fd) };
        }
        let mut b = 0u8;
        loop {
            // SAFETY: one byte into a live local, then back out.
            unsafe {
                if libc::read(rx, (&raw mut b).cast(), 1) != 1 {
                    libc::_exit(0);
                }
                if libc::write(tx, (&raw const b).cast(), 1) != 1 {
                    libc::_exit(1);
                }
            }
        }
    }
    Ok(pid)
}

fn reap(pid: i32, what: &str) -> Result<(), PathError> {
    let mut st = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    if libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0 {
        Ok(())
    } else {
        Err(PathError::Child(format!(
            "{what}: child ended with status {st:#x}"
        )))
    }
}

fn pipe() -> Result<[i32; 2], PathError> {
    let mut p = [0i32; 2];
    // SAFETY: writes two fds.
    check(unsafe { libc::pipe(p.as_mut_ptr()) }, "pipe")?;
    Ok(p)
}

fn round_trips(c: &Ctx, tx: i32, rx: i32) -> f64 {
    let mut b = 0u8;
    let mut f = |n: u64| {
        for _ in 0..n {
            // SAFETY: one byte out and one back, from and into live locals.
            unsafe {
                libc::write(tx, (&raw const b).cast(), 1);
                libc::read(rx, (&raw mut b).cast(), 1);
            }
        }
    };
    c.measure(&mut f)
}

/// Round trip of one byte through two pipes to a child and back [lat_pipe].
pub fn pipe_round_trip(c: &Ctx, child_cpu: Option<usize>) -> Result<f64, PathError> {
    let (a, b) = (pipe()?, pipe()?);
    let pid = echo_child(a[0], b[1], &[a[1], b[0]], child_cpu)?;
    // SAFETY: the child's ends.
    unsafe {
        libc::close(a[0]);
        libc::close(b[1]);
    }
    let r = round_trips(c, a[1], b[0]);
    // SAFETY: closing our ends ends the child.
    unsafe {
        libc::close(a[1]);
        libc::close(b[0]);
    }
    reap(pid, "pipe echo")?;
    Ok(r)
}

/// Round trip of one byte over an AF_UNIX stream socket pair [lat_unix].
pub fn unix_round_trip(c: &Ctx, child_cpu: Option<usize>) -> Result<f64, PathError> {
    let mut s = [0i32; 2];
    // SAFETY: writes two fds.
    let rc = unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, s.as_mut_ptr()) };
    check(rc, "socketpair")?;
    let pid = echo_child(s[1], s[1], &[s[0]], child_cpu)?;
    // SAFETY: the child's end.
    unsafe { libc::close(s[1]) };
    let r = round_trips(c, s[0], s[0]);
    // SAFETY: closing our end ends the child.
    unsafe { libc::close(s[0]) };
    reap(pid, "unix echo")?;
    Ok(r)
}

/// Two processes passing a token around a ring of pipes, per switch, minus what the pipe
/// operations cost a single process [lat_ctx -s 0 2].
pub fn context_switch(c: &Ctx, child_cpu: Option<usize>) -> Result<f64, PathError> {
    // The overhead: one process writing a token into its own pipe and reading it back.
    let p = pipe()?;
    let own = round_trips(c, p[1], p[0]);
    // SAFETY: our pipe.
    unsafe {
        libc::close(p[0]);
        libc::close(p[1]);
    }
    let ring = pipe_round_trip(c, child_cpu)?;
    Ok((ring / 2.0 - own).max(0.0))
}

/// A 1 ms `clock_nanosleep` on CLOCK_MONOTONIC, slept through (no lmbench equivalent: a
/// timer's arming, firing and the wake-up; counted mode only).
pub fn sleep_1ms(c: &Ctx) -> f64 {
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 1_000_000,
    };
    let mut f = |n: u64| {
        for _ in 0..n {
            // SAFETY: a valid relative timespec; no remainder asked for.
            unsafe { libc::clock_nanosleep(libc::CLOCK_MONOTONIC, 0, &ts, std::ptr::null_mut()) };
        }
    };
    c.measure(&mut f)
}

/// A 4 KiB `pread` of `dev` with O_DIRECT (past the page cache, to the device), walking
/// its first 64 MiB (or all of it, if smaller) a block at a time (counted mode only).
pub fn blk_read(c: &Ctx, dev: &Path) -> Result<f64, PathError> {
    let fd = open_raw(dev, libc::O_RDONLY | libc::O_DIRECT)?;
    // SAFETY: our fd; lseek to the end reports the size.
    let size = unsafe { libc::lseek(fd, 0, libc::SEEK_END) }.max(0) as u64;
    let span = (size.min(64 << 20) / 4096).max(1);
    // O_DIRECT wants an aligned buffer: a page of an 8 KiB allocation.
    let mut raw = vec![0u8; 8192];
    let off = raw.as_ptr().align_offset(4096);
    let buf = raw[off..off + 4096].as_mut_ptr();
    let mut at = 0u64;
    let mut bad = 0u64;
    let mut f = |n: u64| {
        for _ in 0..n {
            // SAFETY: 4096 bytes into the aligned page of a live buffer.
            let r = unsafe { libc::pread(fd, buf.cast(), 4096, ((at % span) * 4096) as i64) };
            bad += u64::from(r != 4096);
            at += 1;
        }
    };
    let r = c.measure(&mut f);
    // SAFETY: our fd.
    unsafe { libc::close(fd) };
    if bad > 0 {
        return Err(PathError::Short(format!(
            "{bad} reads of {} did not return 4096 bytes",
            dev.display()
        )));
    }
    Ok(r)
}

/// `fork()`, the child `_exit(0)`s, the parent waits [lat_proc fork].
pub fn fork_exit(c: &Ctx) -> Result<f64, PathError> {
    let mut bad = 0u32;
    let mut f = |n: u64| {
        for _ in 0..n {
            // SAFETY: the child only calls _exit.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                // SAFETY: ends the child.
                unsafe { libc::_exit(0) };
            }
            let mut st = 0;
            // SAFETY: waits for our own child.
            unsafe { libc::waitpid(pid, &mut st, 0) };
            bad += u32::from(pid < 0 || st != 0);
        }
    };
    let r = c.measure(&mut f);
    if bad > 0 {
        return Err(PathError::Child(format!("{bad} forks failed")));
    }
    Ok(r)
}

fn spawn_wait(c: &Ctx, argv: &[CString]) -> Result<f64, PathError> {
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    let env: [*const libc::c_char; 1] = [std::ptr::null()];
    let mut bad = 0u32;
    let mut f = |n: u64| {
        for _ in 0..n {
            // SAFETY: the child only calls execve and _exit (async-signal-safe) with
            // pointers prepared before the fork.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                // SAFETY: NUL-terminated strings in NULL-terminated arrays.
                unsafe {
                    libc::execve(ptrs[0], ptrs.as_ptr(), env.as_ptr());
                    libc::_exit(127);
                }
            }
            let mut st = 0;
            // SAFETY: waits for our own child.
            unsafe { libc::waitpid(pid, &mut st, 0) };
            bad += u32::from(pid < 0 || st != 0);
        }
    };
    let r = c.measure(&mut f);
    if bad > 0 {
        return Err(PathError::Child(format!(
            "{bad} runs of {:?} failed",
            argv.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>()
        )));
    }
    Ok(r)
}

/// `fork()` and `execve()` of a do-nothing program [lat_proc exec].
pub fn fork_exec(c: &Ctx) -> Result<f64, PathError> {
    spawn_wait(c, &[cstr(&c.hello)])
}

/// `fork()` and `/bin/sh -c` running the do-nothing program [lat_proc shell].
pub fn fork_shell(c: &Ctx) -> Result<f64, PathError> {
    spawn_wait(
        c,
        &[
            CString::new("/bin/sh").unwrap_or_default(),
            CString::new("-c").unwrap_or_default(),
            cstr(&c.hello),
        ],
    )
}

/// The smallest static x86-64 ELF program: `exit(0)`. lmbench's `hello` prints a line; this
/// one only exits, so the exec benchmarks time process creation, not a C runtime.
pub fn hello_elf() -> Vec<u8> {
    const BASE: u64 = 0x40_0000;
    let code: [u8; 12] = [
        0xbf, 0, 0, 0, 0, // mov edi, 0
        0xb8, 60, 0, 0, 0, // mov eax, 60 (exit)
        0x0f, 0x05, // syscall
    ];
    let size = (64 + 56 + code.len()) as u64;
    let mut e = Vec::with_capacity(size as usize);
    e.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    e.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    e.extend_from_slice(&0x3eu16.to_le_bytes()); // x86-64
    e.extend_from_slice(&1u32.to_le_bytes());
    e.extend_from_slice(&(BASE + 120).to_le_bytes()); // entry
    e.extend_from_slice(&64u64.to_le_bytes()); // phoff
    e.extend_from_slice(&0u64.to_le_bytes()); // shoff
    e.extend_from_slice(&0u32.to_le_bytes());
    e.extend_from_slice(&64u16.to_le_bytes());
    e.extend_from_slice(&56u16.to_le_bytes());
    e.extend_from_slice(&1u16.to_le_bytes());
    e.extend_from_slice(&[0; 6]); // shentsize, shnum, shstrndx
    e.extend_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    e.extend_from_slice(&5u32.to_le_bytes()); // R+X
    e.extend_from_slice(&0u64.to_le_bytes()); // offset
    e.extend_from_slice(&BASE.to_le_bytes());
    e.extend_from_slice(&BASE.to_le_bytes());
    e.extend_from_slice(&size.to_le_bytes());
    e.extend_from_slice(&size.to_le_bytes());
    e.extend_from_slice(&0x1000u64.to_le_bytes());
    e.extend_from_slice(&code);
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn ctx(dir: &Path) -> Ctx {
        let file = dir.join("f");
        std::fs::write(&file, b"x").unwrap();
        let hello = dir.join("hello");
        std::fs::write(&hello, hello_elf()).unwrap();
        std::fs::set_permissions(&hello, std::fs::Permissions::from_mode(0o755)).unwrap();
        Ctx {
            enough: Enough(200),
            overhead: 0.0,
            file,
            hello,
            counted: None,
        }
    }

    #[test]
    fn every_path_runs_and_its_children_behave() {
        let dir = std::env::temp_dir().join(format!("hotpaths-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let c = ctx(&dir);
        assert!(null_syscall(&c) > 0.0);
        assert!(read_byte(&c).unwrap() > 0.0);
        assert!(write_byte(&c).unwrap() > 0.0);
        assert!(stat(&c).unwrap() > 0.0);
        assert!(open_close(&c).unwrap() > 0.0);
        assert!(sig_install(&c) > 0.0);
        assert!(sig_catch(&c).unwrap() > 0.0);
        assert!(pipe_round_trip(&c, None).unwrap() > 0.0);
        assert!(unix_round_trip(&c, None).unwrap() > 0.0);
        assert!(context_switch(&c, None).is_ok());
        assert!(sleep_1ms(&c) > 0.0);
        // O_DIRECT on the scratch file (a regular file: the path a block device takes) when
        // its filesystem allows it; a missing device is an error, not a panic.
        assert!(blk_read(&c, &dir.join("no-such-device")).is_err());
        assert!(fork_exit(&c).unwrap() > 0.0);
        // The hand-made ELF really runs and exits 0 (spawn_wait fails otherwise).
        assert!(fork_exec(&c).unwrap() > 0.0);
        assert!(fork_shell(&c).unwrap() > 0.0);
        // A program that does not exist is an error, not a number.
        let bad = Ctx {
            hello: dir.join("missing"),
            ..ctx(&dir)
        };
        assert!(fork_exec(&bad).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
