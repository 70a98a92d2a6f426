//! The bare-host twin of the probe guest's NVMe driver: the same protocol
//! ([`crate::nvmecore`], the file the probe includes) driving the same controller from host
//! userspace through VFIO, pinned to the partition's core. BAR 0's registers and doorbells
//! are an mmap of the VFIO region (what the guest gets as a memory slot); the queues and
//! the data page are host pages mapped for the device's DMA at an I/O virtual address (what
//! guest memory is); completions are polled on I/O queue pair 2 (no completion interrupt),
//! or waited for on pair 1 through the eventfd VFIO signals for MSI-X vector 1 (what KVM's
//! irqfd consumes for the guest).
//!
//! Timing is the host's monotonic clock (the guest uses its TSC); both are per-submission
//! medians over the same count of one-block reads after a tenth as warm-up.

use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use vfio_bindings::bindings::vfio::VFIO_PCI_CONFIG_REGION_INDEX;
use vfio_ioctls::{VfioContainer, VfioDevice, VfioOps};
use vmm_sys_util::eventfd::EventFd;

use crate::nvmecore::{self, Bar0, Controller, Page, bring_up, io};

/// Where the twin's pages sit in the device's I/O virtual space.
const IOVA: u64 = 0x10_0000;
/// Bytes of BAR 0 mapped: registers and the first page of doorbells.
const BAR_MAP: usize = 0x2000;

/// What one twin run measured: per-submission ns, polled and by interrupt.
#[derive(Debug, Default)]
pub struct TwinRun {
    /// Submit to completion, polling the phase bit, ns.
    pub poll_ns: Vec<f64>,
    /// Submit to completion, blocked on the vector's eventfd, ns.
    pub irq_ns: Vec<f64>,
    /// Interrupts counted on the eventfd while waiting for them.
    pub interrupts: u64,
    /// Interrupts counted on the eventfd over the polled reads (none expected: their
    /// queue's completions raise none).
    pub poll_interrupts: u64,
    /// Identify's model string.
    pub model: String,
}

/// An mmap of BAR 0.
struct Mapped(*mut u8);

impl Bar0 for Mapped {
    fn rd(&self, off: u64) -> u32 {
        assert!(off as usize + 4 <= BAR_MAP, "BAR 0 offset {off:#x}");
        // SAFETY: inside the BAR_MAP bytes mapped in `run`, which outlive every access.
        unsafe { (self.0.wrapping_add(off as usize) as *const u32).read_volatile() }
    }
    fn wr(&self, off: u64, v: u32) {
        assert!(off as usize + 4 <= BAR_MAP, "BAR 0 offset {off:#x}");
        // SAFETY: as `rd`.
        unsafe { (self.0.wrapping_add(off as usize) as *mut u32).write_volatile(v) }
    }
}

fn now_ns() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// An anonymous mapping unmapped when dropped.
struct Anon(*mut libc::c_void, usize);

impl Drop for Anon {
    fn drop(&mut self) {
        // SAFETY: the mapping made for this value.
        unsafe { libc::munmap(self.0, self.1) };
    }
}

