//! Running inside a pod (docs/kubernetes.md): the cores are the ones the kubelet put in the
//! container's cpuset, the memory comes from the pod's hugetlbfs volume within its hugetlb
//! limit. Nothing host-wide (cpusets, IRQ affinities, the kernel's hugepage count) is
//! touched: the node owns those.
//!
//! Exclusive cores: the kubelet's static CPU manager gives a Guaranteed pod's container
//! CPUs nobody else is scheduled on, but does not mark its cgroup; so a container's cores are
//! taken as exclusive when the cgroup says so (cgroup v1 `cpuset.cpu_exclusive`, cgroup v2 a
//! `root` or `isolated` cpuset partition) or when the kubelet's CPU manager checkpoint
//! (`cpu_manager_state`, mounted read-only into the pod) assigns them to a container and
//! keeps them out of its shared pool. Anything else is refused: a partition on shared cores
//! is not one.

use std::path::{Path, PathBuf};

/// Errors finding the pod's cores and memory.
#[derive(Debug, thiserror::Error)]
pub enum PodError {
    /// This process's cgroup for a controller cannot be found or read.
    #[error("cgroup {controller}: {why}")]
    Cgroup {
        /// The controller.
        controller: &'static str,
        /// Why.
        why: String,
    },
    /// This process is in the root cpuset: every core of the host.
    #[error(
        "--cores from-cgroup: this process is in the root cpuset ({dir}), which holds every \
         core of the host ({cores}); from-cgroup takes the cores a pod's cgroup was given \
         (docs/kubernetes.md), name the cores with --cores otherwise"
    )]
    RootCgroup {
        /// The cgroup directory.
        dir: PathBuf,
        /// Its cores.
        cores: String,
    },
    /// The cgroup's cores are not exclusive.
    #[error(
        "--cores from-cgroup: cores {cores} of cgroup {dir} are not exclusive ({why}); a \
         partition needs cores nobody else runs on (a Guaranteed pod with whole CPUs under \
         the kubelet's static CPU manager: pass its cpu_manager_state with \
         --kubelet-cpu-state, docs/kubernetes.md)"
    )]
    NotExclusive {
        /// The cores.
        cores: String,
        /// The cgroup directory.
        dir: PathBuf,
        /// What was checked.
        why: String,
    },
    /// The memory directory is not on hugetlbfs.
    #[error("--memory-from {0}: not a hugetlbfs mount (an emptyDir with medium HugePages-2Mi)")]
    NotHugetlbfs(PathBuf),
    /// The guest's memory is not a multiple of the volume's page size.
    #[error("--memory: {size} bytes is not a multiple of the {page} byte pages of {dir}")]
    PageMultiple {
        /// Size asked for.
        size: u64,
        /// The mount's page size.
        page: u64,
        /// The mount.
        dir: PathBuf,
    },
    /// More than the pod's hugetlb limit leaves.
    #[error(
        "--memory: {want} bytes of {page_kb} KiB hugepages is more than the pod's hugetlb \
         limit leaves ({left} of {limit} bytes, cgroup {dir})"
    )]
    OverLimit {
        /// Bytes asked for.
        want: u64,
        /// Bytes left under the limit.
        left: u64,
        /// The limit.
        limit: u64,
        /// Page size in KiB.
        page_kb: u64,
        /// The cgroup.
        dir: PathBuf,
    },
    /// The memory file could not be made.
    #[error("--memory-from {dir}: {why}")]
    Memory {
        /// The directory.
        dir: PathBuf,
        /// Why.
        why: String,
    },
}

impl PodError {
    /// Whether the request is at fault (exit 2): cores that are not exclusive, a wrong
    /// directory, a size over the limit.
    pub fn is_usage(&self) -> bool {
        !matches!(self, Self::Cgroup { .. })
    }
}

