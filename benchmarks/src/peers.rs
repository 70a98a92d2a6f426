//! The Rust peers: Cloud Hypervisor and Firecracker, each booting the same probe guest
//! ELF through its PVH note, when the benchmark is given their binaries
//! (`--cloud-hypervisor PATH`, `--firecracker PATH`, or found on PATH). The project builds
//! and ships neither: docs/benchmarks.md says how to build them by hand. A peer not given
//! is a row that says so.
//!
//! Both write the guest's serial port to their stdout, and both end when the probe powers
//! off (Cloud Hypervisor on the ACPI sleep control register its FADT names, Firecracker on
//! the i8042 reset), exiting 0.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::Env;
use crate::placement::{Pin, Placement};

/// A peer VMM the benchmark can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// Cloud Hypervisor.
    CloudHypervisor,
    /// Firecracker.
    Firecracker,
}

impl Peer {
    /// Both, in the order rows show them.
    pub const ALL: [Peer; 2] = [Peer::CloudHypervisor, Peer::Firecracker];

    /// Its binary's usual name (and the source name its rows carry).
    pub fn name(self) -> &'static str {
        match self {
            Peer::CloudHypervisor => "cloud-hypervisor",
            Peer::Firecracker => "firecracker",
        }
    }

    /// The peer a row's source names (`cloud-hypervisor-hugepages-prefault`, say: see
    /// [`PeerSetup::from_source`]); `None` for ours and QEMU's sources.
    pub fn from_source(source: &str) -> Option<Peer> {
        PeerSetup::from_source(source).map(|s| s.peer)
    }

    /// The source name of its default configuration (what a user gets who names no
    /// memory option): every section that has the peer must have this row.
    pub fn default_source(self) -> &'static str {
        self.name()
    }

    /// Its binary, as the benchmark was given it.
    pub fn binary(self, env: &Env) -> Option<&Path> {
        match self {
            Peer::CloudHypervisor => env.cloud_hypervisor.as_deref(),
            Peer::Firecracker => env.firecracker.as_deref(),
        }
    }

    /// The option that gives it.
    pub fn option(self) -> &'static str {
        match self {
            Peer::CloudHypervisor => "--cloud-hypervisor",
            Peer::Firecracker => "--firecracker",
        }
    }
}

/// A peer and the memory setup one of its rows runs, as the row's source names it:
/// `<peer>[-hugepages][-prefault]`. The bare name is the peer's default (memory made as the
/// guest first touches it, 4 KiB pages); `-hugepages` backs guest memory with 2 MiB
/// hugepages, `-prefault` makes every page before the guest runs (Cloud Hypervisor's
/// `prefault=on`; Firecracker has no such option).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerSetup {
    /// Which.
    pub peer: Peer,
    /// 2 MiB hugepages.
    pub hugepages: bool,
    /// Every page made up front.
    pub prefault: bool,
}

impl PeerSetup {
    /// The peer's default configuration.
    pub fn default_of(peer: Peer) -> Self {
        PeerSetup {
            peer,
            hugepages: false,
            prefault: false,
        }
    }

    /// Parses a source name; None for ours, QEMU's and names no peer offers
    /// (`firecracker-prefault`).
    pub fn from_source(source: &str) -> Option<Self> {
        Peer::ALL.into_iter().find_map(|peer| {
            let mut rest = source.strip_prefix(peer.name())?;
            let mut take = |suffix: &str| {
                let hit = rest.starts_with(suffix);
                if hit {
                    rest = &rest[suffix.len()..];
                }
                hit
            };
            let hugepages = take("-hugepages");
            let prefault = take("-prefault");
            let offered = !prefault || peer == Peer::CloudHypervisor;
            (rest.is_empty() && offered).then_some(PeerSetup {
                peer,
                hugepages,
                prefault,
            })
        })
    }

    /// Its source name.
    pub fn source(&self) -> String {
        format!(
            "{}{}{}",
            self.peer.name(),
            if self.hugepages { "-hugepages" } else { "" },
            if self.prefault { "-prefault" } else { "" }
        )
    }