/// Runs the twin on `bdf` (bound to vfio-pci): `n` timed reads each way after `n / 10`
/// warm-up, on the calling thread (the caller pins it).
pub fn run(bdf: &str, n: usize) -> Result<TwinRun, String> {
    let sysfs = Path::new("/sys/bus/pci/devices").join(bdf);
    let err = |what: &'static str| move |e: vfio_ioctls::VfioError| format!("{what}: {e}");
    let container = Arc::new(VfioContainer::new(None).map_err(err("opening the container"))?);
    let ops: Arc<dyn VfioOps> = container.clone();
    let device = VfioDevice::new(&sysfs, ops, false).map_err(err("opening the device"))?;
    // Memory decoding and bus mastering on.
    let mut cmd = [0u8; 2];
    device.region_read(VFIO_PCI_CONFIG_REGION_INDEX, &mut cmd, 4);
    let on = u16::from_le_bytes(cmd) | 0b110;
    device.region_write(VFIO_PCI_CONFIG_REGION_INDEX, &on.to_le_bytes(), 4);
    // SAFETY: maps the first BAR_MAP bytes of BAR 0's region of the device fd; unmapped
    // below after the last access.
    let bar = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            BAR_MAP,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            device.as_raw_fd(),
            device.get_region_offset(0) as libc::off_t,
        )
    };
    if bar == libc::MAP_FAILED {
        return Err(format!(
            "mapping BAR 0: {}",
            std::io::Error::last_os_error()
        ));
    }
    let bar = Anon(bar, BAR_MAP);
    // Eight pages for the device (seven for `bring_up`, the data page), locked, mapped at
    // IOVA.
    let len = 8 * 4096;
    // SAFETY: a fresh private anonymous mapping.
    let mem = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE | libc::MAP_LOCKED,
            -1,
            0,
        )
    };
    if mem == libc::MAP_FAILED {
        return Err(format!(
            "allocating DMA pages: {}",
            std::io::Error::last_os_error()
        ));
    }
    let mem = Anon(mem, len);
    // SAFETY: the pages are ours for as long as the mapping (unmapped before `mem` drops).
    unsafe { container.vfio_dma_map(IOVA, len, mem.0 as *mut u8) }
        .map_err(err("mapping the pages for DMA"))?;
    let page = |i: usize| Page {
        cpu: (mem.0 as *mut u8).wrapping_add(i * 4096),
        dma: IOVA + (i * 4096) as u64,
    };
    let irq = EventFd::new(libc::EFD_CLOEXEC).map_err(|e| format!("eventfd: {e}"))?;
    let admin_irq = EventFd::new(libc::EFD_CLOEXEC).map_err(|e| format!("eventfd: {e}"))?;
    device
        .enable_msix(vec![&admin_irq, &irq])
        .map_err(err("enabling MSI-X"))?;
    let r = drive(Mapped(bar.0 as *mut u8), page, &irq, n);
    let _ = device.disable_msix();
    device.reset();
    let _ = container.vfio_dma_unmap(IOVA, len);
    drop(bar);
    r
}

fn drive(
    bar: Mapped,
    page: impl Fn(usize) -> Page,
    irq: &EventFd,
    n: usize,
) -> Result<TwinRun, String> {
    let c = Controller::new(bar, now_ns, 1_000_000);
    let limit = 2_000_000_000;
    let show = |e: nvmecore::Error| format!("{e:?}");
    let up = bring_up(&c, std::array::from_fn(&page), limit).map_err(show)?;
    let (mut q, mut polled) = (up.io, up.polled);
    let data = page(7);
    let read1 = io(false, &data, 0, 1);
    let warm = n / 10;
    let mut out = TwinRun {
        model: nvmecore::text(&up.id.model).to_string(),
        ..TwinRun::default()
    };
    // An interrupt raised while polling would be counted on the eventfd; start from none.
    let _ = drain(irq);
    for i in 0..n + warm {
        let t0 = now_ns();
        polled.submit(&c.bar, read1);
        match polled.poll(&c.bar, limit) {
            Some((0, _)) if i >= warm => out.poll_ns.push((now_ns() - t0) as f64),
            Some((0, _)) => {}
            other => return Err(format!("a polled read: {other:?}")),
        }
    }
    out.poll_interrupts = drain(irq);
    for i in 0..n + warm {
        let t0 = now_ns();
        q.submit(&c.bar, read1);
        // Blocks until the device's MSI-X vector 1 fires (VFIO signals the eventfd).
        let k = irq.read().map_err(|e| format!("waiting for MSI-X: {e}"))?;
        let t = now_ns();
        out.interrupts += k;
        match q.poll(&c.bar, limit) {
            Some((0, _)) if i >= warm => out.irq_ns.push((t - t0) as f64),
            Some((0, _)) => {}
            other => return Err(format!("a read waited for by MSI-X: {other:?}")),
        }
    }
    c.disable().map_err(show)?;
    Ok(out)
}

/// Clears an eventfd's count without blocking.
fn drain(e: &EventFd) -> u64 {
    let fd = e.as_raw_fd();
    // SAFETY: fcntl on our eventfd.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) };
    let v = e.read().unwrap_or(0);
    // SAFETY: as above.
    unsafe { libc::fcntl(fd, libc::F_SETFL, flags) };
    v
}
