//! A virtio-blk queue worker against a driver played by the test: real io_uring, a real
//! file, guest memory in this process. Every request type, read-only disks, back-pressure,
//! and hostile chains (property test): the worker answers or asks for a reset, never
//! panics, and keeps serving valid requests afterwards.

use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use devices::virtio::VirtioInterrupt;
use devices::virtio::block::disk::Disk;
use devices::virtio::block::request::{Limits, S_IOERR, S_OK, S_UNSUPP};
use devices::virtio::block::worker::{Shared, Worker, WorkerConfig};
use devices::virtio::queue::QueueSetup;
use proptest::prelude::*;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

const MEM: usize = 4 << 20;
const DESC: u64 = 0x1000;
const AVAIL: u64 = 0x3000;
const USED: u64 = 0x4000;
const HDR: u64 = 0x10000;
const DATA: u64 = 0x20000;
const STATUS: u64 = 0x18000;
const QSIZE: u16 = 16;
const DISK_BYTES: u64 = 1 << 20;

struct Count(Arc<AtomicU32>);
impl devices::Interrupt for Count {
    fn trigger(&self) -> std::io::Result<()> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

struct Harness {
    mem: GuestMemoryMmap,
    bell: Arc<EventFd>,
    stop: Arc<EventFd>,
    shared: Arc<Shared>,
    irqs: Arc<AtomicU32>,
    thread: Option<std::thread::JoinHandle<()>>,
    file: std::path::PathBuf,
    avail: u16,
    used_seen: u16,
}

fn disk_file(name: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("blkw-{name}-{}", std::process::id()));
    let content: Vec<u8> = (0..DISK_BYTES).map(|i| (i % 251) as u8).collect();
    std::fs::write(&p, content).unwrap();
    p
}