    /// Every configuration a section weighing memory setups runs of `peer`: its default
    /// first.
    pub fn all_of(peer: Peer) -> Vec<Self> {
        let prefaults: &[bool] = match peer {
            Peer::CloudHypervisor => &[false, true],
            Peer::Firecracker => &[false],
        };
        let mut out = Vec::new();
        for hugepages in [false, true] {
            for &prefault in prefaults {
                out.push(PeerSetup {
                    peer,
                    hugepages,
                    prefault,
                });
            }
        }
        out
    }
}

/// The peers whose rows a section has without their default row: each must be there
/// (a peer's best alone says nothing of what its users get). Sources not of a peer are
/// ignored.
pub fn missing_defaults<'a>(sources: impl IntoIterator<Item = &'a str>) -> Vec<&'static str> {
    let sources: Vec<&str> = sources.into_iter().collect();
    Peer::ALL
        .into_iter()
        .filter(|p| sources.iter().any(|s| Peer::from_source(s) == Some(*p)))
        .filter(|p| !sources.contains(&p.default_source()))
        .map(|p| p.default_source())
        .collect()
}

/// A peer as the results record it: its binary and what it says its version is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerInfo {
    /// `cloud-hypervisor` or `firecracker`.
    pub name: String,
    /// The binary run, if given.
    pub binary: Option<PathBuf>,
    /// Its `--version` line, or why there are no rows of it.
    pub version: Option<String>,
    /// The commit of the git checkout the binary was built in (found from the binary's
    /// directory up), when it lives in one: what `--version` does not always say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// Why it has no rows, when it has none.
    pub note: Option<String>,
}

/// Each peer's binary and version, or the note that says why it has no rows.
pub fn infos(env: &Env) -> Vec<PeerInfo> {
    Peer::ALL
        .iter()
        .map(|&p| match p.binary(env) {
            Some(bin) => PeerInfo {
                name: p.name().into(),
                binary: Some(bin.to_path_buf()),
                version: version(bin),
                commit: commit(bin),
                note: None,
            },
            None => PeerInfo {
                name: p.name().into(),
                binary: None,
                version: None,
                commit: None,
                note: Some(format!(
                    "{} not given ({} PATH, or on PATH): no rows",
                    p.name(),
                    p.option()
                )),
            },
        })
        .collect()
}

/// The first line `BIN --version` prints.
fn version(bin: &Path) -> Option<String> {
    let out = Command::new(bin).arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .next()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
}

/// The commit checked out where `bin` was built (git looks up from its directory), with
/// `-dirty` when the checkout has changes; None outside a checkout.
fn commit(bin: &Path) -> Option<String> {
    let dir = std::fs::canonicalize(bin).ok()?.parent()?.to_path_buf();
    let (head, dirty) = crate::provenance::checkout(&dir, &[])?;
    Some(if dirty == Some(true) {
        format!("{head}-dirty")
    } else {
        head
    })
}

/// FNV-1a, 64-bit: a name for a configuration file from its contents.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// One boot of the probe by a peer.
pub struct PeerBoot<'a> {
    /// Which, and its memory setup.
    pub setup: PeerSetup,
    /// Where its threads run ([`crate::placement`]); None: wherever the host puts them.
    pub placement: Option<Placement>,
    /// vCPUs.
    pub vcpus: usize,
    /// Memory, MiB.
    pub mb: u64,
    /// The probe guest ELF.
    pub probe: &'a Path,
    /// Its command line.
    pub cmdline: &'a str,
    /// A disk image for a virtio-blk device, read only, and the I/O engine Firecracker
    /// serves it with (`Sync` or `Async`, its io_uring one). Firecracker only: Cloud
    /// Hypervisor's virtio-blk is virtio-pci, which the probe's driver does not speak.
    pub disk: Option<(&'a Path, &'a str)>,
}

