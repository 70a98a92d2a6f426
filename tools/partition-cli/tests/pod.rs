//! A pod simulated on this host (docs/kubernetes.md): a cgroup with an exclusive cpuset and a
//! hugetlb limit, a hugetlbfs mount standing in for the pod's `HugePages-2Mi` volume, and
//! `partition launch --cores from-cgroup --memory-from DIR --api-socket PATH` started inside
//! that cgroup. The probe guest boots on the cgroup's core from the volume's memory; the
//! test drives the API (description, state, counters, pause and resume, a malformed request,
//! a clean stop). A launch asking for more than the pod's hugetlb limit, or on cores the
//! cgroup does not hold exclusively, is refused before the guest starts. The host is left as
//! it was: cgroups removed, the mount gone, the hugepage count and the cgroup v2 controllers
//! as they were. On cgroup v1 (this host) the pod is a v1 cpuset (exclusive by
//! `cpu_exclusive`) beside a hugetlb cgroup; on cgroup v2 alone (the rig) one cgroup with
//! both controllers, exclusive as a partition root.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::json;

const LIMIT: Duration = Duration::from_secs(60);
const HUGEPAGES: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages";

fn read(p: &Path) -> String {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .trim()
        .to_string()
}

fn write(p: &Path, v: &str) {
    std::fs::write(p, v).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
}

fn mount_of(fstype: &str, option: Option<&str>) -> Option<PathBuf> {
    read(Path::new("/proc/mounts")).lines().find_map(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        (w.len() >= 4 && w[2] == fstype && option.is_none_or(|o| w[3].split(',').any(|x| x == o)))
            .then(|| PathBuf::from(w[1]))
    })
}

/// One test at a time, held for the whole test: two exclusive cpusets on one core cannot
/// coexist, and a test that compares the host's hugepages before and after must not see
/// another's pod.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The pod: its cgroups, its volume, and what to put back.
struct Pod {
    name: String,
    cpuset: PathBuf,
    hugetlb: PathBuf,
    v2_root: Option<PathBuf>,
    /// The controllers this pod enabled in the v2 root's subtree_control.
    enabled: Vec<String>,
    volume: PathBuf,
    hugepages_before: String,
    dir: Scratch,
}

