//! Runs a program under ptrace with an `int3` on every function entry and records, in the
//! order they first run, the functions any of its threads or forked children enters. Each
//! breakpoint is taken out the first time it is hit, so a function costs one stop.

use std::collections::HashSet;
use std::os::unix::fs::FileExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use crate::symbols::Function;

/// Why a trace failed.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The program could not be started.
    #[error("starting {program}: {why}")]
    Spawn { program: String, why: String },
    /// A ptrace or wait call failed.
    #[error("{call}: {why}")]
    Ptrace { call: &'static str, why: String },
    /// The program's image was not found in its own memory map after exec.
    #[error("{0} is not mapped in the traced process (is --binary the program that runs?)")]
    NotMapped(String),
}

/// The one-byte breakpoint instruction.
const INT3: u8 = 0xcc;

fn os_err(call: &'static str) -> TraceError {
    TraceError::Ptrace {
        call,
        why: std::io::Error::last_os_error().to_string(),
    }
}

/// What a trace saw.
#[derive(Debug, Default)]
pub struct Trace {
    /// Functions in the order they first ran (by any thread of any traced process).
    pub hits: Vec<String>,
    /// The traced program's exit status (128 + signal if a signal ended it).
    pub status: i32,
}

/// The load address of `binary` in `pid`: the start of its mapping at file offset 0.
fn load_address(pid: i32, binary: &Path) -> Result<u64, TraceError> {
    let want = std::fs::canonicalize(binary).unwrap_or_else(|_| binary.to_path_buf());
    let maps =
        std::fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|e| TraceError::Ptrace {
            call: "reading /proc/PID/maps",
            why: e.to_string(),
        })?;
    maps.lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 6 && f[2] == "00000000" && Path::new(f[5]) == want)
                .then(|| u64::from_str_radix(f[0].split('-').next()?, 16).ok())
                .flatten()
        })
        .ok_or_else(|| TraceError::NotMapped(want.display().to_string()))
}

/// A tracee's memory, through /proc (its tracer may write even read-only text).
fn memory(pid: i32) -> Result<std::fs::File, TraceError> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/mem"))
        .map_err(|e| TraceError::Ptrace {
            call: "opening /proc/PID/mem",
            why: e.to_string(),
        })
}

fn peek(mem: &std::fs::File, addr: u64) -> Result<u8, TraceError> {
    let mut b = [0u8];
    mem.read_exact_at(&mut b, addr)
        .map_err(|e| TraceError::Ptrace {
            call: "reading the tracee's text",
            why: format!("at {addr:#x}: {e}"),
        })?;
    Ok(b[0])
}

fn poke(mem: &std::fs::File, addr: u64, byte: u8) -> Result<(), TraceError> {
    mem.write_all_at(&[byte], addr)
        .map_err(|e| TraceError::Ptrace {
            call: "writing the tracee's text",
            why: format!("at {addr:#x}: {e}"),
        })
}

fn cont(pid: i32, sig: i32) {
    // SAFETY: resumes a stopped tracee; a tracee that vanished meanwhile just fails (ESRCH),
    // which its exit report then explains.
    unsafe { libc::ptrace(libc::PTRACE_CONT, pid, 0usize, sig as usize) };
}

/// The tracee's registers.
fn registers(pid: i32) -> Result<libc::user_regs_struct, TraceError> {
    // SAFETY: user_regs_struct is plain integers; all zeros is a valid value.
    let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
    // SAFETY: PTRACE_GETREGS fills `regs`, which lives through the call.
    if unsafe { libc::ptrace(libc::PTRACE_GETREGS, pid, 0usize, &mut regs) } < 0 {
        return Err(os_err("PTRACE_GETREGS"));
    }
    Ok(regs)
}

fn set_regs(pid: i32, regs: &libc::user_regs_struct) -> Result<(), TraceError> {
    // SAFETY: PTRACE_SETREGS reads `regs`, which lives through the call.
    if unsafe { libc::ptrace(libc::PTRACE_SETREGS, pid, 0usize, regs) } < 0 {
        return Err(os_err("PTRACE_SETREGS"));
    }
    Ok(())
}