/// One cgroup file system mounted in this mount namespace, from `/proc/self/mountinfo`.
#[derive(Debug, PartialEq, Eq)]
struct CgroupMount {
    /// The cgroup the mount shows as its top (mountinfo's root field): `/` on a host,
    /// the container's own cgroup where a runtime bind-mounted it there.
    root: String,
    /// Where it is mounted.
    point: PathBuf,
    /// cgroup v2 (else v1).
    v2: bool,
    /// Its super options (a v1 hierarchy's controllers among them).
    options: Vec<String>,
}

/// mountinfo's octal escapes (`\040` for a space) undone.
fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The cgroup mounts of a `/proc/self/mountinfo` text.
fn cgroup_mounts(mountinfo: &str) -> Vec<CgroupMount> {
    mountinfo
        .lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let pre: Vec<&str> = pre.split_whitespace().collect();
            let post: Vec<&str> = post.split_whitespace().collect();
            let v2 = match *post.first()? {
                "cgroup2" => true,
                "cgroup" => false,
                _ => return None,
            };
            Some(CgroupMount {
                root: unescape(pre.get(3)?),
                point: PathBuf::from(unescape(pre.get(4)?)),
                v2,
                options: post
                    .get(2)
                    .map(|o| o.split(',').map(String::from).collect())
                    .unwrap_or_default(),
            })
        })
        .collect()
}

/// `path` (a cgroup as `/proc/self/cgroup` names it) under the mount `m`: the part of it
/// below the mount's root, joined to the mount point. None when the cgroup is outside
/// what the mount shows.
fn under_mount(m: &CgroupMount, path: &str) -> Option<PathBuf> {
    let root = m.root.trim_end_matches('/');
    let rel = if root.is_empty() {
        path
    } else if path == root {
        ""
    } else {
        path.strip_prefix(root)?.strip_prefix('/')?
    };
    Some(m.point.join(rel.trim_start_matches('/')))
}