impl Pod {
    /// A pod holding `core` (exclusively if `exclusive`) with a hugetlb limit of
    /// `limit_mib`; None (and why, printed) where this host cannot make one.
    fn new(tag: &str, core: usize, exclusive: bool, limit_mib: u64) -> Option<Self> {
        let test = format!("pod::{tag}");
        if !kvm_available(&test) {
            return None;
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            skip(&test, "cgroups and hugetlbfs mounts need root");
            return None;
        }
        if host_cores() < 2 {
            skip(&test, "the pod's core needs another for the host");
            return None;
        }
        // cgroup v1 (this host): a cpuset and a hugetlb cgroup, each in its hierarchy.
        // cgroup v2 (the rig): one cgroup with both controllers, exclusive as a partition
        // root.
        let v1_cpuset = mount_of("cgroup", Some("cpuset"));
        let v2_with = |want: &str| {
            mount_of("cgroup2", None).filter(|m| {
                read(&m.join("cgroup.controllers"))
                    .split(' ')
                    .any(|x| x == want)
            })
        };
        let (cpuset_root, hugetlb_root, v2_root) = match (v1_cpuset, v2_with("cpuset")) {
            (Some(cpuset), _) => match mount_of("cgroup", Some("hugetlb")) {
                Some(h) => (cpuset, h, None),
                None => match v2_with("hugetlb") {
                    Some(m) => (cpuset, m.clone(), Some(m)),
                    None => {
                        skip(&test, "no hugetlb cgroup controller here");
                        return None;
                    }
                },
            },
            (None, Some(m)) if v2_with("hugetlb").is_some() => (m.clone(), m.clone(), Some(m)),
            _ => {
                skip(
                    &test,
                    "no cgroup v1 cpuset hierarchy, and no cgroup v2 with cpuset and hugetlb",
                );
                return None;
            }
        };
        let v2_cpuset = v2_root.as_ref() == Some(&cpuset_root);
        let name = format!("partition-pod-{tag}-{}", std::process::id());
        let dir = Scratch::new(&format!("pod-{tag}"));
        let mut pod = Self {
            name: name.clone(),
            cpuset: cpuset_root.join(&name),
            hugetlb: hugetlb_root.join(&name),
            v2_root: v2_root.clone(),
            enabled: Vec::new(),
            volume: dir.path("volume"),
            hugepages_before: read(Path::new(HUGEPAGES)),
            dir,
        };
        // The node's pre-allocated hugepages, as a kubelet expects them.
        let before: u64 = pod.hugepages_before.parse().unwrap_or(0);
        write(Path::new(HUGEPAGES), &(before + 96).to_string());
        if let Some(root) = &v2_root {
            let ctl = root.join("cgroup.subtree_control");
            let want: &[&str] = if v2_cpuset {
                &["cpuset", "hugetlb"]
            } else {
                &["hugetlb"]
            };
            for c in want {
                if !read(&ctl).split(' ').any(|x| x == *c) {
                    write(&ctl, &format!("+{c}"));
                    pod.enabled.push(c.to_string());
                }
            }
        }
        std::fs::create_dir(&pod.cpuset).unwrap();
        write(&pod.cpuset.join("cpuset.cpus"), &core.to_string());
        let mems = if v2_cpuset {
            "cpuset.mems.effective"
        } else {
            "cpuset.mems"
        };
        write(
            &pod.cpuset.join("cpuset.mems"),
            &read(&cpuset_root.join(mems)),
        );
        if exclusive && v2_cpuset {
            // What a CPU manager would make on cgroup v2: a partition root.
            let part = pod.cpuset.join("cpuset.cpus.partition");
            write(&part, "root");
            assert_eq!(read(&part), "root", "{}", part.display());
        } else if exclusive {
            write(&pod.cpuset.join("cpuset.cpu_exclusive"), "1");
        }
        if pod.hugetlb != pod.cpuset {
            std::fs::create_dir(&pod.hugetlb).unwrap();
        }
        let limit = (limit_mib << 20).to_string();
        if v2_root.is_some() {
            write(&pod.hugetlb.join("hugetlb.2MB.max"), &limit);
        } else {
            write(&pod.hugetlb.join("hugetlb.2MB.limit_in_bytes"), &limit);
        }
        std::fs::create_dir(&pod.volume).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "hugetlbfs", "-o", "pagesize=2M", "none"])
            .arg(&pod.volume)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mounting hugetlbfs at {}", pod.volume.display());
        Some(pod)
    }

    /// `partition ARGS` started inside the pod's cgroups.
    fn spawn(&self, args: &[&str]) -> Child {
        partition_command_in(&self.membership(), args)
    }

    /// The files a process writes its pid to, to join the pod: one per cgroup.
    fn membership(&self) -> Vec<PathBuf> {
        let file = |d: &Path| {
            if self.v2_root.as_deref().is_some_and(|r| d.starts_with(r)) {
                d.join("cgroup.procs")
            } else {
                d.join("tasks")
            }
        };
        let mut m = vec![file(&self.cpuset)];
        if self.hugetlb != self.cpuset {
            m.push(file(&self.hugetlb));
        }
        m
    }

    /// Whether the pod's cpuset is cgroup v2's.
    fn v2_cpuset(&self) -> bool {
        self.v2_root
            .as_deref()
            .is_some_and(|r| self.cpuset.starts_with(r))
    }

    /// Starts `partition launch --cores from-cgroup --memory MEMORY --memory-from VOLUME
    /// --probe EXTRA...` inside the pod.
    fn launch(&self, memory: &str, extra: &[&str]) -> Child {
        let volume = self.volume.to_str().unwrap();
        let mut args = vec!["launch", "--cores", "from-cgroup"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--memory", memory, "--memory-from", volume, "--probe"]);
        self.spawn(&args)
    }
}

/// `partition ARGS` run by a shell that first moves itself into each of `tasks` (cgroup
/// membership files) and then execs it.
fn partition_command_in(tasks: &[PathBuf], args: &[&str]) -> Child {
    let mut script = String::new();
    for t in tasks {
        script.push_str(&format!("echo $$ > '{}' && ", t.display()));
    }
    script.push_str("exec \"$@\"");
    let bin = partition().get_program().to_owned();
    let mut c = Command::new("sh");
    c.arg("-c").arg(script).arg("sh").arg(bin).args(args);
    for (k, v) in partition().get_envs() {
        if let Some(v) = v {
            c.env(k, v);
        }
    }
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.volume).status();
        let mut cgs = vec![&self.cpuset];
        if self.hugetlb != self.cpuset {
            cgs.push(&self.hugetlb);
        }
        for cg in cgs {
            // Whatever is left in them goes back to the parent first.
            let parent = cg.parent().unwrap();
            for f in ["tasks", "cgroup.procs"] {
                for pid in read(&cg.join(f)).lines() {
                    let _ = std::fs::write(parent.join(f), pid);
                }
            }
            let _ = std::fs::remove_dir(cg);
        }
        if let Some(root) = &self.v2_root {
            for c in &self.enabled {
                let _ = std::fs::write(root.join("cgroup.subtree_control"), format!("-{c}"));
            }
        }
        let _ = std::fs::write(HUGEPAGES, &self.hugepages_before);
        let _ = &self.name;
        let _ = &self.dir;
    }
}