impl Harness {
    fn new(name: &str, read_only: bool, poll: Duration, indirect: bool, event_idx: bool) -> Self {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM)]).unwrap();
        let file = disk_file(name);
        let disk = Arc::new(Disk::open(&file, read_only, false, "test-disk").unwrap());
        let q = QueueSetup {
            size: QSIZE,
            desc_table: DESC,
            avail_ring: AVAIL,
            used_ring: USED,
            ready: true,
            ..QueueSetup::new(QSIZE)
        }
        .start(&mem, event_idx, indirect)
        .unwrap();
        let lim = Limits {
            capacity: disk.sectors,
            read_only,
            seg_max: 8,
            max_segments: 4,
            max_segment_sectors: 1 << 20,
        };
        let bell = Arc::new(EventFd::new(libc::EFD_NONBLOCK).unwrap());
        let stop = Arc::new(EventFd::new(libc::EFD_NONBLOCK).unwrap());
        let irqs = Arc::new(AtomicU32::new(0));
        let interrupt = Arc::new(VirtioInterrupt::new(Box::new(Count(irqs.clone()))));
        let shared = Arc::new(Shared::default());
        let w = Worker::new(
            q,
            mem.clone(),
            disk,
            lim,
            bell.clone(),
            stop.clone(),
            interrupt,
            shared.clone(),
            WorkerConfig {
                poll,
                core: None,
                sqpoll: false,
            },
            devices::virtio::block::worker::ring(QSIZE, false).unwrap(),
        );
        let thread = Some(std::thread::spawn(move || {
            w.run();
        }));
        Self {
            mem,
            bell,
            stop,
            shared,
            irqs,
            thread,
            file,
            avail: 0,
            used_seen: 0,
        }
    }

    fn desc(&self, table: u64, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let at = GuestAddress(table + 16 * i as u64);
        self.mem.write_obj(addr, at).unwrap();
        self.mem.write_obj(len, GuestAddress(at.0 + 8)).unwrap();
        self.mem.write_obj(flags, GuestAddress(at.0 + 12)).unwrap();
        self.mem.write_obj(next, GuestAddress(at.0 + 14)).unwrap();
    }

    fn header(&self, kind: u32, sector: u64) {
        self.mem.write_obj(kind, GuestAddress(HDR)).unwrap();
        self.mem.write_obj(0u32, GuestAddress(HDR + 4)).unwrap();
        self.mem.write_obj(sector, GuestAddress(HDR + 8)).unwrap();
    }

    /// Publishes `head` and rings the doorbell.
    fn kick(&mut self, head: u16) {
        let slot = (self.avail % QSIZE) as u64;
        self.mem
            .write_obj(head, GuestAddress(AVAIL + 4 + 2 * slot))
            .unwrap();
        std::sync::atomic::fence(Ordering::Release);
        self.avail = self.avail.wrapping_add(1);
        self.mem
            .write_obj(self.avail, GuestAddress(AVAIL + 2))
            .unwrap();
        self.bell.write(1).unwrap();
    }

    /// Waits until the used index moves or the worker asks for a reset.
    fn wait(&mut self) -> Option<(u32, u32)> {
        let start = Instant::now();
        loop {
            let idx: u16 = self.mem.read_obj(GuestAddress(USED + 2)).unwrap();
            if idx != self.used_seen {
                let slot = (self.used_seen % QSIZE) as u64;
                self.used_seen = self.used_seen.wrapping_add(1);
                let id: u32 = self
                    .mem
                    .read_obj(GuestAddress(USED + 4 + 8 * slot))
                    .unwrap();
                let len: u32 = self
                    .mem
                    .read_obj(GuestAddress(USED + 8 + 8 * slot))
                    .unwrap();
                return Some((id, len));
            }
            if self.shared.needs_reset.load(Ordering::Acquire) {
                return None;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the worker did not answer"
            );
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    fn status(&self) -> u8 {
        self.mem.read_obj(GuestAddress(STATUS)).unwrap()
    }

    /// A plain three-descriptor request at head 0.
    fn request(&mut self, kind: u32, sector: u64, len: u32, device_writes: bool) -> (u8, u32) {
        self.header(kind, sector);
        self.mem.write_obj(0xeeu8, GuestAddress(STATUS)).unwrap();
        self.desc(DESC, 0, HDR, 16, 1, 1);
        self.desc(DESC, 1, DATA, len, 1 | if device_writes { 2 } else { 0 }, 2);
        self.desc(DESC, 2, STATUS, 1, 2, 0);
        self.kick(0);
        let (id, used) = self
            .wait()
            .expect("a valid request made the worker ask for a reset");
        assert_eq!(id, 0);
        (self.status(), used)
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.stop.write(1).unwrap();
        if let Some(t) = self.thread.take() {
            t.join().expect("the worker panicked");
        }
        let _ = std::fs::remove_file(&self.file);
    }
}

#[test]
fn every_request_type() {
    let mut h = Harness::new("types", false, Duration::ZERO, false, false);
    // Read: the file's bytes land in guest memory.
    let (st, used) = h.request(0, 2, 1024, true);
    assert_eq!((st, used), (S_OK, 1025));
    let mut got = vec![0u8; 1024];
    h.mem.read_slice(&mut got, GuestAddress(DATA)).unwrap();
    let want: Vec<u8> = (1024..2048u64).map(|i| (i % 251) as u8).collect();
    assert_eq!(got, want);
    // Write: guest bytes land in the file.
    h.mem.write_slice(&[0x5a; 512], GuestAddress(DATA)).unwrap();
    assert_eq!(h.request(1, 10, 512, false).0, S_OK);
    let f = std::fs::File::open(&h.file).unwrap();
    let mut b = [0u8; 512];
    f.read_exact_at(&mut b, 10 * 512).unwrap();
    assert_eq!(b, [0x5a; 512]);
    // Flush, GET_ID.
    assert_eq!(h.request(4, 0, 0, false).0, S_OK);
    let (st, used) = h.request(8, 0, 20, true);
    assert_eq!((st, used), (S_OK, 21));
    let mut id = [0u8; 9];
    h.mem.read_slice(&mut id, GuestAddress(DATA)).unwrap();
    assert_eq!(&id, b"test-disk");
    // Write zeroes and discard: the ranges read back as zeros.
    for (kind, sector) in [(13u32, 100u64), (11, 200)] {
        h.mem.write_obj(sector, GuestAddress(DATA)).unwrap();
        h.mem.write_obj(8u32, GuestAddress(DATA + 8)).unwrap();
        h.mem.write_obj(0u32, GuestAddress(DATA + 12)).unwrap();
        assert_eq!(h.request(kind, 0, 16, false).0, S_OK, "type {kind}");
        let mut b = [0xffu8; 4096];
        f.read_exact_at(&mut b, sector * 512).unwrap();
        assert_eq!(b, [0u8; 4096], "type {kind}");
    }
    // Unknown type, past the end.
    assert_eq!(h.request(77, 0, 512, true).0, S_UNSUPP);
    assert_eq!(h.request(0, DISK_BYTES / 512, 512, true).0, S_IOERR);
    assert!(h.irqs.load(Ordering::SeqCst) > 0);
    assert!(!h.shared.needs_reset.load(Ordering::SeqCst));
}

/// A driver that runs its avail index far ahead of the ring (issue 12: the worker once spun
/// on it, 131,717 error lines and interrupts in 0.41 s) is told once, with one config
/// interrupt, and the worker then leaves the rings alone until a reset, however often the
/// doorbell rings. Counted, not timed.
#[test]
fn a_driver_that_runs_its_avail_index_ahead_is_told_once() {
    for poll in [Duration::ZERO, Duration::from_micros(50)] {
        let mut h = Harness::new("avail-jump", false, poll, false, false);
        assert_eq!(h.request(0, 0, 512, true).0, S_OK);
        // The request's own interrupt comes after its used entry, which is all `request`
        // waits for: count from after it (on a busy host it once landed after `before`).
        let start = Instant::now();
        while h.irqs.load(Ordering::SeqCst) == 0 {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{poll:?}: no interrupt for the first request"
            );
            std::thread::sleep(Duration::from_micros(50));
        }
        let before = h.irqs.load(Ordering::SeqCst);
        h.avail = h.avail.wrapping_add(1000);
        h.mem.write_obj(h.avail, GuestAddress(AVAIL + 2)).unwrap();
        h.bell.write(1).unwrap();
        assert_eq!(h.wait(), None, "{poll:?}: the worker took the jump");
        for _ in 0..200 {
            h.bell.write(1).unwrap();
            std::thread::sleep(Duration::from_micros(200));
        }
        let used: u16 = h.mem.read_obj(GuestAddress(USED + 2)).unwrap();
        assert_eq!(used, 1, "{poll:?}: requests were taken after the violation");
        assert_eq!(
            h.irqs.load(Ordering::SeqCst) - before,
            1,
            "{poll:?}: one config interrupt for one violation"
        );
    }
}