impl PeerBoot<'_> {
    /// The command and what must follow its spawn for its placement ([`Pin::apply`]); it
    /// is to be spawned from its placement ([`Placement::from_place`]). Firecracker's
    /// configuration file goes in `dir` (which must exist). None when the peer was not
    /// given.
    pub fn command(&self, env: &Env, dir: &Path) -> Option<(Command, Pin)> {
        let mut c = Command::new(self.setup.peer.binary(env)?);
        let pin = match self.setup.peer {
            Peer::CloudHypervisor => {
                // Without `hugepage_size` Cloud Hypervisor reads the size from a hugetlbfs
                // at /dev/hugepages, which a host need not mount: it is named.
                let memory = format!(
                    "size={}M{}{}",
                    self.mb,
                    if self.setup.prefault {
                        ",prefault=on"
                    } else {
                        ""
                    },
                    if self.setup.hugepages {
                        ",hugepages=on,hugepage_size=2M"
                    } else {
                        ""
                    }
                );
                // Its own option pins its vCPU threads.
                let cpus = match &self.placement {
                    Some(p) => format!(
                        "boot={},affinity={}",
                        self.vcpus,
                        p.cloud_hypervisor_affinity()
                    ),
                    None => format!("boot={}", self.vcpus),
                };
                c.arg("--kernel")
                    .arg(self.probe)
                    .args(["--cmdline", self.cmdline])
                    .args(["--cpus", &cpus])
                    .args(["--memory", &memory])
                    .args(["--serial", "tty", "--console", "off"]);
                Pin::Nothing
            }
            Peer::Firecracker => {
                // One file per configuration: two commands made before either runs (a
                // section's wake and idle boots) must not share one.
                let config = dir.join(format!(
                    "firecracker-{:016x}.json",
                    fnv1a(self.firecracker_config().to_string().as_bytes())
                ));
                let _ = std::fs::write(&config, self.firecracker_config().to_string());
                // Its logger writes to stdout, the serial port's stream: at level Warning
                // a line comes before the guest's first byte, so only errors are logged.
                c.args(["--no-api", "--level", "Error", "--config-file"])
                    .arg(config);
                match &self.placement {
                    Some(p) => Pin::ByName {
                        prefix: "fc_vcpu ",
                        placement: p.clone(),
                    },
                    None => Pin::Nothing,
                }
            }
        };
        Some((c, pin))
    }

    /// How its threads were placed, as its row says it.
    pub fn placement_note(&self) -> String {
        let Some(p) = &self.placement else {
            return "not pinned".into();
        };
        match self.setup.peer {
            Peer::CloudHypervisor => format!("{} (its own --cpus affinity=)", p.describe()),
            Peer::Firecracker => format!(
                "{} (vCPU threads pinned from outside as each appears: Firecracker has no \
                 affinity option and cannot start paused without its API, so the guest's \
                 first instructions may run on core {})",
                p.describe(),
                p.other
            ),
        }
    }

    /// Firecracker's configuration (its `--config-file`).
    pub fn firecracker_config(&self) -> serde_json::Value {
        let mut machine = serde_json::json!({
            "vcpu_count": self.vcpus,
            "mem_size_mib": self.mb,
        });
        if self.setup.hugepages {
            machine["huge_pages"] = "2M".into();
        }
        serde_json::json!({
            "boot-source": {
                "kernel_image_path": self.probe,
                "boot_args": self.cmdline,
            },
            "drives": self.disk.map(|(path, engine)| vec![serde_json::json!({
                "drive_id": "d0",
                "path_on_host": path,
                "is_root_device": false,
                "is_read_only": true,
                "io_engine": engine,
            })]).unwrap_or_default(),
            "machine-config": machine,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch directory of the test's own, gone when the test ends, passing or not.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            let p = std::env::temp_dir().join(format!("peers-{name}-{}", std::process::id()));
            std::fs::create_dir_all(&p).unwrap();
            Scratch(p)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn env(ch: Option<&str>, fc: Option<&str>, work: &Scratch) -> Env {
        Env {
            work: work.0.clone(),
            cloud_hypervisor: ch.map(PathBuf::from),
            firecracker: fc.map(PathBuf::from),
            ..Env::for_tests()
        }
    }

    fn args(c: &Command) -> Vec<String> {
        std::iter::once(c.get_program())
            .chain(c.get_args())
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn a_peers_commit_is_read_from_the_checkout_it_was_built_in() {
        let dir = Scratch::new("commit");
        let repo = dir.0.join("repo");
        std::fs::create_dir_all(repo.join("target/release")).unwrap();
        let bin = repo.join("target/release/vmm");
        std::fs::write(&bin, "x").unwrap();
        // The commit checked out at `at`, if it is in a checkout.
        let head = |at: &std::path::Path| {
            Command::new("git")
                .arg("-C")
                .arg(at)
                .args(["rev-parse", "HEAD"])
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        };
        // Outside any checkout (unless the system's temp dir is itself in one).
        if head(&dir.0).is_none() {
            assert_eq!(commit(&bin), None);
        }
        let git = |args: &[&str]| {
            let ok = Command::new("git")
                .arg("-C")
                .arg(&repo)
                .args(["-c", "user.name=t", "-c", "user.email=t@t"])
                .args(args)
                .output()
                .unwrap()
                .status
                .success();
            assert!(ok, "git {args:?}");
        };
        git(&["init", "-q"]);
        std::fs::write(repo.join("a"), "1").unwrap();
        git(&["add", "a"]);
        git(&["commit", "-q", "-m", "one"]);
        let head = head(&repo).unwrap();
        assert_eq!(commit(&bin).as_deref(), Some(head.as_str()));
        // A change to a tracked file marks it.
        std::fs::write(repo.join("a"), "2").unwrap();
        assert_eq!(commit(&bin), Some(format!("{head}-dirty")));
    }

    #[test]
    fn a_peer_not_given_has_no_command_and_a_note() {
        let dir = Scratch::new("not-given");
        let e = env(None, Some("/opt/fc/firecracker"), &dir);
        let boot = |peer| PeerBoot {
            setup: PeerSetup::default_of(peer),
            placement: None,
            vcpus: 1,
            mb: 256,
            probe: Path::new("/w/probe.elf"),
            cmdline: "probe.memtest=0",
            disk: None,
        };
        assert!(boot(Peer::CloudHypervisor).command(&e, &e.work).is_none());
        assert!(boot(Peer::Firecracker).command(&e, &e.work).is_some());
        let i = infos(&e);
        assert_eq!(i[0].name, "cloud-hypervisor");
        assert_eq!(
            i[0].note.as_deref(),
            Some("cloud-hypervisor not given (--cloud-hypervisor PATH, or on PATH): no rows")
        );
        // A binary that does not run has no version, and still rows (they fail, and say so).
        assert_eq!(
            (i[1].version.as_deref(), i[1].note.as_deref()),
            (None, None)
        );
    }

    #[test]
    fn each_peer_boots_the_probe_in_the_setup_and_place_its_row_names() {
        let scratch = Scratch::new("boots");
        let dir = scratch.0.clone();
        let e = env(
            Some("/opt/ch/cloud-hypervisor"),
            Some("/opt/fc/firecracker"),
            &scratch,
        );
        let two = Placement {
            vcpus: vec![1, 0],
            other: 0,
            join: None,
        };
        let ch = PeerBoot {
            setup: PeerSetup::from_source("cloud-hypervisor-hugepages-prefault").unwrap(),
            placement: Some(two.clone()),
            vcpus: 2,
            mb: 1024,
            probe: Path::new("/w/probe.elf"),
            cmdline: "probe.memtest=0",
            disk: None,
        };
        let (c, pin) = ch.command(&e, &dir).unwrap();
        assert_eq!(
            args(&c).join(" "),
            "/opt/ch/cloud-hypervisor --kernel /w/probe.elf --cmdline probe.memtest=0 \
             --cpus boot=2,affinity=[0@[1],1@[0]] \
             --memory size=1024M,prefault=on,hugepages=on,hugepage_size=2M \
             --serial tty --console off"
        );
        assert!(matches!(pin, Pin::Nothing), "it pins its own vCPUs");
        // Its default: pages made as the guest touches them, 4 KiB.
        let lazy = PeerBoot {
            setup: PeerSetup::default_of(Peer::CloudHypervisor),
            placement: None,
            ..ch
        };
        let a = args(&lazy.command(&e, &dir).unwrap().0).join(" ");
        assert!(
            a.contains("--cpus boot=2 --memory size=1024M --serial"),
            "{a}"
        );
        let fc = PeerBoot {
            setup: PeerSetup::from_source("firecracker-hugepages").unwrap(),
            placement: Some(Placement::one(1, 0)),
            vcpus: 1,
            mb: 256,
            probe: Path::new("/w/probe.elf"),
            cmdline: "probe.memtest=0",
            disk: None,
        };
        let (c, pin) = fc.command(&e, &dir).unwrap();
        let a = args(&c);
        assert!(
            matches!(&pin, Pin::ByName { prefix: "fc_vcpu ", placement } if placement.vcpus == [1]),
            "{pin:?}"
        );
        assert_eq!(
            &a[..5],
            [
                "/opt/fc/firecracker",
                "--no-api",
                "--level",
                "Error",
                "--config-file"
            ]
        );
        let written: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&a[5]).unwrap()).unwrap();
        assert_eq!(written["machine-config"]["huge_pages"], "2M");
        assert_eq!(written["machine-config"]["mem_size_mib"], 256);
        assert_eq!(written["boot-source"]["kernel_image_path"], "/w/probe.elf");
        assert_eq!(written["boot-source"]["boot_args"], "probe.memtest=0");
        // Another command line, made before the first runs, has a file of its own.
        let other = PeerBoot {
            cmdline: "probe.memtest=0 probe.bench=idle",
            placement: None,
            ..fc
        };
        let b = args(&other.command(&e, &dir).unwrap().0);
        assert_ne!(a[5], b[5]);
        let first: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&a[5]).unwrap()).unwrap();
        assert_eq!(first["boot-source"]["boot_args"], "probe.memtest=0");
        assert_eq!(first["drives"], serde_json::json!([]));
        // With a disk: one read-only virtio-blk drive, served by the engine asked for.
        let disk = PeerBoot {
            disk: Some((Path::new("/w/blk.img"), "Async")),
            placement: None,
            ..fc
        };
        let d = args(&disk.command(&e, &dir).unwrap().0);
        let with: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&d[5]).unwrap()).unwrap();
        assert_eq!(
            with["drives"],
            serde_json::json!([{
                "drive_id": "d0",
                "path_on_host": "/w/blk.img",
                "is_root_device": false,
                "is_read_only": true,
                "io_engine": "Async",
            }])
        );
    }

    #[test]
    fn a_rows_source_names_the_peer_and_its_setup() {
        for peer in Peer::ALL {
            let all = PeerSetup::all_of(peer);
            assert_eq!(
                all[0],
                PeerSetup::default_of(peer),
                "the default comes first"
            );
            for s in &all {
                assert_eq!(PeerSetup::from_source(&s.source()), Some(*s));
            }
        }
        assert_eq!(PeerSetup::all_of(Peer::CloudHypervisor).len(), 4);
        assert_eq!(
            PeerSetup::all_of(Peer::Firecracker)
                .iter()
                .map(|s| s.source())
                .collect::<Vec<_>>(),
            ["firecracker", "firecracker-hugepages"]
        );
        // Not a peer's, or not a setup the peer has.
        for bad in [
            "qemu",
            "pool",
            "firecracker-prefault",
            "cloud-hypervisor-prefault-hugepages",
            "cloud-hypervisorx",
        ] {
            assert_eq!(PeerSetup::from_source(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_section_with_a_peer_but_not_its_default_row_is_caught() {
        assert!(missing_defaults(["pool", "qemu"]).is_empty());
        assert!(missing_defaults(["pool", "firecracker", "firecracker-hugepages"]).is_empty());
        assert_eq!(
            missing_defaults(["pool", "firecracker-hugepages", "cloud-hypervisor-prefault"]),
            ["cloud-hypervisor", "firecracker"]
        );
    }

    #[test]
    fn every_committed_section_with_a_peer_has_its_default_row() {
        // The results this repository carries: memsetup's sources, wake's and blk's peer
        // rows. A section of a results file from before peers ran has none and passes.
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("results");
        for file in ["vm.json", "rig.json"] {
            let Ok(text) = std::fs::read_to_string(dir.join(file)) else {
                continue;
            };
            let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
            let s = &doc["sections"];
            let names = |rows: &serde_json::Value, key: &str| -> Vec<String> {
                rows.as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|r| r[key].as_str().map(String::from))
                    .collect()
            };
            let mut blk = names(&s["blk"]["ours"], "name");
            for p in s["blk"]["rust_peers"].as_array().into_iter().flatten() {
                blk.extend(names(&p["rows"], "name"));
            }
            for (section, rows) in [
                ("memsetup", names(&s["memsetup"]["rows"], "source")),
                ("wake", names(&s["wake"]["peers"], "name")),
                ("blk", blk),
            ] {
                let missing = missing_defaults(rows.iter().map(String::as_str));
                assert!(
                    missing.is_empty(),
                    "{file} {section}: no default row of {missing:?}"
                );
            }
        }
    }
}
