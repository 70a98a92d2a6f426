//! The pod path through a real container engine (docs/kubernetes.md): Debian's containerd,
//! with its built-in CRI, and runc, started by this test with a configuration, root, state
//! and socket of its own, driven over gRPC with the requests a kubelet sends for
//! docs/deploy/partition-pod.yaml. No registry: the images are OCI layouts made here (the
//! static `partition` binary with a passwd file; a pause program compiled here) and
//! imported with `ctr`.
//!
//! The pod: `RunPodSandbox` under a `kubepods` cgroup parent; `CreateContainer` with the
//! cpuset the kubelet's CPU manager checkpoint grants (the checkpoint mounted read-only),
//! `/dev/kvm` as a CRI `Device` (what a device plugin's `Allocate` returns), a hugetlbfs
//! volume with a hugetlb limit, the API socket's directory mounted, the capabilities the
//! manifest keeps. The probe guest boots on the container's core with `--cores
//! from-cgroup`; the test drives the API from the host (description, state, counters,
//! pause and resume, stop: exit 0). Refused: `/dev/kvm` as a plain CRI `Mount` (exit 2,
//! naming the device plugin) and cores the checkpoint did not grant (exit 2). Afterwards no
//! container, sandbox, cgroup, mount, hugepage or process of the engine's is left.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::*;
use serde_json::json;
use tonic::transport::{Channel, Endpoint, Uri};

const LIMIT: Duration = Duration::from_secs(60);
const HUGEPAGES: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages";
const PAUSE_IMAGE: &str = "localhost/partition-pause:test";
const VMM_IMAGE: &str = "localhost/partition-vmm:test";
/// What the kubelet's static CPU manager would give the pod's container.
const POD_CORE: usize = 1;
/// CRI's NamespaceMode: POD, CONTAINER, NODE.
const NS_POD: i32 = 0;
const NS_CONTAINER: i32 = 1;
const NS_NODE: i32 = 2;
/// CRI's ContainerState: EXITED.
const CONTAINER_EXITED: i32 = 2;

/// The pause program every sandbox runs as its first process.
const PAUSE_C: &str = r#"#include <signal.h>
#include <stdlib.h>
#include <unistd.h>
static void stop(int s) { (void)s; exit(0); }
int main(void) {
    signal(SIGTERM, stop);
    signal(SIGINT, stop);
    for (;;) pause();
}
"#;

