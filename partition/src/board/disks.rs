//! Disks: parsing `--disk` and attaching virtio-blk devices to a VM.
//!
//! Each disk gets a 4 KiB virtio-mmio window from 0xd000_0000 up and a GSI from 5 up, is
//! described in the ACPI DSDT (a `LNRO0005` device, how stock kernels find it) and
//! announced on the guest's command line as `virtio_mmio.device=4K@ADDR:GSI`, has its
//! interrupt on an irqfd, and each of its queues' QueueNotify bound to an ioeventfd
//! (datamatch = queue index) so doorbells never leave the kernel. With `--no-ioeventfd`
//! the doorbell is an MMIO exit the transport turns into the same eventfd write.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use boot::acpi::MmioDevice;
use devices::Bus;
use devices::virtio::VirtioInterrupt;
use devices::virtio::block::{BlockConfig, MAX_QUEUES, VirtioBlock};
use devices::virtio::mmio::{MmioTransport, QUEUE_NOTIFY, WINDOW};
use vmm_sys_util::eventfd::EventFd;

use crate::config::keyvalue::{KeyValueError, KeyValues, OnOff};
use crate::kvm::Vm;
use crate::memory::GuestMemory;

/// Most disks (each takes an IOAPIC pin; `crate::board::resources` has 19 free).
pub const MAX_DISKS: usize = 8;

