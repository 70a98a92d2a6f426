//! `blk`: a 4 KiB read at queue depth 1, from the bare host and through the VMM's virtio-blk
//! path, against QEMU on the same guest and the same file.
//!
//! The file is a 64 MiB image of known content made for the run (on the file system of the
//! scratch directory). Rows, all on that one file:
//! - host `pread` and host io_uring at depth 1: warm (the file read once into the page cache
//!   first), and cold with O_DIRECT (the backing device serves every read);
//! - our probe guest with the exit notify path (`--no-ioeventfd`), with ioeventfd, with
//!   ioeventfd + a polling worker (`poll_us`), and polled with `direct=on` (cold);
//! - the same probe guest under `qemu-system-x86_64 -M microvm` with a virtio-blk-device on
//!   `aio=io_uring`, with an iothread that polls (`poll-max-ns`), and that with
//!   `cache.direct=on` (cold);
//! - the same probe guest under Firecracker, when given (`--firecracker PATH`), its drive
//!   served by its `Sync` engine and by its io_uring one (`Async`); Cloud Hypervisor has no
//!   rows (its virtio-blk is virtio-pci; the probe's driver speaks virtio-mmio only).
//!
//! Every guest row runs the probe's `read` (the whole image, checksum compared with the
//! host's), `lat` (random 4 KiB reads at depth 1, first with the guest polling the used ring,
//! then waiting for the interrupt), `fence` (GET_ID requests that move no data) and `qd32`.
//! Requests at depth 1 are `GAP_US` apart, on the host too, so a request meets a device
//! that has gone quiet (a worker polls across the gap only if its `poll_us` is longer).
//! The vCPU runs on the reserved core and everything else (our queue worker, QEMU's main
//! loop and iothread) on the host core: QEMU is started paused and its vCPU thread pinned
//! before it runs. Rows alternate in an order rotated every round; each row is the median
//! of the per-run medians with the min-max spread.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::doc::blk::{
    BlkHeadline, BlkParams, BlkSection, GuestRow, HostRow, ImageDoc, Metric, PeerBlk, Peers, VsQemu,
};
use crate::head::{Head, Ordering};
use crate::host::{XorShift, make_image};
use crate::peers::{Peer, PeerBoot, PeerSetup};
use crate::placement::{Placement, pin_and_start_qemu};

use crate::stats::{Summary, summary};
use crate::{Env, Launch, Microvm, pretty, timed_run, timed_run_with};

const IMAGE_BYTES: u64 = 64 << 20;
const SAMPLES: usize = 1000;
const GAP_US: u64 = 50;
const POLL_US: u64 = 200;
const BLOCK: usize = 4096;

/// Our VMM's configurations: (name, --disk options beyond path, ioeventfd, cache state).
const OURS: [(&str, &str, bool, &str); 4] = [
    ("exit", "", false, "warm"),
    ("ioeventfd", "", true, "warm"),
    ("ioeventfd+poll", ",poll_us=200", true, "warm"),
    (
        "ioeventfd+poll direct",
        ",poll_us=200,direct=on",
        true,
        "cold",
    ),
];

/// Firecracker's configurations: (name, its `io_engine`, cache state). Its virtio-blk is
/// virtio-mmio, as ours; its I/O is served by its VMM thread on an ioeventfd, with no
/// polling to configure.
const FIRECRACKER: [(&str, &str, &str); 2] = [
    ("firecracker", "Sync", "warm"),
    ("firecracker io_uring", "Async", "warm"),
];

/// Why Cloud Hypervisor has no rows here.
const CLOUD_HYPERVISOR_NOTE: &str = "cloud-hypervisor: no rows: its virtio-blk is virtio-pci, \
                                      and the probe's driver speaks virtio-mmio only";

/// QEMU's configurations: (name, cache state).
const QEMU: [(&str, &str); 3] = [
    ("qemu io_uring", "warm"),
    ("qemu iothread+poll", "warm"),
    ("qemu iothread+poll direct", "cold"),
];

