//! The process supervisor of `partition bench`: the run happens in a child, and this
//! process stands by to give back what the run holds if it is stopped or leaves something
//! behind (processes, partitions and reservations in its state directories, mounts, the
//! hugepage count, its scratch directory).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use partition::sys::signals::{self, SignalGuard};

use crate::HugepageCount;

/// Set by the supervisor for the child that does the run: its scratch directory.
pub const WORK_ENV: &str = "PARTITION_BENCH_WORK";

/// The scratch directory `supervise` made for this process, if it is the run. The run
/// removes it at the end, so an inherited or hand-set variable naming anything else
/// (another directory, a supervisor that is not our parent, a directory that is not ours
/// alone) is ignored.
pub fn supervised_work() -> Option<PathBuf> {
    let work = PathBuf::from(std::env::var_os(WORK_ENV)?);
    // SAFETY: getppid has no arguments and cannot fail.
    let parent = unsafe { libc::getppid() };
    let name = work.file_name()?.to_str()?;
    let ours = work.parent() == Some(std::env::temp_dir().as_path())
        && name
            .strip_prefix(&scratch_prefix(parent as u32))
            .is_some_and(|rest| {
                !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
            });
    (ours && private_dir(&work)).then_some(work)
}

/// The start of the scratch directory's name of the supervisor with pid `pid`; the rest is
/// a name nobody can guess, so a user cannot make it ahead of us in the shared /tmp.
fn scratch_prefix(pid: u32) -> String {
    format!("partition-bench-{pid}-")
}

/// A directory (not a link) owned by us, that nobody else may enter.
fn private_dir(p: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(p).is_ok_and(|m| {
        // SAFETY: geteuid has no arguments and cannot fail.
        m.is_dir() && m.uid() == unsafe { libc::geteuid() } && m.mode() & 0o077 == 0
    })
}

/// Makes the supervisor's scratch directory: mode 0700 under an unguessable name, refused
/// (never adopted) if anything already has it.
fn make_scratch() -> Result<PathBuf, String> {
    use std::os::unix::fs::DirBuilderExt;
    let name = format!(
        "{}{}",
        scratch_prefix(std::process::id()),
        pool::poolfile::unguessable()
    );
    let work = std::env::temp_dir().join(name);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&work)
        .map_err(|e| format!("{}: {e}", work.display()))?;
    Ok(work)
}

/// Runs this same command as a child (the run) and waits for it. If the run is stopped
/// (Ctrl-C, SIGTERM, SIGHUP), or ends leaving something behind, this process gives it back:
/// every process the run started is stopped (SIGTERM, SIGKILL after 10 s; as child
/// subreaper it sees the orphans too), partitions in the run's state directories are
/// released and their reservations undone, mounts under the scratch directory unmounted,
/// the hugepage count put back to what it was, and the scratch directory removed. Returns
/// the run's exit status, or 128+N when stopped by signal N; an error if the run could
/// not be started (or waited for: then `Ok(None)` after the cleanup).
pub fn supervise() -> Result<Option<u8>, String> {
    let work = make_scratch()?;
    let hugepages = HugepageCount::read();
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes an integer flag; no pointers.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let guard = SignalGuard::new().map_err(|e| {
        let _ = std::fs::remove_dir(&work);
        format!("blocking SIGINT/SIGTERM: {e}")
    })?;
    let exe = std::env::current_exe().unwrap_or_else(|_| "partition".into());
    let mut cmd = Command::new(exe);
    cmd.args(std::env::args_os().skip(1)).env(WORK_ENV, &work);
    guard.unblocked_in(&mut cmd);
    let mut child = cmd.spawn().map_err(|e| {
        let _ = std::fs::remove_dir(&work);
        format!("starting the run: {e}")
    })?;
    let run = child.id() as i32;
    let code: Option<u8> = loop {
        if let Some(sig) = guard.wait(Duration::from_millis(200)) {
            eprintln!(
                "partition: bench: stopped by {}; stopping the run and giving back what it holds",
                signals::name(sig)
            );
            break Some(128 + sig as u8);
        }
        match child.try_wait() {
            Ok(Some(st)) => {
                use std::os::unix::process::ExitStatusExt;
                break Some(
                    st.code()
                        .map(|c| c as u8)
                        .unwrap_or_else(|| 128 + st.signal().unwrap_or(0) as u8),
                );
            }
            Ok(None) => reap_orphans(run),
            Err(e) => {
                eprintln!("partition: bench: waiting for the run: {e}");
                break None;
            }
        }
    };
    let stopped = stop_descendants();
    let _ = child.try_wait();
    let mut left = give_back(&work, hugepages);
    if stopped > 0 {
        left.insert(
            0,
            format!("stopped what the run had started ({stopped} processes)"),
        );
    }
    for l in &left {
        eprintln!("partition: bench: cleanup: {l}");
    }
    Ok(code)
}

/// (pid, parent pid, state letter) of every process.
fn processes() -> Vec<(i32, i32, char)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let st = partition::host::ledger::proc_stat(pid)?;
            Some((pid as i32, st.ppid as i32, st.state))
        })
        .collect()
}