/// Errors parsing or attaching disks.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// `--disk` does not parse.
    #[error("--disk {spec:?}: {why}")]
    Spec {
        /// The argument.
        spec: String,
        /// What is wrong.
        why: String,
    },
    /// Too many disks.
    #[error("at most {MAX_DISKS} disks")]
    TooMany,
    /// The backing cannot be used.
    #[error("{0}")]
    Open(#[from] devices::virtio::block::disk::DiskError),
    /// eventfd creation.
    #[error("eventfd: {0}")]
    EventFd(std::io::Error),
    /// The bus refused the window.
    #[error("{0}")]
    Bus(#[from] devices::BusError),
    /// KVM refused a doorbell (ioeventfd) or an interrupt line (irqfd).
    #[error("{0}")]
    Vm(#[from] crate::kvm::VmError),
}

impl From<KeyValueError> for DiskError {
    fn from(e: KeyValueError) -> Self {
        Self::Spec {
            spec: e.spec,
            why: e.why,
        }
    }
}

/// Parses `path=FILE[,readonly=on][,direct=on][,queues=N][,poll_us=N][,core=N][,sqpoll=on][,id=STR]`.
pub fn parse(spec: &str, index: usize) -> Result<BlockConfig, DiskError> {
    let mut kv = KeyValues::parse(spec)?;
    let err = |why: String| DiskError::Spec {
        spec: spec.into(),
        why,
    };
    let path: Option<PathBuf> = kv.get("path")?;
    let path = path
        .filter(|p| !p.as_os_str().is_empty())
        .ok_or_else(|| err("path=FILE is required".into()))?;
    let mut cfg = BlockConfig::new(path, format!("partition-disk{index}"));
    let on = |v: Option<OnOff>, default| v.map_or(default, |o| o.0);
    cfg.read_only = on(kv.get("readonly")?, false);
    cfg.direct = on(kv.get("direct")?, false);
    cfg.sqpoll = on(kv.get("sqpoll")?, false);
    if let Some(q) = kv.get::<u16>("queues")? {
        if !(1..=MAX_QUEUES).contains(&q) {
            return Err(err(format!("queues={q}: 1 to {MAX_QUEUES}")));
        }
        cfg.queues = q;
    }
    if let Some(us) = kv.get::<u64>("poll_us")? {
        if us > 1_000_000 {
            return Err(err(format!("poll_us={us}: 0 to 1000000")));
        }
        cfg.poll = Duration::from_micros(us);
    }
    if let Some(c) = kv.get::<usize>("core")? {
        if !crate::config::cores::available().contains(&c) {
            return Err(err(format!("core={c}: not an online core")));
        }
        cfg.worker_core = Some(c);
    }
    if let Some(id) = kv.get::<String>("id")? {
        if id.len() > 20 || !id.is_ascii() {
            return Err(err("id: at most 20 ASCII characters".into()));
        }
        cfg.id = id;
    }
    kv.finish(&[
        "path", "readonly", "direct", "queues", "poll_us", "core", "sqpoll", "id",
    ])?;
    Ok(cfg)
}

/// A disk attached to a VM.
pub struct AttachedDisk {
    /// Its window.
    pub transport: Arc<Mutex<MmioTransport>>,
    /// Window base.
    pub base: u64,
    /// Its GSI.
    pub gsi: u32,
    /// The backing's buffered descriptor (its queue workers zero ranges through it).
    pub disk_fd: std::os::fd::RawFd,
}

/// Opens every disk (so a bad one is reported before anything else is created).
pub fn open(configs: &[BlockConfig]) -> Result<Vec<VirtioBlock>, DiskError> {
    if configs.len() > MAX_DISKS {
        return Err(DiskError::TooMany);
    }
    // Each backing is opened once, by descriptor, following no link someone else
    // controls (crate::sys::files); everything after uses that file.
    let mut files = Vec::with_capacity(configs.len());
    for c in configs {
        let how = if c.read_only {
            crate::sys::files::How::READ
        } else {
            crate::sys::files::How::READ_WRITE
        };
        let f = crate::sys::files::open(&c.path, how).map_err(|e| DiskError::Spec {
            spec: format!("path={}", c.path.display()),
            why: e.to_string(),
        })?;
        files.push(f);
    }
    // One file attached twice with either read-write: two devices' writes would race over
    // the same bytes behind the guest's back (issue 24). By device and inode, so a second
    // path or a symlink to the same file counts too.
    let ids: Vec<Option<(u64, u64)>> = files
        .iter()
        .map(|f| {
            f.metadata().ok().map(|m| {
                (
                    std::os::unix::fs::MetadataExt::dev(&m),
                    std::os::unix::fs::MetadataExt::ino(&m),
                )
            })
        })
        .collect();
    for (i, a) in configs.iter().enumerate() {
        for (j, b) in configs.iter().enumerate().skip(i + 1) {
            if ids[i].is_some() && ids[i] == ids[j] && !(a.read_only && b.read_only) {
                return Err(DiskError::Spec {
                    spec: format!("path={}", b.path.display()),
                    why: format!(
                        "the same file as {} is already attached, and read-write: attach it \
                         once, or readonly=on both times",
                        a.path.display()
                    ),
                });
            }
        }
    }
    configs
        .iter()
        .zip(files)
        .map(|(c, f)| VirtioBlock::from_file(c.clone(), f).map_err(DiskError::from))
        .collect()
}

/// The command-line words announcing the disks in `windows` (where
/// `crate::board::resources` placed them), for kernels built with
/// `CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES` (stock distribution kernels find them in the ACPI
/// DSDT, which describes the same windows).
pub fn cmdline(windows: &[MmioDevice]) -> String {
    windows
        .iter()
        .map(|w| format!("virtio_mmio.device=4K@{:#x}:{}", w.base, w.gsi))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Puts `disks` on `bus`, with doorbells and interrupts wired through KVM.
pub fn attach(
    vm: &Vm,
    mem: &GuestMemory,
    bus: &mut Bus,
    disks: Vec<VirtioBlock>,
    windows: &[MmioDevice],
    ioeventfd: bool,
    worker_core: Option<usize>,
) -> Result<Vec<AttachedDisk>, DiskError> {
    use devices::virtio::VirtioDevice;
    let mut out = Vec::new();
    for (i, (mut d, w)) in disks.into_iter().zip(windows).enumerate() {
        let MmioDevice { base, gsi, .. } = *w;
        d.set_default_core(worker_core);
        let mut doorbells = Vec::new();
        for q in 0..d.queue_sizes().len() {
            let evt = Arc::new(EventFd::new(libc::EFD_NONBLOCK).map_err(DiskError::EventFd)?);
            if ioeventfd {
                vm.bind_doorbell(&evt, base + QUEUE_NOTIFY, q as u32)?;
                log::debug!(
                    "virtio-blk{i} queue {q}: doorbell at {:#x} (datamatch {q}) is answered by the kernel",
                    base + QUEUE_NOTIFY
                );
            }
            doorbells.push(evt);
        }
        let irq = vm.irq_line(gsi)?;
        let interrupt = Arc::new(VirtioInterrupt::new(Box::new(irq)));
        let disk_fd = std::os::fd::AsRawFd::as_raw_fd(&d.disk().file);
        let t = Arc::new(Mutex::new(MmioTransport::new(
            Box::new(d),
            mem.mem().clone(),
            interrupt,
            doorbells,
        )));
        bus.insert(&format!("virtio-blk{i}"), base, WINDOW, t.clone())?;
        out.push(AttachedDisk {
            transport: t,
            base,
            gsi,
            disk_fd,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_disk_specs() {
        let c = parse(
            "path=/tmp/x.img,readonly=on,direct=on,queues=2,poll_us=50,sqpoll=off,id=abc",
            3,
        )
        .unwrap();
        assert_eq!(c.path, PathBuf::from("/tmp/x.img"));
        assert!(c.read_only && c.direct && !c.sqpoll);
        assert_eq!(
            (c.queues, c.poll, c.id.as_str()),
            (2, Duration::from_micros(50), "abc")
        );
        let d = parse("path=/tmp/y", 1).unwrap();
        assert_eq!(
            (d.queues, d.poll, d.id.as_str()),
            (1, Duration::ZERO, "partition-disk1")
        );
        for bad in [
            "",
            "readonly=on",
            "path=",
            "path=/x,queues=0",
            "path=/x,queues=99",
            "path=/x,poll_us=-1",
            "path=/x,readonly=maybe",
            "path=/x,colour=red",
            "path=/x,core=4096",
            "path=/x,id=012345678901234567890",
            "path=/x,junk",
        ] {
            assert!(parse(bad, 0).is_err(), "{bad}");
        }
        assert_eq!(
            cmdline(
                &crate::board::resources::MachinePlan::new(1, 2, false, &[], 48)
                    .unwrap()
                    .disks
            ),
            "virtio_mmio.device=4K@0xd0000000:5 virtio_mmio.device=4K@0xd0001000:6"
        );
    }
}