const WARM: &str = "warm: the image is in the host page cache (read once before the rows; \
                    the guest's own full read comes first in every run)";
const COLD: &str = "cold: O_DIRECT, the host page cache is bypassed and the backing device \
                    serves every read";

/// The word hash the probe guest reports for its `read` test.
pub fn probe_hash(data: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for w in data.chunks_exact(8) {
        let w = u64::from_le_bytes(w.try_into().unwrap_or([0; 8]));
        h = (h ^ w).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn spin(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// A BLOCK-sized buffer aligned for O_DIRECT, carved out of a larger Vec.
struct Aligned(Vec<u8>, usize);
impl Aligned {
    fn new() -> Self {
        let v = vec![0u8; 2 * BLOCK];
        let off = v.as_ptr().align_offset(BLOCK);
        Self(v, off)
    }
    fn buf(&mut self) -> &mut [u8] {
        &mut self.0[self.1..self.1 + BLOCK]
    }
}

fn open(path: &Path, direct: bool) -> std::io::Result<File> {
    let mut o = OpenOptions::new();
    o.read(true);
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    o.open(path)
}

/// Random 4 KiB reads at depth 1 with `pread`, `GAP_US` apart; ns per read.
pub fn host_pread(path: &Path, direct: bool, n: usize, gap: Duration) -> std::io::Result<Vec<f64>> {
    let f = open(path, direct)?;
    let blocks = f.metadata()?.len() / BLOCK as u64;
    let mut rng = XorShift(0x1234_5678_9abc_def1);
    let mut a = Aligned::new();
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let off = rng.next_word() % blocks.max(1) * BLOCK as u64;
        spin(gap);
        let t0 = Instant::now();
        let got = f.read_at(a.buf(), off)?;
        out.push(t0.elapsed().as_secs_f64() * 1e9);
        if got != BLOCK {
            return Err(std::io::Error::other(format!("short read {got} at {off}")));
        }
    }
    Ok(out)
}

/// The same through io_uring: one read submitted and waited for at a time.
pub fn host_uring(path: &Path, direct: bool, n: usize, gap: Duration) -> std::io::Result<Vec<f64>> {
    use io_uring::{IoUring, opcode, types};
    use std::os::fd::AsRawFd;
    let f = open(path, direct)?;
    let blocks = f.metadata()?.len() / BLOCK as u64;
    let mut ring = IoUring::new(8)?;
    let mut rng = XorShift(0x1234_5678_9abc_def1);
    let mut a = Aligned::new();
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let off = rng.next_word() % blocks.max(1) * BLOCK as u64;
        let buf = a.buf();
        let e = opcode::Read::new(types::Fd(f.as_raw_fd()), buf.as_mut_ptr(), BLOCK as u32)
            .offset(off)
            .build()
            .user_data(1);
        spin(gap);
        let t0 = Instant::now();
        // SAFETY: the buffer and the file outlive the request, which is waited for below
        // before either is touched again.
        unsafe { ring.submission().push(&e) }
            .map_err(|_| std::io::Error::other("submission queue full"))?;
        ring.submit_and_wait(1)?;
        let res = ring
            .completion()
            .next()
            .map(|c| c.result())
            .unwrap_or(-libc::EIO);
        out.push(t0.elapsed().as_secs_f64() * 1e9);
        if res != BLOCK as i32 {
            return Err(std::io::Error::other(format!(
                "io_uring read {res} at {off}"
            )));
        }
    }
    Ok(out)
}

/// What one probe run reported.
#[derive(Debug, Default, PartialEq)]
pub struct ProbeBlk {
    /// `test/mode` -> (median, p99) ns.
    pub lat: BTreeMap<String, (f64, f64)>,
    /// Depth-32 IOPS.
    pub qd32_iops: Option<f64>,
    /// Whole-image read: (bytes, checksum, MB/s).
    pub read: Option<(u64, u64, f64)>,
    /// The probe said "result ok".
    pub ok: bool,
}

/// Parses a probe guest's console.
pub fn parse_probe(stdout: &str) -> ProbeBlk {
    let mut r = ProbeBlk::default();
    let mut tsc_khz = None;
    let kv = |rest: &str, k: &str| -> Option<String> {
        rest.split_whitespace()
            .find_map(|w| Some(w.strip_prefix(k)?.strip_prefix('=')?.to_string()))
    };
    for l in stdout.lines() {
        let Some(rest) = l.strip_prefix("probe: ") else {
            continue;
        };
        if rest.starts_with("tsc_khz=") {
            tsc_khz = kv(rest, "tsc_khz").and_then(|v| v.parse::<f64>().ok());
        } else if let Some(rest) = rest.strip_prefix("blk test=") {
            let test = rest.split_whitespace().next().unwrap_or("");
            let num = |k: &str| kv(rest, k).and_then(|v| v.parse::<f64>().ok());
            if test == "qd32" {
                r.qd32_iops = num("iops");
            } else if let (Some(mode), Some(m), Some(p)) =
                (kv(rest, "mode"), num("median_ns"), num("p99_ns"))
            {
                r.lat.insert(format!("{test}/{mode}"), (m, p));
            }
        } else if let Some(rest) = rest.strip_prefix("blk read ") {
            let bytes = kv(rest, "bytes").and_then(|v| v.parse::<u64>().ok());
            let sum = kv(rest, "checksum")
                .and_then(|v| u64::from_str_radix(v.trim_start_matches("0x"), 16).ok());
            let cycles = kv(rest, "tsc_cycles").and_then(|v| v.parse::<f64>().ok());
            if let (Some(b), Some(s)) = (bytes, sum) {
                let mbs = match (cycles, tsc_khz) {
                    (Some(c), Some(k)) if c > 0.0 => b as f64 / (c / (k * 1e3)) / 1e6,
                    _ => f64::NAN,
                };
                r.read = Some((b, s, mbs));
            }
        } else if rest.starts_with("result ok") {
            r.ok = true;
        }
    }
    r
}

fn probe_cmdline() -> String {
    format!(
        "probe.memtest=0 probe.blk=read,lat,fence,qd32 probe.blk_n={SAMPLES} probe.blk_gap_us={GAP_US}"
    )
}

fn ours_cmd(env: &Env, image: &Path, opts: &str, ioeventfd: bool) -> Command {
    Launch::new(
        env,
        &env.work.join("blk-state"),
        &env.core.to_string(),
        "64M",
    )
    .env("RUST_LOG", "partition::board::disks=debug")
    .probe()
    .cmdline(&probe_cmdline())
    .disk(image, opts)
    .ioeventfd(ioeventfd)
    .command()
}

fn qemu_cmd(env: &Env, probe: &Path, image: &Path, name: &str, qmp: &Path) -> Command {
    let cmdline = probe_cmdline();
    let mut c = Microvm {
        pin: None,
        smp: 1,
        mb: 64,
        acpi: false,
        prealloc: false,
        probe,
        cmdline: &cmdline,
    }
    .command(env);
    c.args(["-name", "blkbench,debug-threads=on", "-S"])
        .arg("-qmp")
        .arg(format!("unix:{},server=on,wait=off", qmp.display()))
        .args(["-global", "virtio-mmio.force-legacy=false"]);
    let direct = if name.ends_with("direct") {
        ",cache.direct=on"
    } else {
        ""
    };
    c.arg("-drive").arg(format!(
        "id=d0,file={},format=raw,if=none,aio=io_uring{direct}",
        image.display()
    ));
    if name.contains("iothread") {
        c.args([
            "-object",
            &format!("iothread,id=io1,poll-max-ns={}", POLL_US * 1000),
        ])
        .args(["-device", "virtio-blk-device,drive=d0,iothread=io1"]);
    } else {
        c.args(["-device", "virtio-blk-device,drive=d0"]);
    }
    c
}

/// The headline's pairings, where both sides have a median: our polling worker against
/// QEMU's polling iothread (the guest polling the used ring), and our event-driven
/// ioeventfd device against the fastest of Firecracker's rows (neither polls; the guest
/// waits for the interrupt). Cloud Hypervisor has no rows here (`CLOUD_HYPERVISOR_NOTE`).
fn headline(
    (our_poll, qemu_poll): (Option<Summary>, Option<Summary>),
    our_irq: Option<Summary>,
    firecracker: &[(&str, Option<Summary>)],
) -> Vec<BlkHeadline> {
    let pair = |pairing: &str, completion: &str, ours: &str, o: Summary, peer: &str, p: Summary| {
        BlkHeadline {
            pairing: pairing.into(),
            completion: completion.into(),
            ours: ours.into(),
            ours_median_ns: o.median,
            peer: peer.into(),
            peer_median_ns: p.median,
            ours_over_peer: o.median / p.median,
        }
    };
    let mut out = Vec::new();
    if let (Some(o), Some(q)) = (our_poll, qemu_poll) {
        out.push(pair(
            "polling worker against QEMU's polling iothread (poll-max-ns)",
            "lat4k/poll",
            "ioeventfd+poll",
            o,
            "qemu iothread+poll",
            q,
        ));
    }
    let fastest = firecracker
        .iter()
        .filter_map(|(k, s)| Some((*k, (*s)?)))
        .min_by(|a, b| a.1.median.total_cmp(&b.1.median));
    if let (Some(o), Some((k, f))) = (our_irq, fastest) {
        out.push(pair(
            "event-driven device against Firecracker's (neither polls)",
            "lat4k/irq",
            "ioeventfd",
            o,
            k,
            f,
        ));
    }
    out
}

#[derive(Default)]
struct Series {
    values: BTreeMap<String, Vec<f64>>,
    p99: BTreeMap<String, Vec<f64>>,
    failures: Vec<String>,
    readback: Vec<String>,
    command: String,
}

impl Series {
    fn add(&mut self, k: &str, v: f64) {
        self.values.entry(k.into()).or_default().push(v);
    }
    fn summary(&self, k: &str) -> Option<Summary> {
        self.values.get(k).and_then(|v| summary(v))
    }
    fn metric(&self, k: &str, unit: &str) -> Option<Metric> {
        let s = self.summary(k)?;
        Some(Metric {
            median: s.median,
            spread: [s.min, s.max],
            runs: s.n,
            unit: unit.into(),
            p99_median: self.p99.get(k).and_then(|v| summary(v)).map(|p| p.median),
            per_run: self.values.get(k).cloned().unwrap_or_default(),
        })
    }
    fn runs(&self, k: &str) -> usize {
        self.values.get(k).map_or(0, Vec::len)
    }
}

fn record_guest(s: &mut Series, r: std::io::Result<crate::Run>, ok_code: i32, expect: u64) {
    let r = match r {
        Ok(r) => r,
        Err(e) => {
            s.failures.push(e.to_string());
            return;
        }
    };
    let p = parse_probe(&r.stdout);
    let sum_ok = p
        .read
        .is_some_and(|(b, h, _)| b == IMAGE_BYTES && h == expect);
    if r.status.code() != Some(ok_code) || !p.ok || !sum_ok {
        let tail: Vec<&str> = r
            .stdout
            .lines()
            .chain(r.stderr.lines())
            .filter(|l| l.contains("FAILED") || l.contains("error") || l.contains("blk read"))
            .take(4)
            .collect();
        s.failures.push(format!(
            "exit {:?}, result ok {}, checksum ok {}: {}",
            r.status.code(),
            p.ok,
            sum_ok,
            tail.join(" | ")
        ));
        return;
    }
    for (k, (m, p99)) in &p.lat {
        s.add(k, *m);
        s.p99.entry(k.clone()).or_default().push(*p99);
    }
    if let Some(i) = p.qd32_iops {
        s.add("qd32_iops", i);
    }
    if let Some((_, _, mbs)) = p.read {
        s.add("read_mb_s", mbs);
    }
    if s.readback.is_empty() {
        s.readback = r
            .stderr
            .lines()
            .filter(|l| l.contains("answered by the kernel"))
            .map(|l| l.trim().to_string())
            .collect();
    }
}

/// Runs the section.
pub fn run(env: &Env) -> BlkSection {
    let mut section = BlkSection {
        head: Head::start_with_peers(env, &crate::peers::infos(env)),
        params: BlkParams {
            runs: env.runs,
            image_bytes: IMAGE_BYTES,
            samples_per_run: SAMPLES,
            discarded_warmup_samples_guest: SAMPLES / 10,
            gap_between_requests_us: GAP_US,
            worker_poll_us: POLL_US,
            qemu_poll_max_ns: POLL_US * 1000,
            vcpu_core: env.core,
            host_core: env.host_core,
            guest: "probe guest, 1 vCPU, 64 MiB; virtio-blk 1 queue of 128, EVENT_IDX negotiated, no INDIRECT_DESC".into(),
        },
        method: "see benchmarks/src/blk.rs and docs/block.md: rows alternate, rotated per round; \
                 each row is the median of per-run medians (min-max spread over runs)"
            .into(),
        image: None,
        host: None,
        host_failures: None,
        ours: None,
        qemu: None,
        rust_peers: Vec::new(),
        orderings: None,
        ours_vs_qemu_best: None,
        headline: Vec::new(),
    };
    let image = env.work.join("blk.img");
    let expect = match make_image(&image, IMAGE_BYTES) {
        Ok(h) => h,
        Err(e) => {
            section
                .head
                .fail(format!("making {}: {e}", image.display()));
            return section;
        }
    };
    section.image = Some(ImageDoc {
        path_fs: fs_type(&image),
        probe_checksum: format!("{expect:#018x}"),
    });
    let probe = match crate::probe_image(env) {
        Ok(p) => p,
        Err(e) => {
            section.head.fail(format!("writing the probe image: {e}"));
            return section;
        }
    };
    // Warm the page cache for the warm rows.
    let mut warm = Vec::new();
    let _ = File::open(&image).and_then(|mut f| f.read_to_end(&mut warm));
    drop(warm);

    let gap = Duration::from_micros(GAP_US);
    let mut host = Series::default();
    let mut ours: BTreeMap<&str, Series> = OURS.iter().map(|c| (c.0, Series::default())).collect();
    let mut qemu: BTreeMap<&str, Series> = BTreeMap::new();
    if env.qemu.is_some() {
        qemu = QEMU.iter().map(|c| (c.0, Series::default())).collect();
    }
    let firecracker_bin = Peer::Firecracker.binary(env).is_some();
    let mut firecracker: BTreeMap<&str, Series> = BTreeMap::new();
    if firecracker_bin {
        firecracker = FIRECRACKER
            .iter()
            .map(|c| (c.0, Series::default()))
            .collect();
    }
    let mut jobs: Vec<&str> = vec!["host"];
    jobs.extend(OURS.iter().map(|c| c.0));
    jobs.extend(qemu.keys().copied());
    jobs.extend(firecracker.keys().copied());
    let qmp = env.work.join("qmp.sock");
    for round in 0..env.runs {
        let mut order = jobs.clone();
        let n = order.len();
        order.rotate_left(round % n);
        for job in order {
            if job == "host" {
                for (k, r) in [
                    ("pread warm", host_pread(&image, false, SAMPLES, gap)),
                    ("io_uring warm", host_uring(&image, false, SAMPLES, gap)),
                    ("pread direct", host_pread(&image, true, SAMPLES, gap)),
                    ("io_uring direct", host_uring(&image, true, SAMPLES, gap)),
                ] {
                    match r {
                        Ok(v) => {
                            if let Some(s) = summary(&v[SAMPLES / 10..]) {
                                host.add(k, s.median);
                                host.p99.entry(k.into()).or_default().push(s.p99);
                            }
                        }
                        Err(e) => host.failures.push(format!("{k}: {e}")),
                    }
                }
            } else if let Some(&(_, opts, ioeventfd, _)) = OURS.iter().find(|c| c.0 == job) {
                let c = ours_cmd(env, &image, opts, ioeventfd);
                let s = ours.get_mut(job).expect("present");
                s.command = pretty(&c);
                record_guest(s, timed_run(c, Duration::from_secs(120)), 0, expect);
            } else if let Some(&(_, engine, _)) = FIRECRACKER.iter().find(|c| c.0 == job) {
                let cmdline = probe_cmdline();
                let boot = PeerBoot {
                    setup: PeerSetup::default_of(Peer::Firecracker),
                    placement: Some(Placement::one(env.core, env.host_core)),
                    vcpus: 1,
                    mb: 64,
                    probe: &probe,
                    cmdline: &cmdline,
                    disk: Some((&image, engine)),
                };
                let s = firecracker.get_mut(job).expect("present");
                let Some((c, pin)) = boot.command(env, &env.work) else {
                    continue;
                };
                s.command = pretty(&c);
                let r = Placement::one(env.core, env.host_core)
                    .from_place(|| {
                        timed_run_with(c, Duration::from_secs(120), |pid| pin.apply(pid))
                    })
                    .unwrap_or_else(|e| Err(std::io::Error::other(e)));
                // Firecracker ends on the probe's i8042 reset, exiting 0.
                record_guest(s, r, 0, expect);
            } else {
                let _ = std::fs::remove_file(&qmp);
                let c = qemu_cmd(env, &probe, &image, job, &qmp);
                let s = qemu.get_mut(job).expect("present");
                s.command = pretty(&c);
                let (core, host_core) = (env.core, env.host_core);
                let r = timed_run_with(c, Duration::from_secs(120), |pid| {
                    pin_and_start_qemu(pid, &qmp, core, host_core)
                });
                record_guest(s, r, 1, expect);
            }
        }
    }
    let _ = std::fs::remove_file(&qmp);

    let host_row = |k: &str, cold: bool| HostRow {
        name: format!("host {k}"),
        cache: if cold { COLD } else { WARM }.into(),
        lat4k: host.metric(k, "ns"),
    };
    section.host = Some(vec![
        host_row("pread warm", false),
        host_row("io_uring warm", false),
        host_row("pread direct", true),
        host_row("io_uring direct", true),
    ]);
    section.host_failures = Some(host.failures.clone());
    let guest_row = |name: &str, cache: &str, s: &Series| GuestRow {
        name: name.into(),
        cache: if cache == "cold" { COLD } else { WARM }.into(),
        lat4k_guest_polls: s.metric("lat4k/poll", "ns"),
        lat4k_guest_waits_for_irq: s.metric("lat4k/irq", "ns"),
        fence_guest_polls: s.metric("fence/poll", "ns"),
        fence_guest_waits_for_irq: s.metric("fence/irq", "ns"),
        qd32_iops: s.metric("qd32_iops", "IOPS"),
        seq_read_64m: s.metric("read_mb_s", "MB/s"),
        readback: s.readback.clone(),
        command: s.command.clone(),
        failures: s.failures.clone(),
    };
    section.ours = Some(
        OURS.iter()
            .map(|c| guest_row(c.0, c.3, &ours[c.0]))
            .collect(),
    );
    section.qemu = Some(if env.qemu.is_some() {
        Peers::Rows(
            QEMU.iter()
                .map(|c| guest_row(c.0, c.1, &qemu[c.0]))
                .collect(),
        )
    } else {
        Peers::Note(format!("{}: no peer rows", env.qemu_absent()))
    });

    // A peer not given is said once, with the peers of the provenance.
    section.rust_peers = vec![PeerBlk {
        name: Peer::CloudHypervisor.name().into(),
        rows: Peers::Note(CLOUD_HYPERVISOR_NOTE.into()),
    }];
    if firecracker_bin {
        section.rust_peers.push(PeerBlk {
            name: Peer::Firecracker.name().into(),
            rows: Peers::Rows(
                FIRECRACKER
                    .iter()
                    .map(|c| guest_row(c.0, c.2, &firecracker[c.0]))
                    .collect(),
            ),
        });
    }

    // The orderings seed 002 found, and the comparison with QEMU.
    let o = |k: &str, m: &str| ours.get(k).and_then(|s| s.summary(m));
    // The best warm row for the given completion styles (both: the best a guest can get).
    let best = |set: &BTreeMap<&str, Series>, metrics: &[&str]| {
        set.iter()
            .filter(|(k, _)| !k.ends_with("direct"))
            .flat_map(|(k, s)| {
                metrics
                    .iter()
                    .filter_map(move |m| s.summary(m).map(|x| (format!("{k} ({m})"), x)))
            })
            .min_by(|a, b| a.1.median.total_cmp(&b.1.median))
    };
    let ordering = Ordering::check;
    let mut orderings = vec![
        ordering(
            "ioeventfd beats the exit path (4 KiB depth 1, guest polls the used ring)",
            o("ioeventfd", "lat4k/poll"),
            o("exit", "lat4k/poll"),
        ),
        ordering(
            "polling beats ioeventfd alone (4 KiB depth 1, guest polls the used ring)",
            o("ioeventfd+poll", "lat4k/poll"),
            o("ioeventfd", "lat4k/poll"),
        ),
    ];
    let mut vs_qemu = Vec::new();
    for m in [
        &["lat4k/poll", "lat4k/irq"][..],
        &["lat4k/poll"][..],
        &["lat4k/irq"][..],
    ] {
        if let (Some((on, os)), Some((qn, qs))) = (best(&ours, m), best(&qemu, m)) {
            let completion = if m.len() == 2 {
                "either (the best a guest can get)"
            } else if m[0].ends_with("poll") {
                "guest polls the used ring"
            } else {
                "guest waits for the interrupt"
            };
            vs_qemu.push(VsQemu {
                completion: completion.into(),
                cache: "warm".into(),
                ours_best: on,
                ours_median_ns: os.median,
                ours_spread_ns: [os.min, os.max],
                qemu_best: qn,
                qemu_median_ns: qs.median,
                qemu_spread_ns: [qs.min, qs.max],
                ours_over_qemu: os.median / qs.median,
                ours_no_worse: os.median <= qs.median,
            });
        }
    }
    orderings.push(ordering(
        "polled O_DIRECT: ours vs QEMU's iothread+poll with cache.direct=on (cold)",
        o("ioeventfd+poll direct", "lat4k/poll"),
        qemu.get("qemu iothread+poll direct")
            .and_then(|s| s.summary("lat4k/poll")),
    ));
    section.orderings = Some(orderings);
    section.ours_vs_qemu_best = Some(vs_qemu);
    let fc_rows: Vec<(&str, Option<Summary>)> = firecracker
        .iter()
        .map(|(k, s)| (*k, s.summary("lat4k/irq")))
        .collect();
    section.headline = headline(
        (
            o("ioeventfd+poll", "lat4k/poll"),
            qemu.get("qemu iothread+poll")
                .and_then(|s| s.summary("lat4k/poll")),
        ),
        o("ioeventfd", "lat4k/irq"),
        &fc_rows,
    );

    let complete = |s: &Series| s.failures.is_empty() && s.runs("lat4k/poll") == env.runs;
    let all = host.failures.is_empty()
        && host.runs("pread warm") == env.runs
        && ours.values().all(complete)
        && env.qemu.is_some()
        && qemu.values().all(complete);
    let _ = std::fs::remove_file(&image);
    section.head.finish(all, || {
        let mut why: Vec<String> = host.failures.clone();
        for (k, s) in ours.iter().chain(qemu.iter()) {
            if !complete(s) {
                why.push(format!(
                    "{k}: {} of {} runs; {:?}",
                    s.runs("lat4k/poll"),
                    env.runs,
                    s.failures
                ));
            }
        }
        if env.qemu.is_none() {
            why.push("qemu-system-x86_64 not installed: the peer rows are required".into());
        }
        why.join("; ")
    });
    section
}

fn fs_type(p: &Path) -> Option<String> {
    Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(p)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_headline_pairs_like_with_like() {
        let s = |m: f64| summary(&[m]);
        let h = headline(
            (s(3600.0), s(4800.0)),
            s(30000.0),
            &[
                ("firecracker", s(34600.0)),
                ("firecracker io_uring", s(39000.0)),
            ],
        );
        assert_eq!(h.len(), 2);
        assert_eq!(
            (h[0].ours.as_str(), h[0].peer.as_str()),
            ("ioeventfd+poll", "qemu iothread+poll")
        );
        assert!((h[0].ours_over_peer - 0.75).abs() < 1e-9);
        // Our event-driven device against the fastest of Firecracker's rows.
        assert_eq!(
            (h[1].ours.as_str(), h[1].peer.as_str()),
            ("ioeventfd", "firecracker")
        );
        assert_eq!(h[1].completion, "lat4k/irq");
        // A side with no median has no pairing.
        assert_eq!(headline((s(1.0), None), s(1.0), &[]).len(), 0);
    }

    #[test]
    fn parses_probe_blk_lines() {
        let out = "probe: tsc_khz=2000000 source=cpuid\n\
                   probe: blk read bytes=67108864 checksum=0x1f6eb51930d313b0 tsc_cycles=100000000\n\
                   probe: blk test=lat4k mode=poll n=500 median_ns=2674 p99_ns=3045 min_ns=1 max_ns=2\n\
                   probe: blk test=fence mode=irq n=500 median_ns=9 p99_ns=10 min_ns=1 max_ns=2\n\
                   probe: blk test=qd32 n=2000 ns=3397510 iops=588666 mb_per_s=2411\n\
                   probe: result ok status=0\n";
        let p = parse_probe(out);
        assert!(p.ok);
        assert_eq!(p.lat["lat4k/poll"], (2674.0, 3045.0));
        assert_eq!(p.lat["fence/irq"], (9.0, 10.0));
        assert_eq!(p.qd32_iops, Some(588666.0));
        let (b, h, mbs) = p.read.unwrap();
        assert_eq!((b, h), (67108864, 0x1f6e_b519_30d3_13b0));
        // 64 MiB in 50 ms.
        assert!((mbs - 1342.177).abs() < 0.01, "{mbs}");
        let bad = parse_probe("probe: blk test=lat4k mode=poll median_ns=x p99_ns=1\n");
        assert!(bad.lat.is_empty() && !bad.ok && bad.read.is_none());
    }

    #[test]
    fn image_checksum_matches_the_probe_hash() {
        let dir = vmm_sys_util::tempdir::TempDir::new_with_prefix(
            std::env::temp_dir().join("blk-bench-test-"),
        )
        .unwrap();
        let p = dir.as_path().join("img");
        let h = make_image(&p, 1 << 20).unwrap();
        let data = std::fs::read(&p).unwrap();
        assert_eq!(data.len(), 1 << 20);
        assert_eq!(probe_hash(&data), h);
        assert_ne!(probe_hash(&data[8..]), h);
        let v = host_pread(&p, false, 20, Duration::ZERO).unwrap();
        assert_eq!(v.len(), 20);
        let u = host_uring(&p, false, 20, Duration::ZERO).unwrap();
        assert!(u.iter().all(|x| *x > 0.0));
    }
}
