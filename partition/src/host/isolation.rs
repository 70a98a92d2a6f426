//! Taking reserved cores out of general scheduling, and giving them back.
//!
//! - cgroup v2 with the cpuset controller: an `isolated` cpuset partition holding the
//!   reserved cores; the kernel removes them from every other cgroup's CPUs.
//! - cgroup v1 cpusets (what the development hosts have): a housekeeping cpuset with the
//!   other cores, into which every movable task of the root cpuset is moved, and an
//!   exclusive guests cpuset with the reserved cores, which vCPU threads join. Every other
//!   cpuset whose CPUs span the reserved cores (Docker's `docker`, podman's
//!   `libpod_parent`, libvirt's `machine`, a kubelet's `kubepods`, anyone's) is narrowed to
//!   the others first, deepest first, and widened back when the reservation ends: no task
//!   of any cgroup runs on a reserved core.
//! - movable IRQs are pointed at the housekeeping cores (old affinities recorded).
//!
//! Where isolation cannot be made, the reserve is refused naming the cgroup in the way,
//! unless the plan says shared cores are acceptable (`--isolation none`): then the
//! reservation stands without it, and says so (the ledger keeps partitions off each
//! other's cores either way). What the kernel command line would add (isolcpus, nohz_full,
//! rcu_nocbs, boot-time hugepages) is printed by reserve.

use std::path::{Path, PathBuf};

use crate::config::cores;
use crate::host::ledger::IsolationMode;
use crate::host::ledger::{IrqRecord, Isolation, NarrowedCpuset};

/// Errors isolating cores or undoing it.
#[derive(Debug, thiserror::Error)]
pub enum IsolationError {
    /// Isolation cannot be made here and the plan did not accept shared cores.
    #[error(
        "the reserved cores cannot be taken out of the host's cgroups: {why} (reserve with \
         --isolation none to accept cores other cgroups share)"
    )]
    Refused {
        /// What stood in the way, each method's reason.
        why: String,
    },
    /// Another's cgroup holds the reserved cores in a way that cannot be taken from it.
    #[error(
        "{path} is in the way: {why} (give it other cores, or reserve with \
         --isolation none to accept cores other cgroups share)"
    )]
    InTheWay {
        /// The cgroup.
        path: PathBuf,
        /// How.
        why: String,
    },
    /// The record of the cpusets about to be narrowed could not be written.
    #[error("recording the cpusets to narrow: {0}")]
    Record(String),
    /// A cgroup file operation failed.
    #[error("{path}: {what}: {source}")]
    Io {
        /// File or directory.
        path: PathBuf,
        /// Operation.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
}

fn io<'a>(
    path: &'a Path,
    what: &'static str,
) -> impl FnOnce(std::io::Error) -> IsolationError + 'a {
    move |source| IsolationError::Io {
        path: path.to_path_buf(),
        what,
        source,
    }
}

/// Writes down, before any is narrowed, the cpusets [`isolate`] will narrow.
pub type Record<'a> = dyn FnMut(&[NarrowedCpuset]) -> Result<(), String> + 'a;

fn write(path: &Path, v: &str) -> Result<(), IsolationError> {
    std::fs::write(path, v).map_err(io(path, "write"))
}

/// Mount points of cgroup hierarchies, from /proc/mounts text: (v2 mount, v1 cpuset mount).
pub fn cgroup_mounts(mounts: &str) -> (Option<PathBuf>, Option<PathBuf>) {
    let mut v2 = None;
    let mut v1 = None;
    for l in mounts.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 4 {
            continue;
        }
        match f[2] {
            "cgroup2" => v2 = v2.or(Some(PathBuf::from(f[1]))),
            "cgroup" if f[3].split(',').any(|o| o == "cpuset") => {
                v1 = v1.or(Some(PathBuf::from(f[1])))
            }
            _ => {}
        }
    }
    (v2, v1)
}

