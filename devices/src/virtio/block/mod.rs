//! virtio-blk: config space and features, one io_uring worker per queue.
//!
//! Requests: IN, OUT, FLUSH, GET_ID, DISCARD, WRITE_ZEROES; read-only disks; several
//! queues (MQ); EVENT_IDX and INDIRECT_DESC. Buffers go straight from guest memory to
//! io_uring (no bounce buffer); with `direct` an O_DIRECT fd serves requests aligned as the
//! file asks (probed with statx), the buffered fd the rest.

pub mod disk;
pub mod request;
pub mod worker;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;
use std::time::Duration;

use vmm_sys_util::eventfd::EventFd;

use self::disk::{Disk, DiskError};
use self::request::Limits;
use self::worker::{Shared, Worker, WorkerConfig};
use super::queue::MAX_QUEUE_SIZE;
use super::{
    Activation, DeviceError, F_EVENT_IDX, F_INDIRECT_DESC, F_VERSION_1, QueueCounters, TYPE_BLOCK,
    ThreadHook, VirtioDevice, VirtioInterrupt,
};

use virtio_bindings::virtio_blk as vb;

const F_SEG_MAX: u64 = 1 << vb::VIRTIO_BLK_F_SEG_MAX;
const F_RO: u64 = 1 << vb::VIRTIO_BLK_F_RO;
const F_BLK_SIZE: u64 = 1 << vb::VIRTIO_BLK_F_BLK_SIZE;
const F_FLUSH: u64 = 1 << vb::VIRTIO_BLK_F_FLUSH;
const F_MQ: u64 = 1 << vb::VIRTIO_BLK_F_MQ;
const F_DISCARD: u64 = 1 << vb::VIRTIO_BLK_F_DISCARD;
const F_WRITE_ZEROES: u64 = 1 << vb::VIRTIO_BLK_F_WRITE_ZEROES;
const CONFIG_LEN: usize = 60;
/// Most queues a disk may have.
pub const MAX_QUEUES: u16 = 16;

/// How a disk is set up (`--disk path=...,readonly=on,direct=on,queues=2,poll_us=50`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockConfig {
    /// Backing file or block device.
    pub path: PathBuf,
    /// Refuse writes.
    pub read_only: bool,
    /// Use O_DIRECT where requests are aligned.
    pub direct: bool,
    /// Number of queues.
    pub queues: u16,
    /// Polling window before a worker sleeps (0: pure interrupt mode).
    pub poll: Duration,
    /// Pin workers to this core (default: the launcher picks a host core).
    pub worker_core: Option<usize>,
    /// io_uring SQPOLL.
    pub sqpoll: bool,
    /// Device ID (GET_ID), at most 20 bytes.
    pub id: String,
    /// Behind virtio-pci rather than virtio-mmio (the board's choice, carried with the
    /// request).
    pub pci: bool,
}

impl BlockConfig {
    /// `path` with every option at its default: read-write, buffered, one queue, interrupt
    /// mode, workers where the launcher puts them, no SQPOLL, device ID `id`.
    pub fn new(path: PathBuf, id: String) -> Self {
        Self {
            path,
            read_only: false,
            direct: false,
            queues: 1,
            poll: Duration::ZERO,
            worker_core: None,
            sqpoll: false,
            id,
            pci: false,
        }
    }
}

/// What a queue thread is asked to do.
enum Job {
    /// Serve a queue until its stop eventfd fires.
    Serve(Box<Session>),
    /// End the thread.
    Exit,
}

/// One activation of one queue.
struct Session {
    queue: super::queue::Queue,
    mem: vm_memory::GuestMemoryMmap,
    bell: Arc<EventFd>,
    interrupt: Arc<VirtioInterrupt>,
    shared: Arc<Shared>,
}

/// A queue's thread, started once (before the guest runs) with its io_uring, and handed
/// each activation: the vCPU thread that activates or resets the device never creates a
/// thread or an io_uring, and the queue thread makes its ring only before it is confined.
struct QueueThread {
    jobs: Sender<Job>,
    acks: Receiver<Result<(), DeviceError>>,
    stop: Arc<EventFd>,
    thread: Option<JoinHandle<()>>,
    serving: bool,
}

/// What a queue thread keeps of its device, for the device's life.
struct DeviceParts {
    disk: Arc<Disk>,
    lim: Limits,
    cfg: WorkerConfig,
    /// The device's rate limit for guest-triggered messages.
    log: Arc<crate::ratelimit::RateLimiter>,
}