fn sh(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn sha256(path: &Path) -> String {
    sh(Command::new("sha256sum").arg(path), "sha256sum")
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// An OCI image archive (`oci-layout`, `index.json`, blobs) of one uncompressed layer made
/// of `files` (source, path in the image, mode), named `name`, running `entrypoint`.
fn oci_image(
    dir: &Path,
    name: &str,
    files: &[(PathBuf, &str, u32)],
    entrypoint: &[&str],
) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let work = dir.join(format!("image-{}", name.replace(['/', ':'], "-")));
    let rootfs = work.join("rootfs");
    let blobs = work.join("oci/blobs/sha256");
    std::fs::create_dir_all(&rootfs).unwrap();
    std::fs::create_dir_all(&blobs).unwrap();
    for (src, dest, mode) in files {
        let d = rootfs.join(dest.trim_start_matches('/'));
        std::fs::create_dir_all(d.parent().unwrap()).unwrap();
        std::fs::copy(src, &d).unwrap_or_else(|e| panic!("{}: {e}", src.display()));
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(*mode)).unwrap();
    }
    let layer = work.join("layer.tar");
    sh(
        Command::new("tar")
            .args(["--numeric-owner", "--owner=0", "--group=0", "-C"])
            .arg(&rootfs)
            .arg("-cf")
            .arg(&layer)
            .arg("."),
        "tar of the layer",
    );
    let blob = |path: &Path| -> (String, u64) {
        let h = sha256(path);
        let size = std::fs::metadata(path).unwrap().len();
        std::fs::rename(path, blobs.join(&h)).unwrap();
        (format!("sha256:{h}"), size)
    };
    let (layer_digest, layer_size) = blob(&layer);
    let config = work.join("config.json");
    std::fs::write(
        &config,
        serde_json::to_vec(&json!({
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "Entrypoint": entrypoint,
                "Env": ["PATH=/"],
                "WorkingDir": "/",
            },
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        }))
        .unwrap(),
    )
    .unwrap();
    let (config_digest, config_size) = blob(&config);
    let manifest = work.join("manifest.json");
    std::fs::write(
        &manifest,
        serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest,
                "size": config_size,
            },
            "layers": [{
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": layer_digest,
                "size": layer_size,
            }],
        }))
        .unwrap(),
    )
    .unwrap();
    let (manifest_digest, manifest_size) = blob(&manifest);
    let tag = name.rsplit(':').next().unwrap();
    std::fs::write(
        work.join("oci/index.json"),
        serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest,
                "size": manifest_size,
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": tag,
                },
            }],
        }))
        .unwrap(),
    )
    .unwrap();
    std::fs::write(
        work.join("oci/oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    let archive = work.join("image.tar");
    sh(
        Command::new("tar")
            .arg("-C")
            .arg(work.join("oci"))
            .arg("-cf")
            .arg(&archive)
            .arg("."),
        "tar of the image",
    );
    archive
}

/// The cgroup v1 hierarchies' mount points (cpuset, memory, ...) and cgroup v2's: where a
/// pod's cgroups appear.
fn cgroup_roots() -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/mounts")
        .unwrap()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 2 && (f[2] == "cgroup" || f[2] == "cgroup2")).then(|| PathBuf::from(f[1]))
        })
        .collect()
}

/// Every process whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(needle) && pid != std::process::id() {
            out.push((pid, cmd));
        }
    }
    out
}

/// Containerd and what it made, given back on drop (after a failure too): its pods
/// removed, its processes and the shims stopped, mounts under its directories detached,
/// the pod's cgroups removed, the hugepage count and /run/containerd as they were.
struct Engine {
    dir: Scratch,
    containerd: Option<Child>,
    rt: tokio::runtime::Runtime,
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
    sock: PathBuf,
    pod_uid: String,
    cgroups_before: Vec<PathBuf>,
    hugepages_before: String,
    run_containerd_existed: bool,
    volume: PathBuf,
}

impl Engine {
    /// Starts containerd in a scratch directory of its own and connects to its CRI.
    fn start(dir: Scratch) -> Self {
        let s = dir.0.clone();
        let sock = s.join("containerd.sock");
        let config = format!(
            r#"version = 2
root = "{s}/root"
state = "{s}/state"
[grpc]
  address = "{s}/containerd.sock"
[ttrpc]
  address = "{s}/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{s}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  disable_apparmor = true
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "{s}/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{s}/cni/bin"
    conf_dir = "{s}/cni/conf"
"#,
            s = s.display()
        );
        let cfg = dir.file("containerd.toml", config.as_bytes());
        let log = std::fs::File::create(dir.path("containerd.log")).unwrap();
        let run_containerd_existed = Path::new("/run/containerd").exists();
        let containerd = Command::new("containerd")
            .arg("--config")
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting containerd");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let start = Instant::now();
        while !sock.exists() {
            assert!(
                start.elapsed() < LIMIT,
                "containerd never made {}",
                sock.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let path = sock.clone();
        let channel = rt
            .block_on(
                Endpoint::try_from("http://[::]")
                    .unwrap()
                    .connect_with_connector(tower::service_fn(move |_: Uri| {
                        let p = path.clone();
                        async move {
                            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                                tokio::net::UnixStream::connect(p).await?,
                            ))
                        }
                    })),
            )
            .expect("connecting to containerd's CRI");
        let volume = dir.path("hugepages");
        Self {
            containerd: Some(containerd),
            runtime: RuntimeServiceClient::new(channel.clone()),
            images: ImageServiceClient::new(channel),
            rt,
            sock,
            pod_uid: format!("partition-cri-{}", std::process::id()),
            cgroups_before: cgroup_roots()
                .into_iter()
                .map(|r| r.join("kubepods"))
                .filter(|p| p.exists())
                .collect(),
            hugepages_before: std::fs::read_to_string(HUGEPAGES).unwrap_or_default(),
            run_containerd_existed,
            volume,
            dir,
        }
    }