/// Isolates `reserved`, leaving `housekeeping` to the host. `tag` names our cgroups (one
/// per state directory); `record` writes down the others' cpusets about to be narrowed.
/// With [`IsolationMode::None`] nothing is done and the result says it was asked for;
/// otherwise where it cannot be done the error says what stood in the way.
pub fn isolate(
    reserved: &[usize],
    housekeeping: &[usize],
    tag: &str,
    mode: IsolationMode,
    record: &mut Record<'_>,
) -> Result<Isolation, IsolationError> {
    if mode == IsolationMode::None {
        return Ok(Isolation::None {
            reason: "--isolation none: the reserved cores stay shared with every cgroup, as \
                     asked"
                .into(),
        });
    }
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let (v2, v1) = cgroup_mounts(&mounts);
    let mut reasons = Vec::new();
    // A cgroup in the way is the answer, whichever hierarchy found it.
    if let Some(root) = v2 {
        let controllers =
            std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
        if controllers.split_whitespace().any(|c| c == "cpuset") {
            match isolate_v2(&root, reserved, tag, record) {
                Ok(i) => return Ok(i),
                Err(e) if named_ref(&e) => return Err(e),
                Err(e) => reasons.push(format!("cgroup v2: {e}")),
            }
        } else {
            reasons.push(format!(
                "cgroup v2 at {} has no cpuset controller",
                root.display()
            ));
        }
    }
    if let Some(root) = v1 {
        match isolate_v1(&root, reserved, housekeeping, tag, record) {
            Ok(i) => return Ok(i),
            Err(e) if named_ref(&e) => return Err(e),
            Err(e) => reasons.push(format!("cgroup v1: {e}")),
        }
    } else {
        reasons.push("no cgroup v1 cpuset hierarchy is mounted".into());
    }
    Err(IsolationError::Refused {
        why: reasons.join("; "),
    })
}

/// Whether `e` names what stood in the way (and so is the answer as it is).
fn named_ref(e: &IsolationError) -> bool {
    matches!(
        e,
        IsolationError::InTheWay { .. } | IsolationError::Record(_)
    )
}

fn isolate_v2(
    root: &Path,
    reserved: &[usize],
    tag: &str,
    record: &mut Record<'_>,
) -> Result<Isolation, IsolationError> {
    let dir = root.join(format!("{tag}-guests"));
    // A sibling that holds any of the cores exclusively (another partition) keeps them:
    // the kernel will not take them from it, and neither do we.
    if let Some((path, why)) = siblings_v2_exclusive(root, &dir, reserved)
        .into_iter()
        .next()
    {
        return Err(IsolationError::InTheWay { path, why });
    }
    write(&root.join("cgroup.subtree_control"), "+cpuset")?;
    // Siblings whose own cpuset.cpus spans the cores: the kernel's exclusivity rule
    // leaves a partition over them invalid, so they are narrowed first.
    let siblings: Vec<PathBuf> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .filter(|p| *p != dir)
        .collect();
    let narrowed = narrow_recorded(&siblings, reserved, record)?;
    let undo = |e| {
        let _ = std::fs::remove_dir(&dir);
        widen(&narrowed, &[]);
        e
    };
    if !dir.exists() {
        std::fs::create_dir(&dir)
            .map_err(io(&dir, "mkdir"))
            .map_err(undo)?;
    }
    let list = cores::format(reserved);
    let excl = dir.join("cpuset.cpus.exclusive");
    if excl.exists() {
        write(&excl, &list).map_err(undo)?;
    }
    write(&dir.join("cpuset.cpus"), &list).map_err(undo)?;
    write(&dir.join("cpuset.cpus.partition"), "isolated").map_err(undo)?;
    let state = std::fs::read_to_string(dir.join("cpuset.cpus.partition")).unwrap_or_default();
    if state.trim() != "isolated" {
        let _ = write(&dir.join("cpuset.cpus.partition"), "member");
        return Err(undo(IsolationError::Io {
            path: dir.join("cpuset.cpus.partition"),
            what: "the kernel refused the isolated partition",
            source: std::io::Error::other(state.trim().to_string()),
        }));
    }
    Ok(Isolation::CgroupV2 {
        path: dir,
        narrowed,
    })
}