/// Where this process's cgroup for `controller` is, from `/proc/self/cgroup` and
/// `/proc/self/mountinfo` texts: under a cgroup v1 hierarchy that has the controller, else
/// under the cgroup v2 hierarchy if the controller is enabled there. A container's cgroup
/// is found too: its runtime mounts the hierarchy with the container's cgroup as its root
/// (mountinfo's root field says which), and with a cgroup namespace `/proc/self/cgroup`
/// names that root `/`.
pub fn cgroup_dir(controller: &str, proc_cgroup: &str, mountinfo: &str) -> Option<PathBuf> {
    let mounts = cgroup_mounts(mountinfo);
    let mut v2_path = None;
    for l in proc_cgroup.lines() {
        let mut f = l.splitn(3, ':');
        let (Some(id), Some(ctrls), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if id == "0" && ctrls.is_empty() {
            v2_path = Some(path.to_string());
        } else if ctrls.split(',').any(|c| c == controller) {
            return mounts
                .iter()
                .filter(|m| !m.v2 && m.options.iter().any(|o| o == controller))
                .find_map(|m| under_mount(m, path));
        }
    }
    let path = v2_path?;
    let dir = mounts
        .iter()
        .filter(|m| m.v2)
        .find_map(|m| under_mount(m, &path))?;
    let ctrls = std::fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
    // The root cgroup lists every controller; a child only those its parent enabled.
    ctrls
        .split_whitespace()
        .any(|c| c == controller)
        .then_some(dir)
}

/// Whether `dir` is its hierarchy's root cgroup (every core of the host, nobody's grant),
/// by what only a root has: on cgroup v2 no `cgroup.type`; a v1 cpuset
/// `cpuset.memory_pressure_enabled`. Not by where it is mounted: inside a container the
/// container's own cgroup is mounted where the root would be.
pub fn is_root_cgroup(dir: &Path) -> bool {
    if dir.join("cgroup.controllers").exists() {
        return !dir.join("cgroup.type").exists();
    }
    if dir.join("cpuset.cpus").exists() {
        return dir.join("cpuset.memory_pressure_enabled").exists();
    }
    !dir.parent()
        .is_some_and(|p| p.join("cgroup.procs").exists())
}

fn own_cgroup_dir(controller: &'static str) -> Result<PathBuf, PodError> {
    let read = |p: &str| {
        std::fs::read_to_string(p).map_err(|e| PodError::Cgroup {
            controller,
            why: format!("{p}: {e}"),
        })
    };
    cgroup_dir(
        controller,
        &read("/proc/self/cgroup")?,
        &read("/proc/self/mountinfo")?,
    )
    .ok_or(PodError::Cgroup {
        controller,
        why: "this process is in no cgroup with that controller".into(),
    })
}

fn read_trim(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

/// The kubelet's CPU manager checkpoint (`/var/lib/kubelet/cpu_manager_state`).
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct CpuManagerState {
    policy_name: String,
    #[serde(default)]
    default_cpu_set: String,
    #[serde(default)]
    entries: std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>,
}

/// Whether `cores` are exclusive according to a CPU manager checkpoint's text: the static
/// policy, none of them in the shared pool, all of them assigned to containers.
pub fn exclusive_by_kubelet(cores: &[usize], state: &str) -> Result<(), String> {
    let s: CpuManagerState =
        serde_json::from_str(state).map_err(|e| format!("cpu_manager_state: {e}"))?;
    if s.policy_name != "static" {
        return Err(format!(
            "the kubelet's CPU manager policy is {:?}, not static",
            s.policy_name
        ));
    }
    let shared = crate::config::cores::parse(&s.default_cpu_set).unwrap_or_default();
    if let Some(c) = cores.iter().find(|c| shared.contains(c)) {
        return Err(format!("core {c} is in the kubelet's shared pool"));
    }
    let assigned: Vec<usize> = s
        .entries
        .values()
        .flat_map(|containers| containers.values())
        .flat_map(|set| crate::config::cores::parse(set).unwrap_or_default())
        .collect();
    match cores.iter().find(|c| !assigned.contains(c)) {
        Some(c) => Err(format!("core {c} is assigned to no container")),
        None => Ok(()),
    }
}

/// This process's cpuset cgroup as read, before anything is judged of it
/// ([`CgroupCpuset::exclusive_cores`] does that).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupCpuset {
    /// Its directory.
    pub dir: PathBuf,
    /// A cgroup v2 hierarchy (else v1).
    pub v2: bool,
    /// Its cores (`cpuset.cpus.effective`, or `cpuset.cpus` under v1).
    pub cores: Vec<usize>,
    /// It is the hierarchy's root.
    pub root: bool,
    /// v1: `cpuset.cpu_exclusive` reads 1.
    pub cpu_exclusive: bool,
    /// v2: `cpuset.cpus.partition` ("" when absent).
    pub partition: String,
    /// With `--kubelet-cpu-state FILE`: the file, and whether its checkpoint grants every
    /// one of the cores (the reason when not, or when it cannot be read).
    pub kubelet: Option<(PathBuf, Result<(), String>)>,
}

impl CgroupCpuset {
    /// Reads this process's cpuset cgroup and, with `kubelet_state`, the kubelet's
    /// checkpoint about its cores.
    pub fn read(kubelet_state: Option<&Path>) -> Result<Self, PodError> {
        let dir = own_cgroup_dir("cpuset")?;
        let cg = |what: String| PodError::Cgroup {
            controller: "cpuset",
            why: what,
        };
        let v2 = dir.join("cpuset.cpus.effective").exists();
        let list = read_trim(&dir.join(if v2 {
            "cpuset.cpus.effective"
        } else {
            "cpuset.cpus"
        }))
        .ok_or_else(|| cg(format!("{}: no cpuset.cpus", dir.display())))?;
        let cores = crate::config::cores::parse(&list).map_err(|e| cg(format!("{list:?}: {e}")))?;
        // A checkpoint is a few KiB of JSON; 1 MiB bounds a mistaken or hostile file.
        let kubelet = kubelet_state.map(|p| {
            let granted = crate::sys::files::read_limited(p, 1 << 20)
                .map_err(|e| format!("{}: {e}", p.display()))
                .and_then(|b| {
                    String::from_utf8(b).map_err(|_| format!("{}: not UTF-8", p.display()))
                })
                .and_then(|t| exclusive_by_kubelet(&cores, &t));
            (p.to_path_buf(), granted)
        });
        Ok(Self {
            root: is_root_cgroup(&dir),
            cpu_exclusive: !v2
                && read_trim(&dir.join("cpuset.cpu_exclusive")).as_deref() == Some("1"),
            partition: match v2 {
                true => read_trim(&dir.join("cpuset.cpus.partition")).unwrap_or_default(),
                false => String::new(),
            },
            dir,
            v2,
            cores,
            kubelet,
        })
    }

    /// Its cores, if they are exclusive (see the module documentation), and how that was
    /// established; else why not.
    pub fn exclusive_cores(&self) -> Result<(Vec<usize>, String), PodError> {
        let (dir, cores) = (&self.dir, &self.cores);
        // The hierarchy's root (v1: its cpu_exclusive is 1 and it holds every core) is
        // nobody's grant.
        if self.root {
            return Err(PodError::RootCgroup {
                dir: dir.clone(),
                cores: crate::config::cores::format(cores),
            });
        }
        // Given the kubelet's checkpoint, every core must be one it granted, whatever the
        // cgroup says of itself.
        if let Some((_, Err(e))) = &self.kubelet {
            return Err(PodError::NotExclusive {
                cores: crate::config::cores::format(cores),
                dir: dir.clone(),
                why: e.clone(),
            });
        }
        let mut why = Vec::new();
        if !self.v2 {
            if self.cpu_exclusive {
                return Ok((
                    cores.clone(),
                    format!("cgroup v1 {} has cpu_exclusive", dir.display()),
                ));
            }
            why.push("cpuset.cpu_exclusive is 0".to_string());
        } else {
            let part = &self.partition;
            if part == "root" || part == "isolated" {
                return Ok((
                    cores.clone(),
                    format!("cgroup v2 {} is a {part} partition", dir.display()),
                ));
            }
            why.push(format!("cpuset.cpus.partition is {part:?}"));
        }
        match &self.kubelet {
            Some((p, Ok(()))) => {
                return Ok((
                    cores.clone(),
                    format!("the kubelet's static CPU manager ({})", p.display()),
                ));
            }
            _ => why.push("no --kubelet-cpu-state given".into()),
        }
        Err(PodError::NotExclusive {
            cores: crate::config::cores::format(cores),
            dir: dir.clone(),
            why: why.join("; "),
        })
    }
}

/// The tightest memory limit over this process's memory cgroup and its ancestors, in
/// bytes, and the cgroup that sets it (None: no limit, or no memory controller).
pub fn memory_limit() -> Option<(u64, PathBuf)> {
    let dir = own_cgroup_dir("memory").ok()?;
    let v2 = dir.join("cgroup.controllers").exists();
    let file = if v2 {
        "memory.max"
    } else {
        "memory.limit_in_bytes"
    };
    let mut best: Option<(u64, PathBuf)> = None;
    let mut at = Some(dir.as_path());
    while let Some(d) = at {
        if !d.join(file).exists() {
            break;
        }
        if let Some(n) = read_trim(&d.join(file)).and_then(|v| v.parse::<u64>().ok()) {
            // v1's "no limit" is the largest page-aligned value.
            if n < (i64::MAX as u64) & !4095 && best.as_ref().is_none_or(|(b, _)| n < *b) {
                best = Some((n, d.to_path_buf()));
            }
        }
        at = d.parent();
    }
    best
}

/// The hugetlb limit and usage in bytes of this process's cgroup for pages of `page_size`
/// (None: no limit).
pub fn hugetlb_room(page_size: u64) -> Result<Option<(u64, u64, PathBuf)>, PodError> {
    let dir = match own_cgroup_dir("hugetlb") {
        Ok(d) => d,
        // No hugetlb controller anywhere: no limit to respect.
        Err(_) => return Ok(None),
    };
    let size = if page_size >= 1 << 30 {
        format!("{}GB", page_size >> 30)
    } else {
        format!("{}MB", page_size >> 20)
    };
    let cg = |what: String| PodError::Cgroup {
        controller: "hugetlb",
        why: what,
    };
    let (limit, usage) = if dir.join(format!("hugetlb.{size}.max")).exists() {
        (
            read_trim(&dir.join(format!("hugetlb.{size}.max"))),
            read_trim(&dir.join(format!("hugetlb.{size}.current"))),
        )
    } else {
        (
            read_trim(&dir.join(format!("hugetlb.{size}.limit_in_bytes"))),
            read_trim(&dir.join(format!("hugetlb.{size}.usage_in_bytes"))),
        )
    };
    // No limit file: the controller does not govern this cgroup (the root cgroup, or v2
    // without hugetlb enabled above it): no limit applies.
    let Some(limit) = limit else {
        return Ok(None);
    };
    if limit == "max" {
        return Ok(None);
    }
    let num = |s: &str| {
        s.parse::<u64>()
            .map_err(|_| cg(format!("{}: {s:?} is not a number", dir.display())))
    };
    let limit = num(&limit)?;
    // v1's "no limit" is the largest page-aligned value.
    if limit >= (i64::MAX as u64) & !(page_size - 1) {
        return Ok(None);
    }
    Ok(Some((limit, num(&usage.unwrap_or_default())?, dir)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This development host's cgroup mounts (cgroup v1 cpuset and memory, v2 unified).
    const MOUNTINFO: &str = "\
30 24 0:26 / /sys/fs/cgroup/cpuset rw,nosuid,nodev,noexec,relatime shared:12 - cgroup cgroup rw,cpuset
31 24 0:27 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:13 - cgroup cgroup rw,memory
25 24 0:22 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:6 - cgroup2 cgroup2 rw
";

    /// Inside a runc container on cgroup v1, captured from tests/cri.rs's pod (containerd
    /// 1.6.20's CRI, runc 1.1.5, this host): each hierarchy bind-mounted read-only with the
    /// container's cgroup as its root; no cgroup namespace, no cgroup2 mount.
    const V1_CONTAINER: (&str, &str) = (
        "\
4:memory:/kubepods/podpartition-cri-23517/ae882ed9f44f87716eb1f796bccfffd832434600c5a3681ef29eb871d16bd967
3:cpuset:/kubepods/podpartition-cri-23517/ae882ed9f44f87716eb1f796bccfffd832434600c5a3681ef29eb871d16bd967
0::/kubepods/podpartition-cri-23517/ae882ed9f44f87716eb1f796bccfffd832434600c5a3681ef29eb871d16bd967
",
        "\
104 103 0:56 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - tmpfs tmpfs rw,mode=755
107 104 0:31 /kubepods/podpartition-cri-23517/ae882ed9f44f87716eb1f796bccfffd832434600c5a3681ef29eb871d16bd967 /sys/fs/cgroup/cpuset ro,nosuid,nodev,noexec,relatime - cgroup cgroup rw,cpuset
108 104 0:32 /kubepods/podpartition-cri-23517/ae882ed9f44f87716eb1f796bccfffd832434600c5a3681ef29eb871d16bd967 /sys/fs/cgroup/memory ro,nosuid,nodev,noexec,relatime - cgroup cgroup rw,memory
",
    );

    /// Inside a container on cgroup v2 with a cgroup namespace (containerd's default
    /// there): the container's cgroup is `/` to it, and mounted at /sys/fs/cgroup. Written
    /// from cgroup_namespaces(7), not captured: this host's containerd runs on cgroup v1.
    const V2_NAMESPACED: (&str, &str) = (
        "0::/\n",
        "812 811 0:30 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw,nsdelegate\n",
    );

    #[test]
    fn the_root_of_a_hierarchy_is_known_by_what_only_a_root_has() {
        let d = std::env::temp_dir().join(format!("pod-root-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let v2 = d.join("v2");
        let v1 = d.join("v1");
        for (dir, files) in [
            (v2.clone(), &["cgroup.controllers", "cgroup.procs"][..]),
            (
                v2.join("pod"),
                &["cgroup.controllers", "cgroup.procs", "cgroup.type"][..],
            ),
            (
                v1.clone(),
                &[
                    "cpuset.cpus",
                    "cgroup.procs",
                    "cpuset.memory_pressure_enabled",
                ][..],
            ),
            (v1.join("kubepods"), &["cpuset.cpus", "cgroup.procs"][..]),
        ] {
            std::fs::create_dir_all(&dir).unwrap();
            for f in files {
                std::fs::write(dir.join(f), "").unwrap();
            }
        }
        assert!(is_root_cgroup(&v2));
        assert!(!is_root_cgroup(&v2.join("pod")));
        assert!(is_root_cgroup(&v1));
        assert!(!is_root_cgroup(&v1.join("kubepods")));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn cgroup_directories_are_found_on_hosts_and_inside_containers() {
        let pc = "4:memory:/kubepods/pod1\n3:cpuset:/kubepods/pod1/c1\n0::/kubepods/pod1/c1\n";
        assert_eq!(
            cgroup_dir("cpuset", pc, MOUNTINFO),
            Some(PathBuf::from("/sys/fs/cgroup/cpuset/kubepods/pod1/c1"))
        );
        // A controller no v1 hierarchy has: v2, if enabled there (not in this fake tree).
        assert_eq!(cgroup_dir("hugetlb", pc, MOUNTINFO), None);
        assert_eq!(cgroup_dir("cpuset", "", MOUNTINFO), None);
        // A v1 controller without a mount.
        assert_eq!(cgroup_dir("cpuset", "3:cpuset:/x\n", ""), None);
        // A v1 container: its cgroup is the mount's root, so it is the mount point itself
        // (the path /proc/self/cgroup gives does not exist in there).
        assert_eq!(
            cgroup_dir("cpuset", V1_CONTAINER.0, V1_CONTAINER.1),
            Some(PathBuf::from("/sys/fs/cgroup/cpuset"))
        );
        // A cgroup outside what the mount shows is not found.
        assert_eq!(
            cgroup_dir("cpuset", "12:cpuset:/other\n", V1_CONTAINER.1),
            None
        );
        // Below the mount's root: the rest joined to the mount point.
        assert_eq!(
            cgroup_dir(
                "cpuset",
                "3:cpuset:/kubepods/podpartition-cri-23517/ae882ed9f44f87716eb1f796bccfffd832434600c5a3681ef29eb871d16bd967/sub\n",
                V1_CONTAINER.1
            ),
            Some(PathBuf::from("/sys/fs/cgroup/cpuset/sub"))
        );
        // v2 with a cgroup namespace: "/" is the container's cgroup, at the mount point (the
        // controller check reads the real file there, so only the path is checked here).
        let m = cgroup_mounts(V2_NAMESPACED.1);
        assert_eq!(m.len(), 1);
        assert_eq!(
            under_mount(&m[0], "/"),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
        // Escapes in mount points.
        assert_eq!(unescape("/a\\040b"), "/a b");
    }

    #[test]
    fn the_kubelets_checkpoint_decides_exclusivity() {
        let state = r#"{"policyName":"static","defaultCpuSet":"0,3-7",
            "entries":{"pod-uid":{"vmm":"1-2"}},"checksum":1}"#;
        assert_eq!(exclusive_by_kubelet(&[1, 2], state), Ok(()));
        assert!(
            exclusive_by_kubelet(&[2, 3], state)
                .unwrap_err()
                .contains("shared pool")
        );
        let unassigned = r#"{"policyName":"static","defaultCpuSet":"0","entries":{}}"#;
        assert!(
            exclusive_by_kubelet(&[1], unassigned)
                .unwrap_err()
                .contains("assigned to no container")
        );
        let none = r#"{"policyName":"none","defaultCpuSet":"","entries":{}}"#;
        assert!(
            exclusive_by_kubelet(&[1], none)
                .unwrap_err()
                .contains("not static")
        );
        assert!(exclusive_by_kubelet(&[1], "{").is_err());
    }
}