    /// `ctr images import` of an OCI archive into the CRI's namespace.
    fn import(&self, archive: &Path) {
        sh(
            Command::new("ctr")
                .arg("--address")
                .arg(&self.sock)
                .args(["--namespace", "k8s.io", "images", "import"])
                .arg(archive),
            "ctr images import",
        );
    }

    fn sandbox_config(&self) -> PodSandboxConfig {
        let host_ns = NamespaceOption {
            network: NS_NODE,
            pid: NS_CONTAINER,
            ipc: NS_POD,
            ..Default::default()
        };
        PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: "partition".into(),
                uid: self.pod_uid.clone(),
                namespace: "default".into(),
                attempt: 0,
            }),
            // A host-network pod shares the node's UTS namespace: the kubelet sends no
            // hostname (runc refuses one without a private UTS namespace).
            hostname: String::new(),
            log_directory: self.dir.path("logs").display().to_string(),
            linux: Some(LinuxPodSandboxConfig {
                // The kubelet's cgroupfs driver: a Guaranteed pod under kubepods.
                cgroup_parent: format!("/kubepods/pod{}", self.pod_uid),
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(host_ns),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn run_pod(&mut self) -> String {
        let config = self.sandbox_config();
        let r = self
            .rt
            .block_on(self.runtime.run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            }));
        r.unwrap_or_else(|e| self.failed("RunPodSandbox", e))
            .into_inner()
            .pod_sandbox_id
    }

    /// The container docs/deploy/partition-pod.yaml describes, as a kubelet asks the CRI
    /// for it: `cores` its cpuset, `/dev/kvm` as a device (or as a plain mount, as a
    /// hostPath volume becomes), the checkpoint, volume and socket directory mounted.
    fn create(&mut self, pod: &str, name: &str, cores: &str, kvm_as_device: bool) -> String {
        let api = self.dir.path(&format!("api-{name}"));
        std::fs::create_dir_all(&api).unwrap();
        let mount = |host: &Path, container: &str, readonly: bool| Mount {
            container_path: container.into(),
            host_path: host.display().to_string(),
            readonly,
            ..Default::default()
        };
        let mut mounts = vec![
            mount(&self.volume, "/hugepages", false),
            mount(&api, "/run/partition-api", false),
            mount(
                &self.dir.path("cpu_manager_state"),
                "/var/lib/kubelet/cpu_manager_state",
                true,
            ),
        ];
        let mut devices = Vec::new();
        if kvm_as_device {
            devices.push(Device {
                container_path: "/dev/kvm".into(),
                host_path: "/dev/kvm".into(),
                permissions: "rw".into(),
            });
        } else {
            mounts.push(mount(Path::new("/dev/kvm"), "/dev/kvm", false));
        }
        let command = [
            "/partition",
            "launch",
            "--cores",
            "from-cgroup",
            "--kubelet-cpu-state",
            "/var/lib/kubelet/cpu_manager_state",
            "--memory",
            "32M",
            "--memory-from",
            "/hugepages",
            "--probe",
            "--cmdline",
            "probe.hold=1",
            "--console",
            "/run/partition-api/console",
            "--api-socket",
            "/run/partition-api/api.sock",
            "--state-dir",
            "/run/partition-state",
        ];
        let config = ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            image: Some(ImageSpec {
                image: VMM_IMAGE.into(),
                ..Default::default()
            }),
            command: command.iter().map(|s| s.to_string()).collect(),
            log_path: format!("{name}.log"),
            mounts,
            devices,
            linux: Some(LinuxContainerConfig {
                resources: Some(LinuxContainerResources {
                    cpu_period: 100_000,
                    cpu_quota: 100_000,
                    cpu_shares: 1024,
                    memory_limit_in_bytes: 256 << 20,
                    cpuset_cpus: cores.into(),
                    hugepage_limits: vec![HugepageLimit {
                        page_size: "2MB".into(),
                        limit: 64 << 20,
                    }],
                    ..Default::default()
                }),
                security_context: Some(LinuxContainerSecurityContext {
                    capabilities: Some(Capability {
                        add_capabilities: ["SETUID", "SETGID", "CHOWN", "DAC_OVERRIDE"]
                            .iter()
                            .map(|c| c.to_string())
                            .collect(),
                        drop_capabilities: vec!["ALL".into()],
                        ..Default::default()
                    }),
                    namespace_options: Some(NamespaceOption {
                        network: NS_NODE,
                        pid: NS_CONTAINER,
                        ipc: NS_POD,
                        ..Default::default()
                    }),
                    run_as_user: Some(Int64Value { value: 0 }),
                    ..Default::default()
                }),
            }),
            labels: HashMap::new(),
            ..Default::default()
        };
        let sandbox_config = self.sandbox_config();
        let r = self
            .rt
            .block_on(self.runtime.create_container(CreateContainerRequest {
                pod_sandbox_id: pod.into(),
                config: Some(config),
                sandbox_config: Some(sandbox_config),
            }));
        let id = r
            .unwrap_or_else(|e| self.failed("CreateContainer", e))
            .into_inner()
            .container_id;
        let r = self
            .rt
            .block_on(self.runtime.start_container(StartContainerRequest {
                container_id: id.clone(),
            }));
        r.unwrap_or_else(|e| self.failed("StartContainer", e));
        id
    }

    /// Panics with a CRI call's error and the end of containerd's log.
    fn failed(&self, call: &str, e: tonic::Status) -> ! {
        let log = std::fs::read_to_string(self.dir.path("containerd.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        panic!("{call}: {e}\ncontainerd's log ends:\n{}", tail.join("\n"))
    }

    fn status(&mut self, id: &str) -> ContainerStatus {
        self.rt
            .block_on(self.runtime.container_status(ContainerStatusRequest {
                container_id: id.into(),
                verbose: false,
            }))
            .expect("ContainerStatus")
            .into_inner()
            .status
            .unwrap()
    }

    /// The host's pid of container `id`'s first process (the runtime's verbose status).
    fn host_pid(&mut self, id: &str) -> u32 {
        let r = self
            .rt
            .block_on(self.runtime.container_status(ContainerStatusRequest {
                container_id: id.into(),
                verbose: true,
            }))
            .expect("ContainerStatus")
            .into_inner();
        let info: serde_json::Value =
            serde_json::from_str(r.info.get("info").map_or("{}", |s| s.as_str())).unwrap();
        info["pid"].as_u64().expect("the runtime's pid") as u32
    }

    /// Waits for container `id` to exit; its exit code and its log.
    fn wait_exit(&mut self, id: &str, name: &str) -> (i32, String) {
        let start = Instant::now();
        loop {
            let s = self.status(id);
            if s.state == CONTAINER_EXITED {
                return (s.exit_code, self.log(name));
            }
            assert!(
                start.elapsed() < LIMIT,
                "container {name} still runs:\n{}",
                self.log(name)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// What the container wrote to stdout and stderr (CRI's log format: time, stream,
    /// tag, line).
    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path("logs").join(format!("{name}.log")))
            .unwrap_or_default()
    }

    fn remove_container(&mut self, id: &str) {
        self.rt
            .block_on(self.runtime.remove_container(RemoveContainerRequest {
                container_id: id.into(),
            }))
            .expect("RemoveContainer");
    }

    fn remove_pod(&mut self, pod: &str) {
        self.rt
            .block_on(self.runtime.stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: pod.into(),
            }))
            .expect("StopPodSandbox");
        self.rt
            .block_on(self.runtime.remove_pod_sandbox(RemovePodSandboxRequest {
                pod_sandbox_id: pod.into(),
            }))
            .expect("RemovePodSandbox");
    }

    /// How many containers and sandboxes the CRI still lists.
    fn listed(&mut self) -> (usize, usize) {
        let c = self
            .rt
            .block_on(
                self.runtime
                    .list_containers(ListContainersRequest { filter: None }),
            )
            .expect("ListContainers")
            .into_inner()
            .containers
            .len();
        let p = self
            .rt
            .block_on(
                self.runtime
                    .list_pod_sandbox(ListPodSandboxRequest { filter: None }),
            )
            .expect("ListPodSandbox")
            .into_inner()
            .items
            .len();
        (c, p)
    }

    fn image_count(&mut self) -> usize {
        self.rt
            .block_on(self.images.list_images(ListImagesRequest { filter: None }))
            .expect("ListImages")
            .into_inner()
            .images
            .len()
    }

    /// The pod's cgroup directories that exist now, in every hierarchy.
    fn pod_cgroups(&self) -> Vec<PathBuf> {
        cgroup_roots()
            .into_iter()
            .map(|r| r.join("kubepods").join(format!("pod{}", self.pod_uid)))
            .filter(|p| p.exists())
            .collect()
    }

    /// Stops containerd (SIGTERM, then what is left of its shims).
    fn stop(&mut self) {
        if let Some(mut c) = self.containerd.take() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let start = Instant::now();
            while c.try_wait().unwrap().is_none() && start.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Every process of the engine's still alive (containerd, shims, containers' processes
    /// whose command line names our scratch directory).
    fn leftovers(&self) -> Vec<(u32, String)> {
        processes_mentioning(&self.dir.0.display().to_string())
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // After a failure: every pod the engine still has stopped and removed (its
        // containers with it) while containerd runs.
        if self.containerd.is_some() {
            let pods = self
                .rt
                .block_on(
                    self.runtime
                        .list_pod_sandbox(ListPodSandboxRequest { filter: None }),
                )
                .map(|r| r.into_inner().items)
                .unwrap_or_default();
            for pod in pods {
                let _ = self
                    .rt
                    .block_on(self.runtime.stop_pod_sandbox(StopPodSandboxRequest {
                        pod_sandbox_id: pod.id.clone(),
                    }));
                let _ =
                    self.rt
                        .block_on(self.runtime.remove_pod_sandbox(RemovePodSandboxRequest {
                            pod_sandbox_id: pod.id,
                        }));
            }
        }
        self.stop();
        for (pid, _) in self.leftovers() {
            // SAFETY: killing a process of this test's engine.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        // What still runs in the pod's cgroups (the containers' processes name none of
        // our directories on their command lines).
        for dir in self.pod_cgroups() {
            for sub in walk_dirs(&dir) {
                let procs = std::fs::read_to_string(sub.join("cgroup.procs")).unwrap_or_default();
                for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                    // SAFETY: killing a process left in this test's pod.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        }
        let start = Instant::now();
        while self.pod_cgroups().iter().any(|d| {
            walk_dirs(d).iter().any(|s| {
                !std::fs::read_to_string(s.join("cgroup.procs"))
                    .unwrap_or_default()
                    .trim()
                    .is_empty()
            })
        }) && start.elapsed() < Duration::from_secs(5)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        // Mounts under our directories (overlay root filesystems, the sandbox's shm, the
        // volume), deepest first.
        let prefix = self.dir.0.display().to_string();
        let mut mounts: Vec<String> = std::fs::read_to_string("/proc/mounts")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1).map(String::from))
            .filter(|m| m.starts_with(&prefix))
            .collect();
        mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in mounts {
            let _ = Command::new("umount").arg("-l").arg(&m).status();
        }
        // The pod's cgroups, children first, and kubepods where we made it.
        for dir in self.pod_cgroups() {
            let mut all: Vec<PathBuf> = walk_dirs(&dir);
            all.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
            for d in all {
                let _ = std::fs::remove_dir(&d);
            }
        }
        for root in cgroup_roots() {
            let k = root.join("kubepods");
            if k.exists() && !self.cgroups_before.contains(&k) {
                let _ = std::fs::remove_dir(&k);
            }
        }
        if !self.run_containerd_existed {
            let _ = std::fs::remove_dir_all("/run/containerd");
        }
        // The node's pages back as they were: a killed guest's pages are freed a moment
        // after its process is gone, and the pool shrinks only by free pages.
        let start = Instant::now();
        loop {
            let _ = std::fs::write(HUGEPAGES, &self.hugepages_before);
            let now = std::fs::read_to_string(HUGEPAGES).unwrap_or_default();
            if now.trim() == self.hugepages_before.trim()
                || start.elapsed() > Duration::from_secs(10)
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `dir` and every directory below it.
fn walk_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        let d = out[i].clone();
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.push(e.path());
            }
        }
        i += 1;
    }
    out
}

/// What this host lacks to run the test, if anything.
fn missing() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("containerd, cgroups and hugetlbfs mounts need root".into());
    }
    if host_cores() < 2 {
        return Some("the pod's core needs another for the host".into());
    }
    for tool in [
        "containerd",
        "ctr",
        "runc",
        "containerd-shim-runc-v2",
        "gcc",
        "tar",
        "sha256sum",
    ] {
        if find_in_path(tool).is_none() {
            return Some(format!(
                "no {tool} here (scripts/test.sh installs containerd and runc from Debian)"
            ));
        }
    }
    if !Path::new(HUGEPAGES).exists() {
        return Some("no 2 MiB hugepages here".into());
    }
    None
}