/// The cgroups beside `ours` under `root` that hold any of `cores` exclusively: a cpuset
/// partition of their own, or `cpuset.cpus.exclusive`; each with what it holds.
fn siblings_v2_exclusive(root: &Path, ours: &Path, cores: &[usize]) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let p = e.path();
        if p == ours || !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let read = |f: &str| std::fs::read_to_string(p.join(f)).unwrap_or_default();
        let partition = read("cpuset.cpus.partition");
        let partition = partition.trim();
        let (held, how) = if partition.starts_with("root") || partition.starts_with("isolated") {
            (
                read("cpuset.cpus.effective"),
                format!("a cpuset partition ({partition})"),
            )
        } else {
            (
                read("cpuset.cpus.exclusive"),
                "cpuset.cpus.exclusive".to_string(),
            )
        };
        let list = cores::parse(held.trim()).unwrap_or_default();
        if list.iter().any(|c| cores.contains(c)) {
            out.push((p, format!("it holds {} exclusively as {how}", held.trim())));
        }
    }
    out
}

/// Moves every task listed in `from/tasks` to `to/tasks`; returns (moved, unmovable).
fn move_tasks(from: &Path, to: &Path) -> (usize, usize) {
    let mut moved = 0;
    let mut unmovable = 0;
    // A second pass catches tasks forked during the first; what is left after it is
    // what the kernel will not move (per-CPU kernel threads).
    for _ in 0..2 {
        unmovable = 0;
        let mut now = 0;
        let tasks = std::fs::read_to_string(from.join("tasks")).unwrap_or_default();
        for tid in tasks.lines() {
            match std::fs::write(to.join("tasks"), tid) {
                Ok(()) => now += 1,
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(_) => unmovable += 1,
            }
        }
        moved += now;
        if now == 0 {
            break;
        }
    }
    (moved, unmovable)
}

fn remove_v1_cpuset(root: &Path, dir: &Path) -> Result<(), IsolationError> {
    if !dir.exists() {
        return Ok(());
    }
    move_tasks(dir, root);
    std::fs::remove_dir(dir).map_err(io(dir, "rmdir"))
}

/// Every cpuset directory below `root` but `skip`, deepest first.
fn cpusets_below(root: &Path, skip: &[&Path]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) && !skip.contains(&p.as_path()) {
                todo.push(p.clone());
                out.push(p);
            }
        }
    }
    out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    out
}

/// The cpusets among `dirs` (in order) whose `cpuset.cpus` spans any of `reserved`, each
/// with the list it is to keep. One that holds nothing but reserved cores cannot be
/// narrowed: the error names it.
pub fn narrowing_plan(
    dirs: &[PathBuf],
    reserved: &[usize],
) -> Result<Vec<NarrowedCpuset>, IsolationError> {
    let mut plan = Vec::new();
    for dir in dirs {
        let Ok(old) = std::fs::read_to_string(dir.join("cpuset.cpus")) else {
            continue;
        };
        let old = old.trim().to_string();
        let cpus = cores::parse(&old).unwrap_or_default();
        if !cpus.iter().any(|c| reserved.contains(c)) {
            continue;
        }
        let left: Vec<usize> = cpus.into_iter().filter(|c| !reserved.contains(c)).collect();
        if left.is_empty() {
            return Err(IsolationError::InTheWay {
                path: dir.clone(),
                why: format!("its cpuset holds only reserved cores ({old})"),
            });
        }
        plan.push(NarrowedCpuset {
            path: dir.clone(),
            cpus: old,
            narrowed_to: cores::format(&left),
        });
    }
    Ok(plan)
}

/// Narrows the cpusets of `plan`, in order; where the kernel refuses one, what was
/// narrowed by then is widened back and the error names the one in the way.
fn narrow(plan: &[NarrowedCpuset]) -> Result<(), IsolationError> {
    for (i, n) in plan.iter().enumerate() {
        if let Err(e) = std::fs::write(n.path.join("cpuset.cpus"), &n.narrowed_to) {
            widen(&plan[..i], &[]);
            return Err(IsolationError::InTheWay {
                path: n.path.clone(),
                why: format!(
                    "the kernel would not narrow its cpuset.cpus to {}: {e}",
                    n.narrowed_to
                ),
            });
        }
    }
    Ok(())
}