/// Live processes below `root` (not `root`), and zombies that are `root`'s children.
fn descendants(root: i32) -> (Vec<i32>, Vec<i32>) {
    let all = processes();
    let (mut live, mut zombies) = (Vec::new(), Vec::new());
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for &(pid, ppid, state) in &all {
            if ppid != p {
                continue;
            }
            if state == 'Z' {
                if p == root {
                    zombies.push(pid);
                }
            } else {
                live.push(pid);
                frontier.push(pid);
            }
        }
    }
    (live, zombies)
}

/// Waits for our zombie children (orphans of the run that ended), leaving `keep` (the
/// run, whose status `Child::try_wait` collects). One waitid peek while there are none:
/// this runs beside the measurements, so it must not scan /proc.
fn reap_orphans(keep: i32) {
    loop {
        // SAFETY: siginfo_t is plain data; all-zero is valid and means "no child".
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid fills `info`, a valid siginfo_t; WNOWAIT leaves the child
        // waitable.
        let rc = unsafe {
            libc::waitid(
                libc::P_ALL,
                0,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        // SAFETY: si_pid is valid in a siginfo_t that waitid filled for WEXITED.
        let pid = unsafe { info.si_pid() };
        if rc != 0 || pid == 0 || pid == keep {
            return;
        }
        // SAFETY: waitpid on our own child that has exited, with a null status pointer.
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
    }
}

/// Stops every process below this one: SIGTERM (a partition tears down on it), SIGKILL
/// for what is left after 10 s. Returns how many there were.
fn stop_descendants() -> usize {
    // SAFETY: getpid has no arguments and cannot fail.
    let me = unsafe { libc::getpid() };
    let start = Instant::now();
    let mut seen = HashSet::new();
    loop {
        let (live, zombies) = descendants(me);
        for z in zombies {
            // SAFETY: waitpid on our own child that has exited, with a null status pointer.
            unsafe { libc::waitpid(z, std::ptr::null_mut(), libc::WNOHANG) };
        }
        if live.is_empty() {
            return seen.len();
        }
        let late = start.elapsed() > Duration::from_secs(10);
        if start.elapsed() > Duration::from_secs(20) {
            eprintln!("partition: bench: cleanup: processes {live:?} would not stop");
            return seen.len();
        }
        for p in live {
            if seen.insert(p) || late {
                let sig = if late { libc::SIGKILL } else { libc::SIGTERM };
                // SAFETY: signalling a process below ours, found in /proc just now.
                unsafe { libc::kill(p, sig) };
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Gives back what a run left under `work`, then removes it; returns what it did or could
/// not do (nothing for a run that cleaned up after itself).
fn give_back(work: &Path, hugepages: u64) -> Vec<String> {
    let mut said = Vec::new();
    let dirs = std::fs::read_dir(work)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_else(|_| Vec::new());
    for d in dirs {
        let Ok(st) = partition::host::partitions::status(&d) else {
            continue;
        };
        if !st.reserved {
            continue;
        }
        for p in &st.partitions {
            match partition::host::partitions::release(&d, &p.name, Duration::from_secs(2)) {
                Ok(_) => said.push(format!("partition {} released", p.name)),
                Err(e) => said.push(format!("releasing partition {}: {e}", p.name)),
            }
        }
        match partition::host::reserve::unreserve(&d) {
            Ok(r) => {
                said.push(format!("reservation in {} given back", d.display()));
                said.extend(r.warnings);
            }
            Err(e) => said.push(format!(
                "giving back the reservation in {}: {e}",
                d.display()
            )),
        }
    }
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    for m in mounts.lines().filter_map(|l| l.split_whitespace().nth(1)) {
        let m = m.replace("\\040", " ");
        if Path::new(&m).starts_with(work) {
            match pool::hugetlbfs::umount(Path::new(&m)) {
                Ok(()) => said.push(format!("{m} unmounted")),
                Err(e) => said.push(e.to_string()),
            }
        }
    }
    let now = HugepageCount::read();
    if now != hugepages {
        let back = HugepageCount::set(hugepages);
        said.push(if back == hugepages {
            format!("hugepage count put back from {now} to {hugepages}")
        } else {
            format!("hugepage count is {back}, not the {hugepages} it was (pages in use)")
        });
    }
    match std::fs::remove_dir_all(work) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            said.push(format!("{}: {e}", work.display()))
        }
        _ => {}
    }
    said
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scratch_directory_is_private_and_unguessable() {
        let a = make_scratch().unwrap();
        let b = make_scratch().unwrap();
        let name = a.file_name().unwrap().to_str().unwrap().to_owned();
        let rest = name
            .strip_prefix(&scratch_prefix(std::process::id()))
            .unwrap();
        assert!(rest.len() >= 16, "{name}");
        assert_ne!(a, b);
        assert!(private_dir(&a));
        // A link to a private directory, or a directory others may enter, is not ours.
        let link = a.with_extension("link");
        std::os::unix::fs::symlink(&a, &link).unwrap();
        assert!(!private_dir(&link));
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&b, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(!private_dir(&b));
        std::fs::remove_file(&link).unwrap();
        for p in [&a, &b] {
            std::fs::remove_dir(p).unwrap();
        }
    }
}
