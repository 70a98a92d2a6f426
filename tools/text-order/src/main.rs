//! `text-order`: which functions does a program run, and a linker script that puts them
//! first. `scripts/text-order.sh` uses it to keep the VMM's launch path in a few pages of
//! `.text` (docs/architecture.md, "Building").

mod script;
mod symbols;
mod trace;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Record the functions a program runs; write the linker script that gathers them.
#[derive(Parser)]
#[command(version)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run PROGRAM with a breakpoint on every function entry of BINARY (default: PROGRAM)
    /// and add the functions it ran to OUT, in the order they first ran (names already in
    /// OUT stay where they are). Threads and forked children are followed. Exits with the
    /// program's status.
    Trace {
        /// The program whose functions are trapped; it must be the one PROGRAM execs.
        #[arg(long)]
        binary: Option<PathBuf>,
        /// The list of function names, one a line (created if missing).
        #[arg(long)]
        out: PathBuf,
        /// The program and its arguments.
        #[arg(required = true, last = true)]
        program: Vec<String>,
    },
    /// Write the linker script for the names in HITS (from `trace`) to OUT.
    Script {
        /// The names `trace` wrote.
        #[arg(long)]
        hits: PathBuf,
        /// Static archives whose members define C functions of the list (glibc's libc.a).
        #[arg(long)]
        archive: Vec<PathBuf>,
        /// Where the script goes.
        #[arg(long)]
        out: PathBuf,
    },
    /// For the tests: runs marked functions in this process, a thread and a child.
    #[command(hide = true)]
    Selftest,
}

fn read_lines(p: &Path) -> Vec<String> {
    std::fs::read_to_string(p)
        .map(|s| {
            s.lines()
                .filter(|l| !l.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

fn run(cli: Cli) -> Result<ExitCode, String> {
    match cli.cmd {
        Cmd::Trace {
            binary,
            out,
            program,
        } => {
            let prog = PathBuf::from(&program[0]);
            let binary = binary.unwrap_or_else(|| prog.clone());
            let fns = symbols::functions(&binary).map_err(|e| e.to_string())?;
            let t = trace::trace(&binary, &fns, &prog, &program[1..]).map_err(|e| e.to_string())?;
            let mut names = read_lines(&out);
            let before = names.len();
            let known: std::collections::HashSet<String> = names.iter().cloned().collect();
            names.extend(t.hits.iter().filter(|h| !known.contains(*h)).cloned());
            let mut text = names.join("\n");
            text.push('\n');
            std::fs::write(&out, text).map_err(|e| format!("writing {}: {e}", out.display()))?;
            eprintln!(
                "text-order: {} of {} functions ran; {} new in {} ({} in all); the program exited {}",
                t.hits.len(),
                fns.len(),
                names.len() - before,
                out.display(),
                names.len(),
                t.status
            );
            Ok(ExitCode::from(t.status.clamp(0, 255) as u8))
        }
        Cmd::Script { hits, archive, out } => {
            let names = read_lines(&hits);
            if names.is_empty() {
                return Err(format!("{} lists no functions", hits.display()));
            }
            let mut members = BTreeMap::new();
            for a in &archive {
                let Some(file) = a.file_name().map(|n| n.to_string_lossy().into_owned()) else {
                    return Err(format!("{}: not a file", a.display()));
                };
                for (name, member) in symbols::archive_members(a).map_err(|e| e.to_string())? {
                    members.entry(name).or_insert((file.clone(), member));
                }
            }
            let s = script::linker_script(&names, &members);
            std::fs::write(&out, s).map_err(|e| format!("writing {}: {e}", out.display()))?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Selftest => {
            selftest_called();
            std::thread::spawn(selftest_in_thread)
                .join()
                .map_err(|_| "selftest thread panicked")?;
            // SAFETY: the child only calls a function that computes and then _exit.
            match unsafe { libc::fork() } {
                0 => {
                    selftest_in_child();
                    // SAFETY: ends the child without running the parent's exit handlers.
                    unsafe { libc::_exit(0) }
                }
                pid if pid > 0 => {
                    let mut st = 0;
                    // SAFETY: waits for our own child; `st` lives through the call.
                    unsafe { libc::waitpid(pid, &mut st, 0) };
                }
                _ => return Err("fork failed".into()),
            }
            if std::env::var_os("TEXT_ORDER_NEVER").is_some() {
                selftest_never_called();
            }
            Ok(ExitCode::from(7))
        }
    }
}

#[inline(never)]
fn selftest_called() {
    std::hint::black_box(1);
}
#[inline(never)]
fn selftest_in_thread() {
    std::hint::black_box(2);
}
#[inline(never)]
fn selftest_in_child() {
    std::hint::black_box(3);
}
#[inline(never)]
fn selftest_never_called() {
    std::hint::black_box(4);
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("text-order: error: {e}");
            ExitCode::from(2)
        }
    }
}
