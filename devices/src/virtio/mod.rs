//! virtio: the transports (MMIO, PCI), the split virtqueue, and the block device.

pub mod block;
pub mod mmio;
pub mod negotiation;
pub mod pci;
pub mod queue;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use crate::Interrupt;

use virtio_bindings::{virtio_config, virtio_ids, virtio_mmio, virtio_ring};

/// `VIRTIO_F_VERSION_1`, as a feature mask.
pub const F_VERSION_1: u64 = 1 << virtio_config::VIRTIO_F_VERSION_1;
/// `VIRTIO_RING_F_INDIRECT_DESC`, as a feature mask.
pub const F_INDIRECT_DESC: u64 = 1 << virtio_ring::VIRTIO_RING_F_INDIRECT_DESC;
/// `VIRTIO_RING_F_EVENT_IDX`, as a feature mask.
pub const F_EVENT_IDX: u64 = 1 << virtio_ring::VIRTIO_RING_F_EVENT_IDX;
/// InterruptStatus: used buffer notification.
pub const INT_VRING: u32 = virtio_mmio::VIRTIO_MMIO_INT_VRING;
/// InterruptStatus: configuration change (also: the device needs a reset).
pub const INT_CONFIG: u32 = virtio_mmio::VIRTIO_MMIO_INT_CONFIG;
/// Device type: block.
pub const TYPE_BLOCK: u32 = virtio_ids::VIRTIO_ID_BLOCK;

/// No MSI-X vector (virtio 1.2, 4.1.4.3: `VIRTIO_MSI_NO_VECTOR`): that event sends none.
pub const NO_VECTOR: u16 = 0xffff;

/// MSI-X delivery for a virtio-pci device: the capability's state (the guest programs it
/// through the transport's BAR), one line per vector (an irqfd the VMM routes to the
/// vector's message), and the vector the driver chose for the configuration change and for
/// each queue ([`NO_VECTOR`] for none).
pub struct MsixVectors {
    /// The capability, its table and pending bits.
    pub msix: std::sync::Mutex<crate::pci::msix::Msix>,
    /// Vector `i`'s line.
    pub lines: Vec<Box<dyn Interrupt + Sync>>,
    /// The configuration change's vector.
    pub config: std::sync::atomic::AtomicU16,
    /// Each queue's vector.
    pub queues: Vec<std::sync::atomic::AtomicU16>,
}