/// Gives narrowed cpusets their CPUs back, in the reverse order of narrowing (parents
/// before children), less `keep_off` (the cores other live reservations hold: a give-back
/// never hands another reservation's core to anyone). One gone since (its container ended)
/// is passed over, and one whose CPUs are no longer what was written (its owner changed
/// them) is left as its owner made it. Returns what could not be written back.
pub fn widen(narrowed: &[NarrowedCpuset], keep_off: &[usize]) -> Vec<String> {
    let mut left = Vec::new();
    for n in narrowed.iter().rev() {
        let file = n.path.join("cpuset.cpus");
        let Ok(now) = std::fs::read_to_string(&file) else {
            continue;
        };
        if cores::parse(now.trim()).ok() != cores::parse(&n.narrowed_to).ok() {
            log::warn!(
                "{}: cpuset.cpus is {} now, not the {} reserve left: left as it is",
                n.path.display(),
                now.trim(),
                n.narrowed_to
            );
            continue;
        }
        let Some(back) = without(&n.cpus, keep_off) else {
            continue;
        };
        if let Err(e) = write(&file, &back) {
            left.push(e.to_string());
        }
    }
    left
}

/// Core list `list` less the cores in `keep_off`, as a list; None if nothing is left or
/// the list does not parse.
pub fn without(list: &str, keep_off: &[usize]) -> Option<String> {
    let cores: Vec<usize> = cores::parse(list)
        .ok()?
        .into_iter()
        .filter(|c| !keep_off.contains(c))
        .collect();
    (!cores.is_empty()).then(|| cores::format(&cores))
}

/// The cores of a /proc/irq hex mask ("3", "ff,ffffffff"); None if it does not parse.
pub fn parse_mask(mask: &str) -> Option<Vec<usize>> {
    let mut cores = Vec::new();
    for (i, word) in mask.trim().rsplit(',').enumerate() {
        let w = u32::from_str_radix(word, 16).ok()?;
        cores.extend((0..32).filter(|b| w & (1 << b) != 0).map(|b| i * 32 + b));
    }
    Some(cores)
}

/// Narrows the cpusets in `dirs` off `reserved`, `record`ing the plan first (a reserve
/// killed half-way leaves it for the next to widen).
fn narrow_recorded(
    dirs: &[PathBuf],
    reserved: &[usize],
    record: &mut Record<'_>,
) -> Result<Vec<NarrowedCpuset>, IsolationError> {
    let plan = narrowing_plan(dirs, reserved)?;
    if !plan.is_empty() {
        record(&plan).map_err(IsolationError::Record)?;
        narrow(&plan)?;
    }
    Ok(plan)
}

fn isolate_v1(
    root: &Path,
    reserved: &[usize],
    housekeeping: &[usize],
    tag: &str,
    record: &mut Record<'_>,
) -> Result<Isolation, IsolationError> {
    let hk = root.join(format!("{tag}-housekeeping"));
    let guests = root.join(format!("{tag}-guests"));
    // Leftovers of this state directory's reservation that crashed half-way: give their
    // tasks back first.
    remove_v1_cpuset(root, &guests)?;
    remove_v1_cpuset(root, &hk)?;
    // Everyone else's cpusets off the reserved cores, children before parents (a child's
    // CPUs must stay within its parent's), before ours claims them exclusively.
    let narrowed = narrow_recorded(&cpusets_below(root, &[&hk, &guests]), reserved, record)?;
    let mems =
        std::fs::read_to_string(root.join("cpuset.mems")).map_err(io(root, "read cpuset.mems"))?;
    let setup = || -> Result<(), IsolationError> {
        std::fs::create_dir(&hk).map_err(io(&hk, "mkdir"))?;
        write(&hk.join("cpuset.cpus"), &cores::format(housekeeping))?;
        write(&hk.join("cpuset.mems"), mems.trim())?;
        std::fs::create_dir(&guests).map_err(io(&guests, "mkdir"))?;
        write(&guests.join("cpuset.cpus"), &cores::format(reserved))?;
        write(&guests.join("cpuset.mems"), mems.trim())?;
        write(&guests.join("cpuset.cpu_exclusive"), "1")?;
        Ok(())
    };
    if let Err(e) = setup() {
        let _ = remove_v1_cpuset(root, &guests);
        let _ = remove_v1_cpuset(root, &hk);
        widen(&narrowed, &[]);
        return Err(e);
    }
    let (moved, unmovable) = move_tasks(root, &hk);
    Ok(Isolation::CgroupV1 {
        root: root.to_path_buf(),
        housekeeping: hk,
        guests,
        moved,
        unmovable,
        narrowed,
    })
}