/// The queue thread: pin, confine (`hook`), then serve activations one after another.
fn queue_thread(
    dev: DeviceParts,
    stop: Arc<EventFd>,
    jobs: Receiver<Job>,
    acks: Sender<Result<(), DeviceError>>,
    hook: ThreadHook,
) {
    let DeviceParts {
        disk,
        lim,
        cfg,
        log,
    } = dev;
    if let Some(c) = cfg.core {
        if !worker::pin(c) {
            log::warn!("virtio-blk worker: pinning to core {c} failed");
        }
    }
    // The ring is made before the thread is confined: its filter denies io_uring_setup
    // and io_uring_register, so a thread taken over by a guest cannot make a ring the
    // restrictions do not cover. Each activation borrows it and gives it back empty.
    let mut ring = worker::ring(MAX_QUEUE_SIZE, cfg.sqpoll).map_err(|e| e.to_string());
    let confined = hook("blk-worker").map_err(|e| e.to_string());
    while let Ok(job) = jobs.recv() {
        let Job::Serve(s) = job else { break };
        if let Err(why) = &confined {
            let _ = acks.send(Err(DeviceError::NotConfined {
                thread: "blk-worker",
                why: why.clone(),
            }));
            continue;
        }
        let r = match std::mem::replace(&mut ring, Err("in use".into())) {
            Ok(r) => r,
            Err(e) => {
                let _ = acks.send(Err(DeviceError::Ring(e.clone())));
                ring = Err(e);
                continue;
            }
        };
        // A stop left over from the last session must not end this one.
        let _ = stop.read();
        let w = Worker::new(
            s.queue,
            s.mem,
            disk.clone(),
            lim,
            s.bell,
            stop.clone(),
            s.interrupt,
            s.shared,
            cfg,
            r,
        )
        .with_log(log.clone());
        let _ = acks.send(Ok(()));
        ring = Ok(w.run());
        let _ = acks.send(Ok(()));
    }
}

/// A virtio-blk device.
pub struct VirtioBlock {
    disk: Arc<Disk>,
    cfg: BlockConfig,
    lim: Limits,
    workers: Vec<QueueThread>,
    /// The running activation's queues: (queue index, its worker's state).
    shared: Vec<(u16, Arc<Shared>)>,
    /// Counters of activations that ended (a driver resets and re-activates; the guest
    /// may do so without end), folded in per queue so nothing grows with them.
    totals: Vec<QueueCounters>,
    /// The rate limit of its queue workers' guest-triggered messages, for its whole life.
    log: Arc<crate::ratelimit::RateLimiter>,
}

impl VirtioBlock {
    /// Opens the backing and builds the device.
    pub fn new(cfg: BlockConfig) -> Result<Self, DiskError> {
        let disk = Disk::open(&cfg.path, cfg.read_only, cfg.direct, &cfg.id)?;
        Ok(Self::with_disk(cfg, disk))
    }

    /// The device over `file`, already open as `cfg` asks (read-write unless read-only):
    /// the VMM opens a user's path once, safely, and hands the file over.
    pub fn from_file(cfg: BlockConfig, file: std::fs::File) -> Result<Self, DiskError> {
        let disk = Disk::from_file(file, &cfg.path, cfg.read_only, cfg.direct, &cfg.id)?;
        Ok(Self::with_disk(cfg, disk))
    }

    fn with_disk(cfg: BlockConfig, disk: Disk) -> Self {
        let disk = Arc::new(disk);
        let lim = Limits {
            capacity: disk.sectors,
            read_only: cfg.read_only,
            seg_max: 128,
            max_segments: 16,
            max_segment_sectors: 1 << 22,
        };
        Self {
            disk,
            cfg,
            lim,
            workers: Vec::new(),
            shared: Vec::new(),
            totals: Vec::new(),
            log: Arc::new(crate::ratelimit::RateLimiter::new(
                5,
                std::time::Duration::from_secs(1),
            )),
        }
    }

    /// The open disk.
    pub fn disk(&self) -> &Disk {
        &self.disk
    }

    /// The core workers pin to when the disk's own config names none.
    pub fn set_default_core(&mut self, core: Option<usize>) {
        if self.cfg.worker_core.is_none() {
            self.cfg.worker_core = core;
        }
    }