#[test]
fn a_partition_runs_in_a_containerd_pod_through_the_cri() {
    const TEST: &str = "cri::a_partition_runs_in_a_containerd_pod_through_the_cri";
    if !kvm_available(TEST) {
        return;
    }
    if let Some(why) = missing() {
        skip(TEST, &why);
        return;
    }
    let before = host_state();
    let dir = Scratch::new("cri");
    // The images: the VMM (our static binary, a passwd file naming the user it becomes)
    // and the pause program.
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_partition"));
    let stripped = dir.path("partition");
    sh(
        Command::new("objcopy")
            .arg("--strip-debug")
            .arg(&bin)
            .arg(&stripped),
        "objcopy --strip-debug",
    );
    let passwd = dir.file(
        "passwd",
        b"root:x:0:0:root:/:/nonexistent\npartition:x:64000:64000:partition:/:/nonexistent\n",
    );
    let group = dir.file("group", b"root:x:0:\npartition:x:64000:\n");
    let pause_c = dir.file("pause.c", PAUSE_C.as_bytes());
    let pause = dir.path("pause");
    sh(
        Command::new("gcc")
            .args(["-static", "-Os", "-o"])
            .arg(&pause)
            .arg(&pause_c),
        "gcc -static pause.c",
    );
    let vmm_image = oci_image(
        &dir.0,
        VMM_IMAGE,
        &[
            (stripped, "/partition", 0o755),
            (passwd, "/etc/passwd", 0o644),
            (group, "/etc/group", 0o644),
        ],
        &["/partition"],
    );
    let pause_image = oci_image(
        &dir.0,
        PAUSE_IMAGE,
        &[(pause, "/pause", 0o755)],
        &["/pause"],
    );

    let mut e = Engine::start(dir);
    e.import(&pause_image);
    e.import(&vmm_image);
    assert_eq!(e.image_count(), 2);
    // The node's hugepages and the pod's HugePages-2Mi volume.
    let pages: u64 = e.hugepages_before.trim().parse().unwrap_or(0);
    std::fs::write(HUGEPAGES, (pages + 32).to_string()).unwrap();
    std::fs::create_dir_all(&e.volume).unwrap();
    sh(
        Command::new("mount")
            .args(["-t", "hugetlbfs", "-o", "pagesize=2M", "none"])
            .arg(&e.volume),
        "mounting the hugetlbfs volume",
    );
    // The CPU manager's checkpoint: the pod's container holds POD_CORE, the rest is shared.
    let shared: Vec<usize> = partition::config::cores::available()
        .into_iter()
        .filter(|&c| c != POD_CORE)
        .collect();
    e.dir.file(
        "cpu_manager_state",
        json!({
            "policyName": "static",
            "defaultCpuSet": partition::config::cores::format(&shared),
            "entries": {e.pod_uid.clone(): {"vmm": POD_CORE.to_string()}},
            "checksum": 1,
        })
        .to_string()
        .as_bytes(),
    );

    let pod = e.run_pod();
    // The partition, /dev/kvm a device.
    let vmm = e.create(&pod, "vmm", &POD_CORE.to_string(), true);
    let api = e.dir.path("api-vmm");
    let console = api.join("console");
    let sock = api.join("api.sock");
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(&console).unwrap_or_default();
        if text.contains("probe: holding") && sock.exists() {
            break;
        }
        let s = e.status(&vmm);
        assert!(
            s.state != CONTAINER_EXITED,
            "the partition's container exited ({}) before holding:\n{}\n{text}",
            s.exit_code,
            e.log("vmm")
        );
        assert!(
            start.elapsed() < LIMIT,
            "the pod's guest never held:\n{}\n{text}",
            e.log("vmm")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let call = |method: &str, path: &str, body: Option<serde_json::Value>| {
        partition::sys::api_client::request(&sock, method, path, body.as_ref())
            .unwrap_or_else(|err| panic!("{method} {path}: {err}"))
    };
    let (code, p) = call("GET", "/partition", None);
    assert_eq!(code, 200, "{p}");
    assert_eq!(p["cores"], json!([POD_CORE]), "{p}");
    assert!(
        p["cores_exclusive_by"]
            .as_str()
            .is_some_and(|b| b.contains("kubelet")),
        "{p}"
    );
    assert_eq!(p["memory"]["backing"], "volume", "{p}");
    // The VMM runs in the pod's cgroup, on the core the checkpoint granted. (The pid it
    // reports is its own namespace's: the runtime says which process it is here.)
    assert_eq!(p["pid"], 1, "{p}");
    let pid = e.host_pid(&vmm);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(
        status.contains(&format!("Cpus_allowed_list:\t{POD_CORE}\n")),
        "{status}"
    );
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert!(cg.contains(&format!("/kubepods/pod{}/", e.pod_uid)), "{cg}");
    // Confined inside the container as on a host: every thread of the VMM runs as a user
    // that is not root, with no capability, seccomp filtering (mode 2) and no_new_privs.
    let threads = partition::sys::sandbox::threads_of(pid);
    let names: Vec<&str> = threads.iter().map(|t| t.name.as_str()).collect();
    assert!(names.contains(&"vcpu0"), "{names:?}");
    for t in &threads {
        assert!(t.uid.iter().all(|u| *u != 0), "{t:?}");
        assert_eq!(t.cap_eff, 0, "{t:?}");
        assert!(t.no_new_privs, "{t:?}");
        assert_eq!(t.seccomp, 2, "{t:?}");
    }
    // The private root needs CAP_SYS_ADMIN, which this container (as a pod's default) does
    // not grant: the VMM's root is then the container's own, and its report says why.
    // (The engine writes the container's log as it comes: give it a moment.)
    let said = "no private root for the VMM: no CAP_SYS_ADMIN here";
    let asked = Instant::now();
    while !e.log("vmm").contains(said) && asked.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = e.log("vmm");
    assert!(log.contains(said), "{log}");
    let root_of = |p: u32| std::fs::read_link(format!("/proc/{p}/ns/mnt")).unwrap();
    assert_ne!(
        root_of(pid),
        root_of(std::process::id()),
        "the VMM sees the host's mounts"
    );
    assert_eq!(call("GET", "/state", None).1["state"], "running");
    let (_, c) = call("GET", "/counters", None);
    assert_eq!(c["vcpus"][0]["core"], POD_CORE, "{c}");
    assert!(c["vcpus"][0]["exits"]["io_out"].as_u64() > Some(0), "{c}");
    let (code, s) = call("PUT", "/state", Some(json!({"state": "paused"})));
    assert_eq!((code, s["state"].as_str()), (200, Some("paused")));
    let (code, s) = call("PUT", "/state", Some(json!({"state": "running"})));
    assert_eq!((code, s["state"].as_str()), (200, Some("running")));
    let (code, _) = call("PUT", "/actions", Some(json!({"action": "stop"})));
    assert_eq!(code, 202);
    let (code, log) = e.wait_exit(&vmm, "vmm");
    assert_eq!(code, 0, "{log}");
    // Nothing of the guest's memory is left in the volume.
    assert_eq!(std::fs::read_dir(&e.volume).unwrap().count(), 0);
    e.remove_container(&vmm);

    // /dev/kvm as a plain mount (a hostPath volume): the runtime's device controller
    // denies it, and the VMM says what grants it.
    let mounted = e.create(&pod, "kvm-mounted", &POD_CORE.to_string(), false);
    let (code, log) = e.wait_exit(&mounted, "kvm-mounted");
    assert_eq!(code, 2, "{log}");
    assert!(
        log.contains("device plugin") && log.contains("devices.kubevirt.io/kvm"),
        "{log}"
    );
    e.remove_container(&mounted);
    // A core the checkpoint gave nobody: refused.
    let other = shared[0];
    let ungranted = e.create(&pod, "ungranted", &other.to_string(), true);
    let (code, log) = e.wait_exit(&ungranted, "ungranted");
    assert_eq!(code, 2, "{log}");
    assert!(log.contains(&format!("core {other}")), "{log}");
    e.remove_container(&ungranted);

    e.remove_pod(&pod);
    assert_eq!(e.listed(), (0, 0));
    e.stop();
    // Afterwards: no process of the engine's, no mount under its directories but the
    // volume (ours to take down), and the pod's cgroups removable (the kubelet removes
    // its pod cgroups; nothing may be left running in them).
    assert_eq!(e.leftovers(), Vec::new());
    let prefix = e.dir.0.display().to_string();
    let mounts: Vec<String> = std::fs::read_to_string("/proc/mounts")
        .unwrap()
        .lines()
        .filter(|l| l.contains(&prefix) && !l.contains(e.volume.to_str().unwrap()))
        .map(String::from)
        .collect();
    assert_eq!(mounts, Vec::<String>::new());
    for d in e.pod_cgroups() {
        for sub in walk_dirs(&d) {
            for f in ["cgroup.procs", "tasks"] {
                let procs = std::fs::read_to_string(sub.join(f)).unwrap_or_default();
                assert!(procs.trim().is_empty(), "{}: {procs}", sub.display());
            }
        }
    }
    sh(Command::new("umount").arg(&e.volume), "umount the volume");
    drop(e);
    let after = host_state();
    assert_eq!(after.hugepages_total, before.hugepages_total);
    assert_eq!(after.mounts, before.mounts);
    for root in cgroup_roots() {
        let k = root.join("kubepods");
        assert!(
            !walk_dirs(&k)
                .iter()
                .any(|d| d.to_string_lossy().contains("partition-cri-")),
            "a pod cgroup is left under {}",
            k.display()
        );
    }
}