/// Undoes [`isolate`]: our cgroups first (the others' CPUs can only grow back over the
/// reserved cores once the exclusive one is gone), then the narrowed cpusets widened, less
/// `keep_off` (other live reservations' cores).
pub fn restore(iso: &Isolation, keep_off: &[usize]) -> Result<(), IsolationError> {
    let (ours, narrowed, root) = match iso {
        Isolation::None { .. } => return Ok(()),
        Isolation::CgroupV1 {
            root,
            housekeeping,
            guests,
            narrowed,
            ..
        } => {
            let a = remove_v1_cpuset(root, guests);
            let b = remove_v1_cpuset(root, housekeeping);
            (a.and(b), narrowed, root.as_path())
        }
        Isolation::CgroupV2 { path, narrowed } => {
            let parent = path.parent().unwrap_or(Path::new("/"));
            (remove_v2_partition(path), narrowed, parent)
        }
    };
    let left = widen(narrowed, keep_off);
    ours?;
    if left.is_empty() {
        Ok(())
    } else {
        Err(IsolationError::Io {
            path: root.to_path_buf(),
            what: "widening the narrowed cpusets back",
            source: std::io::Error::other(left.join("; ")),
        })
    }
}

/// Removes the cgroups a reserve of state directory `tag` made and recorded nowhere (it was
/// killed before its ledger was written): their tasks go back, and the cores they held
/// exclusively are free for the cpusets narrowed off them to grow back over.
pub fn remove_unrecorded(tag: &str) {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let (v2, v1) = cgroup_mounts(&mounts);
    if let Some(root) = v2 {
        if let Err(e) = remove_v2_partition(&root.join(format!("{tag}-guests"))) {
            log::warn!("{e}");
        }
    }
    if let Some(root) = v1 {
        for part in ["guests", "housekeeping"] {
            if let Err(e) = remove_v1_cpuset(&root, &root.join(format!("{tag}-{part}"))) {
                log::warn!("{e}");
            }
        }
    }
}

/// Moves what runs in the v2 partition `path` to its parent and removes it.
fn remove_v2_partition(path: &Path) -> Result<(), IsolationError> {
    if !path.exists() {
        return Ok(());
    }
    let parent = path.parent().unwrap_or(Path::new("/"));
    let procs = std::fs::read_to_string(path.join("cgroup.procs")).unwrap_or_default();
    for pid in procs.lines() {
        let _ = std::fs::write(parent.join("cgroup.procs"), pid);
    }
    let _ = write(&path.join("cpuset.cpus.partition"), "member");
    std::fs::remove_dir(path).map_err(io(path, "rmdir"))
}

/// What a thread writes to a cgroup's `tasks` to move itself ([`GuestsCpuset::join`]).
const SELF: &str = "0";

/// The reserved cores' cpuset, opened by the launcher while it is root so that vCPU threads
/// started after it gave up root can still join it: the kernel checks a cgroup file's
/// writer against the credentials it was opened with.
#[derive(Debug)]
pub struct GuestsCpuset {
    tasks: std::fs::File,
    path: PathBuf,
}