    fn config(&self) -> [u8; CONFIG_LEN] {
        let mut c = [0u8; CONFIG_LEN];
        c[0..8].copy_from_slice(&self.disk.sectors.to_le_bytes());
        c[12..16].copy_from_slice(&self.lim.seg_max.to_le_bytes());
        c[20..24].copy_from_slice(&512u32.to_le_bytes());
        c[34..36].copy_from_slice(&self.cfg.queues.to_le_bytes());
        c[36..40].copy_from_slice(&self.lim.max_segment_sectors.to_le_bytes());
        c[40..44].copy_from_slice(&self.lim.max_segments.to_le_bytes());
        c[44..48].copy_from_slice(&1u32.to_le_bytes());
        c[48..52].copy_from_slice(&self.lim.max_segment_sectors.to_le_bytes());
        c[52..56].copy_from_slice(&self.lim.max_segments.to_le_bytes());
        c[56] = 1; // write zeroes may unmap
        c
    }
}

impl VirtioDevice for VirtioBlock {
    fn device_type(&self) -> u32 {
        TYPE_BLOCK
    }

    fn features(&self) -> u64 {
        let mut f = F_VERSION_1 | F_EVENT_IDX | F_INDIRECT_DESC | F_SEG_MAX | F_BLK_SIZE | F_FLUSH;
        if self.cfg.queues > 1 {
            f |= F_MQ;
        }
        if self.cfg.read_only {
            f |= F_RO;
        } else {
            f |= F_DISCARD | F_WRITE_ZEROES;
        }
        f
    }

    fn queue_sizes(&self) -> Vec<u16> {
        vec![MAX_QUEUE_SIZE; self.cfg.queues as usize]
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let c = self.config();
        for (i, b) in data.iter_mut().enumerate() {
            *b = offset
                .checked_add(i as u64)
                .and_then(|o| c.get(o as usize))
                .copied()
                .unwrap_or(0);
        }
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}

    fn start(&mut self, hook: ThreadHook) -> Result<(), DeviceError> {
        if !self.workers.is_empty() {
            return Ok(());
        }
        let cfg = WorkerConfig {
            poll: self.cfg.poll,
            core: self.cfg.worker_core,
            sqpoll: self.cfg.sqpoll,
        };
        for i in 0..self.cfg.queues {
            let (jobs, job_rx) = channel();
            let (ack_tx, acks) = channel();
            let stop =
                Arc::new(
                    EventFd::new(libc::EFD_NONBLOCK).map_err(|source| DeviceError::Os {
                        what: "a queue thread's stop eventfd",
                        source,
                    })?,
                );
            let dev = DeviceParts {
                disk: self.disk.clone(),
                lim: self.lim,
                cfg,
                log: self.log.clone(),
            };
            let (st, hook) = (stop.clone(), hook.clone());
            let t = std::thread::Builder::new()
                .name(format!("blk-q{i}"))
                .spawn(move || queue_thread(dev, st, job_rx, ack_tx, hook))
                .map_err(|source| DeviceError::Os {
                    what: "starting a queue thread",
                    source,
                })?;
            self.workers.push(QueueThread {
                jobs,
                acks,
                stop,
                thread: Some(t),
                serving: false,
            });
        }
        Ok(())
    }

    fn activate(&mut self, a: Activation) -> Result<(), DeviceError> {
        self.reset();
        if self.workers.len() < a.queues.len() {
            return Err(DeviceError::NotStarted);
        }
        for (i, q) in a.queues.into_iter().enumerate() {
            let Some(q) = q else {
                continue;
            };
            let shared = Arc::new(Shared::default());
            let bell = a
                .doorbells
                .get(i)
                .cloned()
                .ok_or(DeviceError::NoDoorbell(i))?;
            let w = &mut self.workers[i];
            let job = Job::Serve(Box::new(Session {
                queue: q,
                mem: a.mem.clone(),
                bell,
                // Its used-buffer notifications go on this queue's vector (virtio-pci).
                interrupt: a.interrupt.for_queue(i as u16),
                shared: shared.clone(),
            }));
            w.jobs.send(job).map_err(|_| DeviceError::ThreadGone(i))?;
            match w.acks.recv() {
                Ok(Ok(())) => w.serving = true,
                Ok(Err(e)) => {
                    return Err(DeviceError::Queue {
                        queue: i,
                        source: Box::new(e),
                    });
                }
                Err(_) => return Err(DeviceError::ThreadGone(i)),
            }
            self.shared.push((i as u16, shared));
        }
        Ok(())
    }

