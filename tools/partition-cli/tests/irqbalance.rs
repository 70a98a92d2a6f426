//! A reservation on a host that runs irqbalance (Debian's, started here with a one-second
//! interval): left alone (`--irqbalance ignore`) it puts IRQs back on the reserved core
//! within a few rounds and `status` says so; banned (the default) it keeps off the core for
//! as long as the reservation lasts and gets its old list back at `unreserve`; where its
//! socket cannot be reached, the reserve is refused and nothing changes. docs/operations.md.
//!
//! The binary comes from PARTITION_IRQBALANCE (scripts/test.sh unpacks Debian's package
//! under target/ rather than installing it, which would start the daemon for every other
//! test) or `irqbalance` on PATH.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::host::*;
use common::*;
use partition::host::irqbalance::{Daemon, SOCKET_DIR};

const TEST: &str = "irqbalance::a_reservation_keeps_irqbalance_off_its_core";

fn binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PARTITION_IRQBALANCE") {
        return Some(PathBuf::from(p));
    }
    find_in_path("irqbalance")
}

/// An irqbalance this test runs, its socket directory made as systemd makes it; on drop it
/// is stopped, the directory removed if we made it, and every IRQ affinity written back as
/// it was when it started.
struct Balancer {
    child: Child,
    made_dir: bool,
    affinities: Vec<(String, String)>,
}

impl Balancer {
    fn start(bin: &Path, with_socket_dir: bool) -> Self {
        let made_dir = with_socket_dir && !Path::new(SOCKET_DIR).exists();
        if made_dir {
            std::fs::create_dir(SOCKET_DIR).unwrap();
        }
        let affinities = settings().irq_affinities;
        let child = Command::new(bin)
            .args(["--foreground", "--interval", "1"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
        let b = Self {
            child,
            made_dir,
            affinities,
        };
        // Running, and (with the directory) answering on its socket.
        let d = b.daemon();
        let start = Instant::now();
        while with_socket_dir && d.setup().is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "irqbalance never answered: {:?}",
                d.setup()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        b
    }

    fn daemon(&self) -> Daemon {
        let pid = self.child.id();
        let start = Instant::now();
        loop {
            if let Some(s) = partition::host::ledger::pid_start_time(pid) {
                return Daemon { pid, start: s };
            }
            assert!(start.elapsed() < Duration::from_secs(5));
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if self.made_dir {
            let _ = std::fs::remove_dir_all(SOCKET_DIR);
        }
        for (f, v) in &self.affinities {
            let _ = std::fs::write(f, v);
        }
    }
}

/// IRQs `status` reports back on a reserved core.
fn back(h: &Host) -> Vec<serde_json::Value> {
    h.status()["irqs_back"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[test]
fn a_reservation_keeps_irqbalance_off_its_core() {
    let Some(bin) = binary() else {
        skip(
            TEST,
            "no irqbalance (PARTITION_IRQBALANCE or PATH; scripts/test.sh unpacks Debian's)",
        );
        return;
    };
    let Some(h) = Host::new("irqbalance") else {
        return;
    };
    let balancer = Balancer::start(&bin, true);
    let d = balancer.daemon();
    let before = d.setup().unwrap().banned;

    // Ignored, it puts IRQs back on the reserved core within a few rounds, and status
    // says which (this is what the ban must prevent, shown to happen here).
    let out = h.run(&[
        "reserve",
        "--memory",
        "64M",
        "--cores",
        "1",
        "--irqbalance",
        "ignore",
    ]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert!(
        h.ledger_json().get("irqbalance").is_none(),
        "{}",
        h.ledger()
    );
    let start = Instant::now();
    while back(&h).is_empty() && start.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(250));
    }
    let moved = back(&h);
    assert!(
        !moved.is_empty(),
        "irqbalance moved no IRQ back onto core 1 in 15 s: {:#}",
        h.status()
    );
    let text = h.run(&["status"]);
    assert!(
        text.stdout.contains("may fire on a reserved core again"),
        "{}",
        text.stdout
    );
    println!("NOTE {TEST}: unbanned, irqbalance put back {moved:?}");
    let out = h.run(&["unreserve"]);
    assert_eq!(out.code(), 0, "{}", out.stderr);

    // Banned (the default): the ledger records it, nothing comes back in five rounds,
    // `caps` says so, and unreserve gives irqbalance its old list.
    h.reserve("64M");
    let l = h.ledger_json();
    assert_eq!(l["irqbalance"]["pid"], d.pid, "{l:#}");
    assert_eq!(l["irqbalance"]["banned"], serde_json::json!([1]), "{l:#}");
    assert!(d.setup().unwrap().banned.contains(&1));
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        back(&h),
        Vec::<serde_json::Value>::new(),
        "{:#}",
        h.status()
    );
    let left: Vec<u64> = l["irqs_left"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_u64())
        .collect();
    for (f, v) in settings().irq_affinities {
        let irq: u64 = f
            .split('/')
            .nth(3)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        let cores = partition::config::cores::parse(&v).unwrap_or_default();
        assert!(
            left.contains(&irq) || !cores.contains(&1),
            "{f} = {v} with irqbalance banned"
        );
    }
    let caps = h.run(&["caps", "--json"]);
    assert_eq!(caps.code(), 0, "{}", caps.stderr);
    let caps: serde_json::Value = serde_json::from_str(&caps.stdout).unwrap();
    let f = caps["host"]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["setting"] == "irqbalance")
        .cloned()
        .unwrap();
    assert_eq!(f["verdict"], "ok", "{f:#}");
    assert_eq!(caps["host"]["cores_from"], "reserved", "{caps:#}");
    let out = h.run(&["unreserve"]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let start = Instant::now();
    while d.setup().unwrap().banned != before && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        d.setup().unwrap().banned,
        before,
        "irqbalance's list after unreserve"
    );

    // Its socket out of reach (no /run/irqbalance, so it binds none we can name): refused,
    // exit 2, naming it, and the host as it was.
    if balancer.made_dir {
        drop(balancer);
        let unreachable = Balancer::start(&bin, false);
        let pid = unreachable.daemon().pid;
        let was = settings();
        let out = h.run(&["reserve", "--memory", "64M", "--cores", "1"]);
        assert_eq!(out.code(), 2, "{}", out.stderr);
        assert!(
            out.stderr.contains(&format!(
                "irqbalance (pid {pid}) runs, but its control socket"
            )) && out.stderr.contains("--irqbalance ignore"),
            "{}",
            out.stderr
        );
        // (IRQ affinities left out: that irqbalance moves them meanwhile.)
        let now = settings();
        assert_eq!(
            (
                now.nr_hugepages,
                now.hugetlbfs_mounts,
                now.cpusets,
                now.default_affinity
            ),
            (
                was.nr_hugepages,
                was.hugetlbfs_mounts,
                was.cpusets,
                was.default_affinity
            )
        );
        assert!(h.ledger().is_empty());
    } else {
        println!("NOTE {TEST}: {SOCKET_DIR} existed before, so the unreachable case is not tried");
    }
}