impl GuestsCpuset {
    /// For cgroup v1, the guests cpuset's `tasks` file, to be joined thread by thread
    /// ([`GuestsCpuset::join`]). For cgroup v2 the whole launcher joins the isolated
    /// partition here and now (`None`); without isolation there is nothing to join.
    pub fn open(iso: &Isolation) -> Result<Option<Self>, IsolationError> {
        match iso {
            Isolation::None { .. } => Ok(None),
            Isolation::CgroupV1 { guests, .. } => {
                let path = guests.join("tasks");
                let tasks = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map_err(io(&path, "open"))?;
                Ok(Some(Self { tasks, path }))
            }
            Isolation::CgroupV2 { path, .. } => {
                write(&path.join("cgroup.procs"), &std::process::id().to_string())?;
                Ok(None)
            }
        }
    }

    /// Moves the calling thread into the cpuset. Call from each vCPU thread before it pins
    /// itself.
    ///
    /// It writes `0`, the kernel's word for the writing thread, not its thread id: a thread
    /// that moves itself is all the kernel then locks (Linux 5.17 on, and the stable trees
    /// it went back to: upstream 9a3284fad42f, "cgroup: Optimize single thread migration"),
    /// where a number takes the global thread-group lock for writing, which first waits for
    /// an RCU grace period (milliseconds on a busy host, before the guest can start).
    pub fn join(&self) -> Result<(), IsolationError> {
        use std::io::Write;
        (&self.tasks)
            .write_all(SELF.as_bytes())
            .map_err(io(&self.path, "write"))
    }
}

/// Hex mask in the /proc/irq format ("3", "ff,ffffffff").
pub fn cpu_mask(cores: &[usize]) -> String {
    let words = cores.iter().map(|c| c / 32 + 1).max().unwrap_or(1);
    let mut w = vec![0u32; words];
    for &c in cores {
        w[c / 32] |= 1 << (c % 32);
    }
    let mut parts: Vec<String> = w.iter().rev().map(|x| format!("{x:08x}")).collect();
    let first = parts[0].trim_start_matches('0');
    parts[0] = if first.is_empty() {
        "0".into()
    } else {
        first.into()
    };
    parts.join(",")
}

/// Every IRQ affinity a reservation of `reserved` would move, as it is now (each IRQ whose
/// affinity includes a reserved core, and the default for new IRQs): what a reserve writes
/// down before it moves any ([`point_irqs`]), so that a reserve killed part-way can be put
/// back.
pub fn irqs_to_move(reserved: &[usize]) -> Vec<IrqRecord> {
    let mut records = Vec::new();
    let entries = std::fs::read_dir("/proc/irq")
        .into_iter()
        .flatten()
        .flatten();
    for e in entries {
        let file = e.path().join("smp_affinity_list");
        let Ok(old) = std::fs::read_to_string(&file) else {
            continue;
        };
        let old = old.trim().to_string();
        let Ok(cur) = cores::parse(&old) else {
            continue;
        };
        if cur.iter().any(|c| reserved.contains(c)) {
            records.push(IrqRecord { file, old });
        }
    }
    let dflt = PathBuf::from("/proc/irq/default_smp_affinity");
    if let Ok(old) = std::fs::read_to_string(&dflt) {
        records.push(IrqRecord {
            file: dflt,
            old: old.trim().to_string(),
        });
    }
    records
}

/// Points each of `records`' IRQs (and the default, if among them) at the housekeeping
/// cores. Returns the records to restore (those moved) and the IRQs that refused (the
/// kernel manages their affinity).
pub fn point_irqs(records: &[IrqRecord], housekeeping: &[usize]) -> (Vec<IrqRecord>, Vec<u32>) {
    let hk = cores::format(housekeeping);
    let mut moved = Vec::new();
    let mut refused = Vec::new();
    for r in records {
        let default = r.file.file_name() == Some(std::ffi::OsStr::new("default_smp_affinity"));
        let to = if default {
            cpu_mask(housekeeping)
        } else {
            hk.clone()
        };
        match std::fs::write(&r.file, to) {
            Ok(()) => moved.push(r.clone()),
            Err(_) if default => {}
            Err(_) => refused.extend(
                r.file
                    .parent()
                    .and_then(|d| d.file_name()?.to_str()?.parse::<u32>().ok()),
            ),
        }
    }
    (moved, refused)
}

