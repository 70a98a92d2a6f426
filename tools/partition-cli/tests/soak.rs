//! A soak of the whole pool life cycle (issue 33): reserve, launch the probe from the pool
//! (disk writes and reads, the local API asked for its state and counters), end it one of
//! five ways (a clean stop through the API, `release`, SIGKILL of the launcher, of its
//! keeper, or of both, each at a random moment, booting or running), reclaim what a
//! killing left, unreserve. After every cycle the ledger is consistent and nothing is left:
//! hugepages, hugetlbfs mounts, cpusets, IRQ affinities, host-wide core claims, processes,
//! the test's own descriptors. 30 cycles here; 500 in the long tier
//! (`scripts/test.sh --long`).

mod common;

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::host::*;
use common::*;

/// A small, repeatable pseudo-random sequence (xorshift), seeded and printed, so a failing
/// run can be replayed with `PARTITION_SOAK_SEED`.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// How a cycle's partition ends.
#[derive(Clone, Copy, Debug)]
enum Ending {
    ApiStop,
    Release,
    KillLauncher,
    KillKeeper,
    KillBoth,
}

fn own_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Waits until the state directory's ledger lists no live partition (a killed launcher's
/// keeper finishing its scrub); then releases whatever is recorded dead.
fn settle(h: &Host, name: &str) {
    let start = Instant::now();
    loop {
        let s = h.status();
        let parts = s["partitions"].as_array().cloned().unwrap_or_default();
        if parts.iter().all(|p| p["alive"] == false) {
            if parts.iter().any(|p| p["name"] == name) {
                let out = h.run(&["release", name]);
                assert_eq!(out.code(), 0, "release {name}: {}", out.stderr);
            }
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{name} still alive a minute after its ending: {s}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn launch(h: &Host, name: &str, disk: &Path, sock: &Path, console: &Path) -> Child {
    partition()
        .args([
            "launch", "--name", name, "--cores", "1", "--memory", "32M", "--probe",
        ])
        .arg("--disk")
        .arg(format!("path={}", disk.display()))
        .arg("--api-socket")
        .arg(sock)
        .args([
            "--cmdline",
            "probe.blk=write,read probe.hold=1 probe.memtest=0",
            "--console",
        ])
        .arg(console)
        .env("PARTITION_STATE_DIR", &h.dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn kill(pid: u32) {
    // SAFETY: SIGKILL to a process this test started (or its child).
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
}

#[test]
fn cycles_of_reserve_launch_and_release_leave_nothing_behind_whatever_is_killed() {
    let Some(h) = Host::new("soak") else {
        return;
    };
    let long = std::env::var("PARTITION_LONG_TESTS").as_deref() == Ok("1");
    let cycles = if long { 500 } else { 30 };
    let seed = std::env::var("PARTITION_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
                | 1
        });
    println!("soak: {cycles} cycles, PARTITION_SOAK_SEED={seed}");
    let mut rng = Rng(seed);
    let scratch = Scratch::new("soak-files");
    let disk = scratch.file("disk.img", &vec![0u8; 2 << 20]);
    let sock = scratch.path("api.sock");
    let console = scratch.path("console.log");
    let fds_before = own_fds();
    let claim = Path::new("/run/partition-cores/core-1");
    let ours = std::fs::canonicalize(h.dir.parent().unwrap())
        .unwrap()
        .join(h.dir.file_name().unwrap());
    let mut tally = std::collections::BTreeMap::<String, usize>::new();
    for cycle in 0..cycles {
        let name = format!("soak{}", cycle % 7);
        h.reserve("64M");
        let ending = match rng.below(5) {
            0 => Ending::ApiStop,
            1 => Ending::Release,
            2 => Ending::KillLauncher,
            3 => Ending::KillKeeper,
            _ => Ending::KillBoth,
        };
        *tally.entry(format!("{ending:?}")).or_default() += 1;
        let _ = std::fs::remove_file(&console);
        let mut child = launch(&h, &name, &disk, &sock, &console);
        // Killings land at a random moment, booting or running; the others once the
        // guest holds, after its disk I/O, with the API asked first.
        let killing = matches!(
            ending,
            Ending::KillLauncher | Ending::KillKeeper | Ending::KillBoth
        );
        let at_random = killing && rng.below(2) == 0;
        if at_random {
            std::thread::sleep(Duration::from_millis(rng.below(400)));
        } else {
            child = wait_holding(child, &console, &name, LIMIT);
            let log = std::fs::read_to_string(&console).unwrap_or_default();
            assert!(
                log.contains("probe: blk write") && log.contains("flushed_and_read_back=true"),
                "cycle {cycle}: {log}"
            );
            let (code, v) =
                partition::sys::api_client::request(&sock, "GET", "/state", None).unwrap();
            assert_eq!((code, v["state"].as_str()), (200, Some("running")), "{v}");
            let (code, v) =
                partition::sys::api_client::request(&sock, "GET", "/counters", None).unwrap();
            assert_eq!(code, 200, "{v}");
            assert!(v["vcpus"][0]["exits"].is_object(), "{v}");
        }
        match ending {
            Ending::ApiStop => {
                let (code, _) = partition::sys::api_client::request(
                    &sock,
                    "PUT",
                    "/actions",
                    Some(&serde_json::json!({"action": "stop"})),
                )
                .unwrap();
                assert_eq!(code, 202);
                let out = wait_output(child, LIMIT, &name);
                assert_eq!(out.code(), 0, "cycle {cycle}: {}", out.stderr);
            }
            Ending::Release => {
                let out = h.run(&["release", &name]);
                assert_eq!(out.code(), 0, "cycle {cycle}: {}", out.stderr);
                let _ = wait_output(child, LIMIT, &name);
            }
            Ending::KillLauncher => {
                kill(child.id());
                let _ = wait_output(child, LIMIT, &name);
            }
            Ending::KillKeeper | Ending::KillBoth => {
                // The keeper exists once the claim is taken; a launch killed earlier than
                // that has none yet.
                if let Some(k) = keeper_of(child.id()) {
                    kill(k);
                }
                if matches!(ending, Ending::KillBoth) {
                    kill(child.id());
                    let _ = wait_output(child, LIMIT, &name);
                } else {
                    // The guest goes on without its keeper; stop it, as an operator would.
                    let out = h.run(&["release", &name]);
                    assert!(
                        out.code() == 0 || out.code() == 2,
                        "cycle {cycle}: {}",
                        out.stderr
                    );
                    let _ = wait_output(child, LIMIT, &name);
                }
            }
        }
        settle(&h, &name);
        // The ledger is consistent (status reads and checks it) and empty of partitions.
        let s = h.status();
        assert_eq!(
            s["partitions"].as_array().map(Vec::len),
            Some(0),
            "cycle {cycle} ({ending:?}): {s}"
        );
        let out = h.run(&["unreserve"]);
        assert_eq!(out.code(), 0, "cycle {cycle}: unreserve: {}", out.stderr);
        assert!(!h.dir.join("ledger.json").exists());
        assert_eq!(
            settings(),
            h.before,
            "cycle {cycle} ({ending:?}) left settings"
        );
        assert!(
            std::fs::read(claim).map_or(true, |c| c != ours.as_os_str().as_encoded_bytes()),
            "cycle {cycle}: the core's host-wide claim is still ours"
        );
        assert_eq!(
            host_state().our_processes,
            Vec::<u32>::new(),
            "cycle {cycle} ({ending:?}): processes left"
        );
        assert_eq!(own_fds(), fds_before, "cycle {cycle}: descriptors leaked");
    }
    println!("soak: endings {tally:?}");
}