fn api(
    sock: &Path,
    method: &str,
    path: &str,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    partition::sys::api_client::request(sock, method, path, body.as_ref())
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

#[test]
fn a_pod_runs_a_partition_on_its_cores_and_memory_driven_through_the_api() {
    let _serial = serial();
    let before = host_state();
    // The node runs other containers too: a cpuset of someone else's spans the pod's core
    // (with it, cgroup v1 would refuse the pod's cpuset cpu_exclusive, EINVAL), so the pod
    // is as a kubelet makes it: a plain cpuset, its cores proven by the CPU manager's
    // checkpoint.
    let all = partition::config::cores::format(&partition::config::cores::available());
    let Some(_docker) = common::host::ForeignCpuset::new("partition-pod-docker", &all, false)
    else {
        skip("pod::run", "no cpuset hierarchy here");
        return;
    };
    let Some(pod) = Pod::new("run", 1, false, 64) else {
        return;
    };
    let console = pod.dir.path("console");
    let sock = pod.dir.path("api.sock");
    let state = pod.dir.file(
        "cpu_manager_state",
        br#"{"policyName":"static","defaultCpuSet":"0","entries":{"pod":{"vmm":"1"}},"checksum":1}"#,
    );
    let child = pod.launch(
        "32M",
        &[
            "--kubelet-cpu-state",
            state.to_str().unwrap(),
            "--cmdline",
            "probe.hold=1 probe.memtest=1",
            "--console",
            console.to_str().unwrap(),
            "--api-socket",
            sock.to_str().unwrap(),
            "--json",
        ],
    );
    let child = wait_holding(child, &console, "pod launch", LIMIT);
    let pid = child.id();
    // The launcher runs in the pod's cgroup; the volume holds no file (unlinked at once).
    let cg = read(&PathBuf::from(format!("/proc/{pid}/cgroup")));
    assert!(cg.contains(&pod.name), "{cg}");
    assert_eq!(std::fs::read_dir(&pod.volume).unwrap().count(), 0);
    // The API: what runs, on what, from what.
    let (code, p) = api(&sock, "GET", "/partition", None);
    assert_eq!(code, 200, "{p}");
    assert_eq!(p["cores"], json!([1]), "{p}");
    assert_eq!(p["memory"]["backing"], "volume", "{p}");
    assert_eq!(p["memory"]["bytes"], 32u64 << 20, "{p}");
    assert!(
        p["cores_exclusive_by"]
            .as_str()
            .unwrap()
            .contains("kubelet"),
        "{p}"
    );
    assert_eq!(p["pid"], pid, "{p}");
    let mode = std::fs::metadata(&sock).unwrap();
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    assert_eq!(mode.permissions().mode() & 0o777, 0o600);
    assert_eq!(mode.uid(), p["sandbox"]["uid"].as_u64().unwrap() as u32);
    assert_eq!(api(&sock, "GET", "/state", None).1["state"], "running");
    let (_, c) = api(&sock, "GET", "/counters", None);
    assert!(c["vcpus"][0]["exits"]["io_out"].as_u64() > Some(0), "{c}");
    assert_eq!(c["vcpus"][0]["core"], 1, "{c}");
    assert_eq!(api(&sock, "GET", "/idle", None).0, 200);
    // Pause and resume.
    let (code, s) = api(&sock, "PUT", "/state", Some(json!({"state": "paused"})));
    assert_eq!((code, s["state"].as_str()), (200, Some("paused")));
    assert_eq!(api(&sock, "GET", "/state", None).1["state"], "paused");
    let (code, s) = api(&sock, "PUT", "/state", Some(json!({"state": "running"})));
    assert_eq!((code, s["state"].as_str()), (200, Some("running")));
    // Bad requests get 4xx and change nothing.
    assert_eq!(api(&sock, "GET", "/nowhere", None).0, 404);
    assert_eq!(api(&sock, "DELETE", "/state", None).0, 405);
    assert_eq!(
        api(&sock, "PUT", "/state", Some(json!({"state": 3}))).0,
        400
    );
    {
        use std::io::{Read, Write};
        let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
        s.write_all(b"THIS IS NOT HTTP\r\n\r\n").unwrap();
        let mut t = String::new();
        s.read_to_string(&mut t).unwrap();
        assert!(t.starts_with("HTTP/1.1 400"), "{t}");
    }
    assert_eq!(api(&sock, "GET", "/state", None).1["state"], "running");
    // 200 idle connections do not keep a real request out (the confined API thread serves
    // connections side by side; served one at a time, this waited 200 deadlines).
    let idle: Vec<_> = (0..200)
        .map(|_| std::os::unix::net::UnixStream::connect(&sock).unwrap())
        .collect();
    assert_eq!(api(&sock, "GET", "/state", None).1["state"], "running");
    drop(idle);
    // `partition status` asks the API.
    let out = run(
        &["status", "--api-socket", sock.to_str().unwrap(), "--json"],
        LIMIT,
    );
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let st: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(st["state"]["state"], "running", "{st}");
    // A clean stop.
    let (code, _) = api(&sock, "PUT", "/actions", Some(json!({"action": "stop"})));
    assert_eq!(code, 202);
    let out = wait_output(child, LIMIT, "pod launch");
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let r = report(&out.stdout);
    assert_eq!(r["outcome"]["kind"], "stop_requested", "{r}");
    assert_eq!(r["vcpus"][0]["core"], 1, "{r}");
    let text = std::fs::read_to_string(&console).unwrap();
    assert!(text.contains("probe: holding"), "{text}");
    drop(pod);
    let after = host_state();
    assert_eq!(after.hugepages_total, before.hugepages_total);
    assert_eq!(after.mounts, before.mounts);
}

#[test]
fn more_than_the_pods_hugetlb_limit_or_shared_cores_are_refused_before_the_guest_starts() {
    let _serial = serial();
    let Some(pod) = Pod::new("limit", 1, true, 32) else {
        return;
    };
    let out = wait_output(pod.launch("64M", &[]), LIMIT, "over the limit");
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("more than the pod's hugetlb limit leaves"),
        "{}",
        out.stderr
    );
    assert!(
        !out.stdout.contains("probe:"),
        "the guest ran: {}",
        out.stdout
    );
    assert_eq!(std::fs::read_dir(&pod.volume).unwrap().count(), 0);
    // Memory not in the volume's page size.
    let out = wait_output(pod.launch("9M", &[]), LIMIT, "odd size");
    assert_eq!(out.code(), 2, "{}", out.stderr);
    // A directory that is not hugetlbfs.
    let out = wait_output(
        pod.spawn(&[
            "launch",
            "--cores",
            "from-cgroup",
            "--memory",
            "8M",
            "--memory-from",
            "/tmp",
            "--probe",
        ]),
        LIMIT,
        "not hugetlbfs",
    );
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("not a hugetlbfs mount"),
        "{}",
        out.stderr
    );
    // What fits runs, its cores proven by the cgroup's own cpu_exclusive (v1) or partition
    // root (v2).
    let out = wait_output(pod.launch("16M", &[]), LIMIT, "within the limit");
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let proof = if pod.v2_cpuset() {
        "is a root partition"
    } else {
        "cpu_exclusive"
    };
    assert!(
        out.stderr
            .contains("cores from this process's cgroup, exclusive by")
            && out.stderr.contains(proof),
        "{}",
        out.stderr
    );
    drop(pod);

    // Cores the cgroup does not hold exclusively: refused, unless the kubelet's checkpoint
    // says they are assigned to a container and out of its shared pool.
    let Some(pod) = Pod::new("shared", 1, false, 32) else {
        return;
    };
    let out = wait_output(pod.launch("16M", &[]), LIMIT, "shared cores");
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(out.stderr.contains("are not exclusive"), "{}", out.stderr);
    let state = pod.dir.file(
        "cpu_manager_state",
        br#"{"policyName":"static","defaultCpuSet":"0","entries":{"pod":{"vmm":"1"}},"checksum":1}"#,
    );
    let out = wait_output(
        pod.launch(
            "16M",
            &["--kubelet-cpu-state", state.to_str().unwrap(), "--json"],
        ),
        LIMIT,
        "kubelet-assigned cores",
    );
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert_eq!(report(&out.stdout)["memory"]["backing"], "volume");
    assert!(
        out.stderr.contains("kubelet's static CPU manager"),
        "{}",
        out.stderr
    );
}