/// An IRQ whose affinity includes a reserved core.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct IrqOnCore {
    /// Its number.
    pub irq: u32,
    /// Its affinity (smp_affinity_list).
    pub affinity: String,
}

/// Every IRQ of `proc_irq` (normally /proc/irq) whose affinity includes one of `reserved`,
/// except the numbers in `left` (those the kernel would not let a reservation move).
pub fn irqs_on(proc_irq: &Path, reserved: &[usize], left: &[u32]) -> Vec<IrqOnCore> {
    let mut on: Vec<IrqOnCore> = std::fs::read_dir(proc_irq)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let irq: u32 = e.file_name().to_str()?.parse().ok()?;
            let affinity = std::fs::read_to_string(e.path().join("smp_affinity_list")).ok()?;
            let affinity = affinity.trim().to_string();
            let cur = cores::parse(&affinity).ok()?;
            (!left.contains(&irq) && cur.iter().any(|c| reserved.contains(c)))
                .then_some(IrqOnCore { irq, affinity })
        })
        .collect();
    on.sort_by_key(|i| i.irq);
    on
}

/// Writes back recorded IRQ affinities, less `keep_off` (the cores other live reservations
/// hold: what this reservation found there may have been put there by one of them, or be
/// theirs now); an IRQ that would be left on no core stays where it is, and IRQs that went
/// away are skipped. Returns the records that could not be written back.
pub fn restore_irqs(records: &[IrqRecord], keep_off: &[usize]) -> Vec<IrqRecord> {
    records
        .iter()
        .filter(|r| r.file.exists())
        .filter(|r| {
            let default = r.file.file_name() == Some(std::ffi::OsStr::new("default_smp_affinity"));
            let back = if default {
                parse_mask(&r.old).and_then(|c| {
                    let c: Vec<usize> = c.into_iter().filter(|c| !keep_off.contains(c)).collect();
                    (!c.is_empty()).then(|| cpu_mask(&c))
                })
            } else {
                without(&r.old, keep_off)
            };
            back.is_some_and(|b| std::fs::write(&r.file, b).is_err())
        })
        .cloned()
        .collect()
}