#[test]
fn read_only_disks_refuse_writes() {
    let mut h = Harness::new("ro", true, Duration::ZERO, false, false);
    let before = std::fs::read(&h.file).unwrap();
    h.mem.write_slice(&[0x77; 512], GuestAddress(DATA)).unwrap();
    assert_eq!(h.request(1, 0, 512, false).0, S_IOERR);
    assert_eq!(h.request(13, 0, 16, false).0, S_IOERR);
    assert_eq!(h.request(0, 0, 512, true).0, S_OK);
    assert_eq!(std::fs::read(&h.file).unwrap(), before);
}

#[test]
fn many_in_flight_with_polling_and_event_idx() {
    let mut h = Harness::new("many", false, Duration::from_micros(200), true, true);
    // Eight reads at once, each through its own indirect table.
    for r in 0..8u16 {
        let table = 0x8000 + 0x100 * r as u64;
        let hdr = HDR + 0x20 * r as u64;
        h.mem.write_obj(0u32, GuestAddress(hdr)).unwrap();
        h.mem
            .write_obj(r as u64 * 8, GuestAddress(hdr + 8))
            .unwrap();
        h.desc(table, 0, hdr, 16, 1, 1);
        h.desc(table, 1, DATA + 0x1000 * r as u64, 4096, 3, 2);
        h.desc(table, 2, STATUS + r as u64, 1, 2, 0);
        h.desc(DESC, r, table, 48, 4, 0);
    }
    // used_event far away: no interrupts wanted until the end.
    h.mem
        .write_obj(7u16, GuestAddress(AVAIL + 4 + 2 * QSIZE as u64))
        .unwrap();
    for r in 0..8u16 {
        h.kick(r);
    }
    let mut seen = Vec::new();
    for _ in 0..8 {
        seen.push(h.wait().expect("answered").0);
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..8).collect::<Vec<u32>>());
    for r in 0..8u64 {
        let st: u8 = h.mem.read_obj(GuestAddress(STATUS + r)).unwrap();
        assert_eq!(st, S_OK);
        let first: u8 = h.mem.read_obj(GuestAddress(DATA + 0x1000 * r)).unwrap();
        assert_eq!(first as u64, (r * 4096) % 251);
    }
}