    fn reset(&mut self) {
        for w in &mut self.workers {
            if w.serving {
                let _ = w.stop.write(1);
                // The session ends once its in-flight I/O has completed.
                let _ = w.acks.recv();
                w.serving = false;
            }
        }
        // The activation is over: its counters join the totals and its state (NEEDS_RESET
        // among it) goes, so a reset clears the condition and nothing accumulates.
        for (q, s) in self.shared.drain(..) {
            QueueCounters::merge_into(counters(q, &s), &mut self.totals);
        }
    }

    fn needs_reset(&self) -> bool {
        self.shared
            .iter()
            .any(|(_, s)| s.needs_reset.load(Ordering::Acquire))
    }

    fn log_suppressed(&self) -> u64 {
        self.log.dropped_total()
    }

    fn stats(&self) -> Vec<QueueCounters> {
        let mut all = self.totals.clone();
        for (q, s) in &self.shared {
            QueueCounters::merge_into(counters(*q, s), &mut all);
        }
        all
    }
}

/// A worker's counters as they stand.
fn counters(queue: u16, s: &Shared) -> QueueCounters {
    let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    QueueCounters {
        queue,
        requests: l(&s.stats.requests),
        refused: l(&s.stats.refused),
        doorbells: l(&s.stats.doorbells),
        interrupts: l(&s.stats.interrupts),
        ring_full: l(&s.stats.ring_full),
    }
}

impl Drop for VirtioBlock {
    fn drop(&mut self) {
        self.reset();
        for w in &mut self.workers {
            let _ = w.jobs.send(Job::Exit);
            if let Some(t) = w.thread.take() {
                let _ = t.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtio::VirtioInterrupt;
    use crate::virtio::queue::QueueSetup;
    use vm_memory::{GuestAddress, GuestMemoryMmap};

    struct NoIrq;
    impl crate::Interrupt for NoIrq {
        fn trigger(&self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn activation(mem: &GuestMemoryMmap, bell: &Arc<EventFd>) -> Activation {
        let q = QueueSetup {
            size: 16,
            desc_table: 0x1000,
            avail_ring: 0x2000,
            used_ring: 0x3000,
            ready: true,
            ..QueueSetup::new(MAX_QUEUE_SIZE)
        };
        Activation {
            mem: mem.clone(),
            queues: vec![Some(q.start(mem, false, false).unwrap())],
            features: F_VERSION_1,
            interrupt: Arc::new(VirtioInterrupt::new(Box::new(NoIrq))),
            doorbells: vec![bell.clone()],
        }
    }

    #[test]
    fn resets_clear_needs_reset_and_nothing_grows_with_activations() {
        let dir = std::env::temp_dir().join(format!("blk-reset-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("disk.img");
        std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
        let mut blk = VirtioBlock::new(BlockConfig::new(path.clone(), "t".into())).unwrap();
        let started = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let seen = started.clone();
        blk.start(Arc::new(move |role| {
            assert_eq!(role, "blk-worker");
            seen.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }))
        .unwrap();
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let bell = Arc::new(EventFd::new(libc::EFD_NONBLOCK).unwrap());
        for round in 0..200u64 {
            blk.activate(activation(&mem, &bell)).unwrap();
            assert_eq!(blk.shared.len(), 1, "round {round}");
            // A queue violation in this activation, as a worker reports it.
            blk.shared[0].1.needs_reset.store(true, Ordering::Release);
            blk.shared[0]
                .1
                .stats
                .requests
                .fetch_add(3, Ordering::Relaxed);
            assert!(blk.needs_reset());
            blk.reset();
            assert!(
                !blk.needs_reset(),
                "round {round}: NEEDS_RESET survived a reset"
            );
            assert!(blk.shared.is_empty() && blk.workers.iter().all(|w| !w.serving));
            // One entry per queue however many activations there were; counts add up.
            assert_eq!(blk.stats().len(), 1);
            assert_eq!(blk.stats()[0].requests, 3 * (round + 1));
        }
        // One thread per queue however many activations there were, each confined once.
        assert_eq!(blk.workers.len(), 1);
        assert_eq!(started.load(Ordering::SeqCst), 1);
        drop(blk);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