/// Kernel command-line parameters that would isolate `reserved` fully and reserve the pool
/// at boot, for those the running kernel's `cmdline` lacks.
pub fn cmdline_advice(
    cmdline: &str,
    reserved: &[usize],
    page_size: u64,
    pages: u64,
) -> Option<String> {
    let has = |k: &str| cmdline.split_whitespace().any(|w| w.starts_with(k));
    let list = cores::format(reserved);
    let mut add = Vec::new();
    if !has("isolcpus=") {
        add.push(format!("isolcpus=managed_irq,domain,{list}"));
    }
    if !has("nohz_full=") {
        add.push(format!("nohz_full={list}"));
    }
    if !has("rcu_nocbs=") {
        add.push(format!("rcu_nocbs={list}"));
    }
    if !has("hugepages=") {
        let sz = if page_size >= 1 << 30 { "1G" } else { "2M" };
        add.push(format!("hugepagesz={sz} hugepages={pages}"));
    }
    (!add.is_empty()).then(|| add.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A vCPU thread moves itself by writing `0` (the form the kernel moves without its
    /// global thread-group lock), through the descriptor opened at `open`.
    #[test]
    fn a_thread_joins_the_guests_cpuset_as_itself() {
        let dir = std::env::temp_dir().join(format!("guests-cpuset-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("tasks"), "").unwrap();
        let iso = Isolation::CgroupV1 {
            root: dir.clone(),
            housekeeping: dir.join("hk"),
            guests: dir.clone(),
            moved: 0,
            unmovable: 0,
            narrowed: Vec::new(),
        };
        let cpuset = GuestsCpuset::open(&iso)
            .unwrap()
            .expect("a v1 cpuset to join");
        std::fs::remove_file(dir.join("tasks")).unwrap();
        std::fs::write(dir.join("tasks"), "").unwrap();
        // The file opened before is the one written, not whatever is at the path now.
        cpuset.join().unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("tasks")).unwrap(), "");
        drop(cpuset);
        let cpuset = GuestsCpuset::open(&iso).unwrap().unwrap();
        cpuset.join().unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("tasks")).unwrap(), "0");
        let none = Isolation::None {
            reason: "shared".into(),
        };
        assert!(GuestsCpuset::open(&none).unwrap().is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn finds_cgroup_mounts() {
        let m = "\
tmpfs /sys/fs/cgroup tmpfs rw 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/cpuset cgroup rw,relatime,cpuset 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
";
        assert_eq!(
            cgroup_mounts(m),
            (
                Some("/sys/fs/cgroup/unified".into()),
                Some("/sys/fs/cgroup/cpuset".into())
            )
        );
        assert_eq!(cgroup_mounts(""), (None, None));
    }

    #[test]
    fn masks() {
        assert_eq!(cpu_mask(&[0]), "1");
        assert_eq!(cpu_mask(&[0, 1]), "3");
        assert_eq!(cpu_mask(&[4]), "10");
        assert_eq!(cpu_mask(&[32]), "1,00000000");
        assert_eq!(cpu_mask(&[]), "0");
    }

    #[test]
    fn advice_lists_only_what_is_missing() {
        let a = cmdline_advice("quiet", &[2, 3], 2 << 20, 512).unwrap();
        assert_eq!(
            a,
            "isolcpus=managed_irq,domain,2-3 nohz_full=2-3 rcu_nocbs=2-3 hugepagesz=2M hugepages=512"
        );
        let b = cmdline_advice("isolcpus=2-3 nohz_full=2-3 quiet", &[2, 3], 1 << 30, 4).unwrap();
        assert_eq!(b, "rcu_nocbs=2-3 hugepagesz=1G hugepages=4");
        assert_eq!(
            cmdline_advice(
                "isolcpus=1 nohz_full=1 rcu_nocbs=1 hugepages=8",
                &[1],
                2 << 20,
                8
            ),
            None
        );
    }

    /// A give-back puts an IRQ back as it was, less the cores another live reservation
    /// holds; one that would be left on none stays where it is.
    #[test]
    fn irqs_go_back_without_another_reservations_cores() {
        let d = std::env::temp_dir().join(format!("irq-restore-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("5")).unwrap();
        std::fs::create_dir_all(d.join("6")).unwrap();
        let list5 = d.join("5/smp_affinity_list");
        let list6 = d.join("6/smp_affinity_list");
        let dflt = d.join("default_smp_affinity");
        for f in [&list5, &list6, &dflt] {
            std::fs::write(f, "0").unwrap();
        }
        let rec = |file: &Path, old: &str| IrqRecord {
            file: file.to_path_buf(),
            old: old.into(),
        };
        let records = [rec(&list5, "0-3"), rec(&list6, "2"), rec(&dflt, "f")];
        // Nobody else holds a core: everything as it was.
        assert!(restore_irqs(&records, &[]).is_empty());
        assert_eq!(std::fs::read_to_string(&list5).unwrap(), "0-3");
        assert_eq!(std::fs::read_to_string(&list6).unwrap(), "2");
        assert_eq!(std::fs::read_to_string(&dflt).unwrap(), "f");
        // Core 2 is another live reservation's: kept off it, and IRQ 6 (only on 2) stays.
        for f in [&list5, &list6, &dflt] {
            std::fs::write(f, "0").unwrap();
        }
        assert!(restore_irqs(&records, &[2]).is_empty());
        assert_eq!(std::fs::read_to_string(&list5).unwrap(), "0-1,3");
        assert_eq!(std::fs::read_to_string(&list6).unwrap(), "0");
        assert_eq!(std::fs::read_to_string(&dflt).unwrap(), "b");
        assert_eq!(
            parse_mask("ff,00000001"),
            Some([vec![0], (32..40).collect()].concat())
        );
        assert_eq!(parse_mask("zz"), None);
        assert_eq!(without("0-3", &[1, 2]).as_deref(), Some("0,3"));
        assert_eq!(without("1", &[1]), None);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