#[derive(Clone, Debug)]
struct RawChain {
    head: u16,
    descs: Vec<(u8, u32, u16, u16)>, // (address class, len, flags, next)
    kind: u32,
    sector: u64,
}

fn addr_of(class: u8) -> u64 {
    match class % 6 {
        0 => HDR,
        1 => DATA,
        2 => STATUS,
        3 => MEM as u64 - 8, // runs off the end
        4 => u64::MAX - 100, // wraps
        _ => 0x3ff_0000,     // inside, arbitrary
    }
}

fn chain() -> impl Strategy<Value = RawChain> {
    (
        0u16..20,
        prop::collection::vec(
            (
                any::<u8>(),
                prop_oneof![Just(16u32), Just(1), Just(512), Just(4096), any::<u32>()],
                0u16..8,
                0u16..20,
            ),
            1..6,
        ),
        prop_oneof![
            Just(0u32),
            Just(1),
            Just(4),
            Just(8),
            Just(11),
            Just(13),
            any::<u32>()
        ],
        prop_oneof![Just(0u64), Just(2040), Just(u64::MAX / 512), any::<u64>()],
    )
        .prop_map(|(head, descs, kind, sector)| RawChain {
            head,
            descs,
            kind,
            sector,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, .. ProptestConfig::default() })]
    #[test]
    fn hostile_chains_are_answered_or_reset_and_the_worker_lives_on(c in chain()) {
        let mut h = Harness::new("hostile", false, Duration::ZERO, true, false);
        h.header(c.kind, c.sector);
        for (i, (class, len, flags, next)) in c.descs.iter().enumerate() {
            h.desc(DESC, i as u16, addr_of(*class), *len, *flags, *next);
        }
        h.mem.write_obj(0xeeu8, GuestAddress(STATUS)).unwrap();
        h.kick(c.head);
        match h.wait() {
            // Answered: the head we gave, a used length that fits what was offered.
            Some((id, _len)) => {
                prop_assert_eq!(id, c.head as u32);
                let st = h.status();
                prop_assert!(st == 0xee || st <= S_UNSUPP, "status {}", st);
                // The worker still serves a good request.
                let (st, used) = h.request(0, 0, 512, true);
                prop_assert_eq!((st, used), (S_OK, 513));
            }
            // A structural violation: the device wants a reset, and the worker is still
            // alive to be stopped (Drop joins it and fails the test if it panicked).
            None => prop_assert!(h.shared.needs_reset.load(Ordering::SeqCst)),
        }
    }
}