impl MsixVectors {
    /// `lines.len()` vectors in `layout`, for `queues` queues, none chosen yet.
    pub fn new(
        lines: Vec<Box<dyn Interrupt + Sync>>,
        layout: crate::pci::msix::MsixLayout,
        queues: usize,
    ) -> Result<Self, crate::pci::msix::MsixError> {
        Ok(Self {
            msix: std::sync::Mutex::new(crate::pci::msix::Msix::new(lines.len(), layout)?),
            lines,
            config: std::sync::atomic::AtomicU16::new(NO_VECTOR),
            queues: (0..queues)
                .map(|_| std::sync::atomic::AtomicU16::new(NO_VECTOR))
                .collect(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, crate::pci::msix::Msix> {
        self.msix.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the driver turned MSI-X on (then every event goes by vector).
    pub fn enabled(&self) -> bool {
        self.lock().enabled()
    }

    /// With MSI-X on, raises each of `vectors` (at most two: a configuration change and a
    /// queue's) as MSI-X says (sent on its line now,
    /// left pending while masked, nothing for [`NO_VECTOR`] or a vector past the table) and
    /// returns true; with MSI-X off, does nothing and returns false. One lock of the
    /// capability for all of them: a queue worker calls this for every used-buffer
    /// notification.
    pub fn deliver(&self, vectors: &[u16]) -> bool {
        debug_assert!(vectors.len() <= 2, "at most two vectors at once");
        let mut send = [NO_VECTOR; 2];
        let mut n = 0;
        {
            let mut m = self.lock();
            if !m.enabled() {
                return false;
            }
            for &v in vectors.iter().filter(|&&v| v != NO_VECTOR) {
                if let crate::pci::msix::Delivery::Send(_) = m.signal(usize::from(v)) {
                    if n < send.len() {
                        send[n] = v;
                        n += 1;
                    }
                }
            }
        }
        for &v in &send[..n] {
            if let Some(Err(e)) = self.lines.get(usize::from(v)).map(|l| l.trigger()) {
                log::warn!("virtio-pci: raising vector {v} failed: {e}");
            }
        }
        true
    }
}

/// What the interrupts of one device share.
struct InterruptState {
    status: AtomicU32,
    line: Box<dyn Interrupt + Sync>,
    msix: Option<Arc<MsixVectors>>,
}

/// A device's interrupt: the InterruptStatus (ISR) register and the line (an irqfd), or,
/// behind virtio-pci with MSI-X on, a vector per event. A handle bound to a queue
/// ([`VirtioInterrupt::for_queue`]) sends that queue's used-buffer notifications on the
/// queue's own vector.
pub struct VirtioInterrupt {
    state: Arc<InterruptState>,
    queue: Option<u16>,
}

/// A line that goes nowhere: a virtio-pci device with no INTx pin.
struct NoLine;

impl Interrupt for NoLine {
    fn trigger(&self) -> std::io::Result<()> {
        Ok(())
    }
}

impl VirtioInterrupt {
    /// An interrupt on `line`.
    pub fn new(line: Box<dyn Interrupt + Sync>) -> Self {
        Self {
            state: Arc::new(InterruptState {
                status: AtomicU32::new(0),
                line,
                msix: None,
            }),
            queue: None,
        }
    }

    /// MSI-X vectors and no INTx line: while the driver has not turned MSI-X on, events
    /// only set the ISR bits.
    pub fn msix(vectors: Arc<MsixVectors>) -> Self {
        Self {
            state: Arc::new(InterruptState {
                status: AtomicU32::new(0),
                line: Box::new(NoLine),
                msix: Some(vectors),
            }),
            queue: None,
        }
    }

    /// The same interrupt, its used-buffer notifications sent for queue `q`.
    pub fn for_queue(&self, q: u16) -> Arc<Self> {
        Arc::new(Self {
            state: self.state.clone(),
            queue: Some(q),
        })
    }

    /// Sets `bits` in InterruptStatus and raises the line; with MSI-X on, sends the
    /// configuration vector for INT_CONFIG and, for INT_VRING, the bound queue's vector
    /// (every queue's, unbound).
    pub fn trigger(&self, bits: u32) {
        if let Some(m) = &self.state.msix {
            use std::sync::atomic::Ordering::Relaxed;
            let vector =
                |v: Option<&std::sync::atomic::AtomicU16>| v.map_or(NO_VECTOR, |v| v.load(Relaxed));
            let config = if bits & INT_CONFIG != 0 {
                m.config.load(Relaxed)
            } else {
                NO_VECTOR
            };
            let delivered = if bits & INT_VRING == 0 {
                m.deliver(&[config])
            } else {
                match self.queue {
                    Some(q) => m.deliver(&[config, vector(m.queues.get(usize::from(q)))]),
                    // Unbound: every queue's vector, each once.
                    None => {
                        let mut all: Vec<u16> = vec![config];
                        for v in m.queues.iter().map(|v| v.load(Relaxed)) {
                            if !all.contains(&v) {
                                all.push(v);
                            }
                        }
                        all.chunks(2).fold(false, |_, c| m.deliver(c))
                    }
                }
            };
            if delivered {
                return;
            }
        }
        self.state.status.fetch_or(bits, Ordering::AcqRel);
        if let Err(e) = self.state.line.trigger() {
            log::warn!("virtio: raising the interrupt failed: {e}");
        }
    }

    /// InterruptStatus.
    pub fn status(&self) -> u32 {
        self.state.status.load(Ordering::Acquire)
    }

    /// InterruptACK.
    pub fn ack(&self, bits: u32) {
        self.state.status.fetch_and(!bits, Ordering::AcqRel);
    }

    /// ISR read (virtio-pci): the bits, cleared by the read.
    pub fn take_status(&self) -> u32 {
        self.state.status.swap(0, Ordering::AcqRel)
    }
}

/// What a device gets when the driver sets DRIVER_OK.
pub struct Activation {
    /// Guest memory.
    pub mem: GuestMemoryMmap,
    /// Each queue, running, or `None` if the driver did not make it ready.
    pub queues: Vec<Option<queue::Queue>>,
    /// Negotiated features.
    pub features: u64,
    /// The device's interrupt.
    pub interrupt: std::sync::Arc<VirtioInterrupt>,
    /// One doorbell eventfd per queue (an ioeventfd, or written by the transport).
    pub doorbells: Vec<std::sync::Arc<EventFd>>,
}

/// Called first on every thread a device starts, with the thread's kind (`blk-worker`):
/// where the launcher confines it (its seccomp filter). An error leaves the thread unable
/// to serve.
pub type ThreadHook = std::sync::Arc<dyn Fn(&'static str) -> Result<(), HookError> + Send + Sync>;

/// Why a [`ThreadHook`] failed (the launcher's own error, carried as it is).
pub type HookError = Box<dyn std::error::Error + Send + Sync>;

/// Why a device's threads could not start, or an activation could not be served.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// A system call failed (an eventfd, a thread).
    #[error("{what}: {source}")]
    Os {
        /// What was being done.
        what: &'static str,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The thread could not be confined, so it serves nothing.
    #[error("the {thread} thread is not confined: {why}")]
    NotConfined {
        /// The thread's kind.
        thread: &'static str,
        /// The hook's error.
        why: String,
    },
    /// The thread has no io_uring to serve with.
    #[error("io_uring: {0}")]
    Ring(String),
    /// Activated before [`VirtioDevice::start`], or with more queues than it started.
    #[error("the queue threads were not started")]
    NotStarted,
    /// The transport gave no doorbell for a queue.
    #[error("no doorbell for queue {0}")]
    NoDoorbell(usize),
    /// A queue's thread ended.
    #[error("queue {0}'s thread is gone")]
    ThreadGone(usize),
    /// A queue's thread refused the activation.
    #[error("queue {queue}: {source}")]
    Queue {
        /// The queue.
        queue: usize,
        /// Why.
        source: Box<DeviceError>,
    },
}

/// A virtio device behind the MMIO transport. Register logic lives in the transport; the
/// device owns its config space and what runs once it is activated.
pub trait VirtioDevice: Send {
    /// Starts the device's threads, before the guest runs (a device without threads has
    /// nothing to do). Activations only hand work to them.
    fn start(&mut self, _hook: ThreadHook) -> Result<(), DeviceError> {
        Ok(())
    }
    /// Device type.
    fn device_type(&self) -> u32;
    /// Features offered.
    fn features(&self) -> u64;
    /// Largest size of each queue.
    fn queue_sizes(&self) -> Vec<u16>;
    /// Reads config space.
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// Writes config space (devices may ignore it).
    fn write_config(&mut self, offset: u64, data: &[u8]);
    /// Starts serving the queues.
    fn activate(&mut self, a: Activation) -> Result<(), DeviceError>;
    /// Stops serving (reset, or teardown); waits for in-flight work.
    fn reset(&mut self);
    /// Whether the device found a queue violation and needs a reset.
    fn needs_reset(&self) -> bool;
    /// Each queue's counters, for teardown.
    fn stats(&self) -> Vec<QueueCounters>;
    /// Guest-triggered messages its rate limit dropped over its life.
    fn log_suppressed(&self) -> u64 {
        0
    }
}

/// A device the transport and its owner share: the PCI root owns a function (and with it
/// the transport), while the launch starts, stops and reads the device through this handle.
#[derive(Clone)]
pub struct SharedDevice(pub Arc<std::sync::Mutex<Box<dyn VirtioDevice>>>);

impl SharedDevice {
    /// `device`, shared.
    pub fn new(device: Box<dyn VirtioDevice>) -> Self {
        Self(Arc::new(std::sync::Mutex::new(device)))
    }

    /// The device, locked.
    pub fn lock(&self) -> std::sync::MutexGuard<'_, Box<dyn VirtioDevice>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl VirtioDevice for SharedDevice {
    fn start(&mut self, hook: ThreadHook) -> Result<(), DeviceError> {
        self.lock().start(hook)
    }
    fn device_type(&self) -> u32 {
        self.lock().device_type()
    }
    fn features(&self) -> u64 {
        self.lock().features()
    }
    fn queue_sizes(&self) -> Vec<u16> {
        self.lock().queue_sizes()
    }
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        self.lock().read_config(offset, data)
    }
    fn write_config(&mut self, offset: u64, data: &[u8]) {
        self.lock().write_config(offset, data)
    }
    fn activate(&mut self, a: Activation) -> Result<(), DeviceError> {
        self.lock().activate(a)
    }
    fn reset(&mut self) {
        self.lock().reset()
    }
    fn needs_reset(&self) -> bool {
        self.lock().needs_reset()
    }
    fn stats(&self) -> Vec<QueueCounters> {
        self.lock().stats()
    }
    fn log_suppressed(&self) -> u64 {
        self.lock().log_suppressed()
    }
}

/// One queue's counters as a device read them at teardown.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct QueueCounters {
    /// Queue index.
    pub queue: u16,
    /// Requests completed.
    pub requests: u64,
    /// Requests refused (completed with an error status).
    pub refused: u64,
    /// Doorbells (queue notifications) seen.
    pub doorbells: u64,
    /// Interrupts sent.
    pub interrupts: u64,
    /// Times the submission ring was full (requests waited in the avail ring).
    pub ring_full: u64,
}

impl QueueCounters {
    /// Adds `c` to the entry for its queue in `all` (or appends it), keeping `all` in
    /// queue order.
    pub fn merge_into(c: QueueCounters, all: &mut Vec<QueueCounters>) {
        match all.iter_mut().find(|t| t.queue == c.queue) {
            Some(t) => {
                t.requests += c.requests;
                t.refused += c.refused;
                t.doorbells += c.doorbells;
                t.interrupts += c.interrupts;
                t.ring_full += c.ring_full;
            }
            None => all.push(c),
        }
        all.sort_by_key(|t| t.queue);
    }
}

impl std::fmt::Display for QueueCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "q{}: requests={} refused={} doorbells={} interrupts={} ring_full={}",
            self.queue,
            self.requests,
            self.refused,
            self.doorbells,
            self.interrupts,
            self.ring_full
        )
    }
}