/// Runs `program args` with `functions` (of `binary`, the program that will be exec'd)
/// trapped, until it and every process it forked have exited.
pub fn trace(
    binary: &Path,
    functions: &[Function],
    program: &Path,
    args: &[String],
) -> Result<Trace, TraceError> {
    let mut cmd = Command::new(program);
    cmd.args(args);
    let trace_me = || {
        // SAFETY: PTRACE_TRACEME takes no memory; it makes our parent this child's tracer.
        if unsafe { libc::ptrace(libc::PTRACE_TRACEME, 0, 0usize, 0usize) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    };
    // SAFETY: the closure runs in the child between fork and exec and only makes the one
    // async-signal-safe system call; the exec then stops the child for us (SIGTRAP).
    unsafe { cmd.pre_exec(trace_me) };
    let child = cmd.spawn().map_err(|e| TraceError::Spawn {
        program: program.display().to_string(),
        why: e.to_string(),
    })?;
    let root = child.id() as i32;
    let mut st = 0;
    // SAFETY: waits for our own child; `st` lives through the call.
    if unsafe { libc::waitpid(root, &mut st, 0) } != root || !libc::WIFSTOPPED(st) {
        return Err(os_err("waiting for the program's exec"));
    }
    let opts = libc::PTRACE_O_TRACECLONE
        | libc::PTRACE_O_TRACEFORK
        | libc::PTRACE_O_TRACEVFORK
        | libc::PTRACE_O_TRACEEXEC
        | libc::PTRACE_O_EXITKILL;
    // SAFETY: sets options on our stopped tracee.
    if unsafe { libc::ptrace(libc::PTRACE_SETOPTIONS, root, 0usize, opts as usize) } < 0 {
        return Err(os_err("PTRACE_SETOPTIONS"));
    }
    let base = load_address(root, binary)?;
    let mut original = vec![0u8; functions.len()];
    let mem = memory(root)?;
    for (i, f) in functions.iter().enumerate() {
        let at = base + f.addr;
        original[i] = peek(&mem, at)?;
        poke(&mem, at, INT3)?;
    }
    drop(mem);
    // A tracee's memory says which breakpoints are still in: a fork copies them with the
    // rest, so a function its child enters first is still caught there.
    let mut seen = HashSet::new();
    let mut out = Trace::default();
    cont(root, 0);
    loop {
        let mut st = 0;
        // SAFETY: waits for any traced task; `st` lives through the call.
        let pid = unsafe { libc::waitpid(-1, &mut st, libc::__WALL) };
        if pid < 0 {
            break;
        }
        if libc::WIFEXITED(st) || libc::WIFSIGNALED(st) {
            // The program's own status; the loop goes on until every traced process has
            // exited (leaving, the tracer would kill them: PTRACE_O_EXITKILL).
            if pid == root {
                out.status = if libc::WIFEXITED(st) {
                    libc::WEXITSTATUS(st)
                } else {
                    128 + libc::WTERMSIG(st)
                };
            }
            continue;
        }
        if !libc::WIFSTOPPED(st) {
            continue;
        }
        let sig = libc::WSTOPSIG(st);
        let event = st >> 16;
        if event != 0 {
            // Clone, fork, vfork, exec: the new task is traced too; go on.
            cont(pid, 0);
            continue;
        }
        match sig {
            libc::SIGTRAP => {
                let mut regs = registers(pid)?;
                let at = regs.rip.wrapping_sub(1);
                let found = at
                    .checked_sub(base)
                    .and_then(|a| functions.binary_search_by_key(&a, |f| f.addr).ok());
                let Some(i) = found else {
                    cont(pid, sig); // not ours
                    continue;
                };
                let mem = memory(pid)?;
                if peek(&mem, at)? == INT3 {
                    poke(&mem, at, original[i])?;
                    if seen.insert(i) {
                        out.hits.push(functions[i].name.clone());
                    }
                }
                // Two threads can reach one breakpoint together: the second finds it
                // already taken out and only steps back.
                regs.rip = at;
                set_regs(pid, &regs)?;
                cont(pid, 0);
            }
            // New threads and children start stopped; nothing of the program's own.
            libc::SIGSTOP => cont(pid, 0),
            _ => cont(pid, sig),
        }
    }
    Ok(out)
}
