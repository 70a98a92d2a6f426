//! Disks (`--disk`) as a device kind: parsing the option, opening the backings (each once,
//! by descriptor), each disk a virtio-blk device on virtio-mmio
//! ([`crate::board::virtio_mmio`]: a 4 KiB window from 0xd000_0000 up, a GSI from 5 up,
//! ioeventfd doorbells, an irqfd interrupt) or, with `transport=pci`, on virtio-pci
//! ([`crate::board::virtio_pci`]: a function on the PCI root, one MSI-X vector a queue),
//! its queue workers (io_uring) started under the block worker's filter, and its entry in
//! the launch's report.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use devices::virtio::block::{BlockConfig, MAX_QUEUES, VirtioBlock};
use devices::virtio::mmio::MmioTransport;
use devices::virtio::{SharedDevice, VirtioDevice};

use crate::board::device::{Device, DeviceError, DeviceFds, DeviceReport, FilterOf, Section};
use crate::board::kind::{Attached, Board, DeviceFacts, Kind, KindError, Placed};
use crate::board::resources::{Ask, Needs, PciNeeds, Place};
use crate::config::keyvalue::{KeyValueError, KeyValues, OnOff};
use crate::sys::seccomp::{Fds, Grants, Role};

/// The disks' queue workers (`blk-q<i>`): `io_uring_enter` on the ring each made before
/// its filter (the devices' `worker::ring`, restricted to the worker's operations; no
/// `io_uring_setup` or `io_uring_register` after it, so no ring without those
/// restrictions), and `pwrite64` on the disks' descriptors ([`disk_grants`]).
pub const BLOCK_WORKER: Role = Role {
    name: "blk-worker",
    thread: "`blk-q<i>` (virtio-blk queue worker)",
    calls: crate::sys::seccomp::syscalls![io_uring_enter],
};

/// What the queue workers may call on a disk's buffered descriptor `fd`: `pwrite64` (they
/// zero ranges with it).
fn disk_grants(fd: std::os::fd::RawFd) -> Grants {
    Grants {
        pwrite: Some(Fds {
            what: "the disks' descriptors",
            fds: vec![fd],
        }),
        ..Grants::default()
    }
}

/// The disks' key in the launch's JSON report: a list, there even with no disk.
pub const SECTION: Section = Section {
    key: "disks",
    one: false,
    always: true,
};

/// The bus name and resource owner of disk `i`.
pub fn name(i: usize) -> String {
    format!("virtio-blk{i}")
}

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
    /// Its virtio-mmio window could not be wired.
    #[error("{0}")]
    Wiring(#[from] crate::board::virtio_mmio::VirtioMmioError),
}

impl DiskError {
    /// A mistake in what the user asked (exit 2): the words, too many disks, a backing
    /// that cannot be opened; not a failure to wire the window.
    pub fn is_usage(&self) -> bool {
        !matches!(self, Self::Wiring(_))
    }
}

impl From<DiskError> for KindError {
    fn from(e: DiskError) -> Self {
        let usage = e.is_usage();
        KindError::new(e, usage)
    }
}

/// A disk (`--disk`) as a kind: its request is the block device's configuration.
impl Kind for BlockConfig {
    const SECTION: Section = SECTION;
    const THREADS: &'static [Role] = &[BLOCK_WORKER];
    type Opened = VirtioBlock;

    fn written(&self) -> String {
        self.path.display().to_string()
    }

    /// A virtio-mmio window and pin, or a PCI function with a page and a vector a queue plus
    /// one, named `virtio-blk<index>`.
    fn ask(&self, index: usize, _facts: &DeviceFacts) -> Ask {
        Ask {
            owner: name(index),
            written: self.written(),
            needs: if self.pci {
                Needs::Pci(PciNeeds {
                    slot: None,
                    pages: 1,
                    vectors: u64::from(self.queues) + 1,
                    memory_slots: 0,
                    host_bars: None,
                })
            } else {
                Needs::VirtioMmio
            },
        }
    }

    /// Every backing, once, checked against the others ([`open`]).
    fn open(all: &[&Self]) -> Result<Vec<VirtioBlock>, KindError> {
        let configs: Vec<BlockConfig> = all.iter().map(|c| (*c).clone()).collect();
        Ok(open(&configs)?)
    }

    /// Its buffered descriptor, which the queue workers write.
    fn example_fds(fds: &mut DeviceFds, first: i32) {
        fds.grant(BLOCK_WORKER, disk_grants(first));
    }

    /// Each disk on the MMIO bus in its window or on the PCI root, wired through KVM; its
    /// queue workers default to the device threads' core.
    fn attach(board: &mut Board<'_>, all: Vec<Placed<Self>>) -> Result<Attached, KindError> {
        let mut out = Attached::default();
        for (i, p) in all.into_iter().enumerate() {
            let mut d = p.opened;
            d.set_default_core(board.worker_core);
            let disk_fd = std::os::fd::AsRawFd::as_raw_fd(&d.disk().file);
            let attached = match &p.place {
                Place::VirtioMmio(w) => {
                    let transport = crate::board::virtio_mmio::attach(
                        board.vm,
                        board.memory,
                        board.mmio,
                        &name(i),
                        Box::new(d),
                        w,
                        board.ioeventfd,
                    )
                    .map_err(DiskError::from)?;
                    AttachedDisk {
                        transport: DiskTransport::Mmio(transport),
                        base: w.base,
                        gsi: w.gsi,
                        disk_fd,
                    }
                }
                Place::Pci(place) => {
                    let (function, device) = crate::board::virtio_pci::attach(
                        board.vm,
                        board.memory,
                        place,
                        &name(i),
                        Box::new(d),
                        board.ioeventfd,
                    )
                    .map_err(|e| KindError::new(format!("{}: {e}", name(i)), false))?;
                    out.functions.push(function);
                    AttachedDisk {
                        transport: DiskTransport::Pci(device),
                        base: place.pages.first().copied().unwrap_or(0),
                        gsi: place.first_gsi.unwrap_or(0),
                        disk_fd,
                    }
                }
                other => {
                    return Err(KindError::new(
                        format!("{}: not placed as a disk ({other:?})", p.request.written()),
                        false,
                    ));
                }
            };
            out.devices.push(Box::new(attached));
        }
        Ok(out)
    }
}

impl From<KeyValueError> for DiskError {
    fn from(e: KeyValueError) -> Self {
        Self::Spec {
            spec: e.spec,
            why: e.why,
        }
    }
}

// Every queue count a disk may ask for fits a virtio-pci function's notification window
// and MSI-X table.
const _: () = assert!(MAX_QUEUES as usize <= devices::virtio::pci::MAX_QUEUES);

/// Parses `path=FILE[,readonly=on][,direct=on][,queues=N][,poll_us=N][,core=N][,sqpoll=on][,id=STR][,transport=mmio|pci]`.
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
    if let Some(t) = kv.get::<String>("transport")? {
        cfg.pci = match t.as_str() {
            "mmio" => false,
            "pci" => true,
            _ => return Err(err(format!("transport={t}: mmio or pci"))),
        };
    }
    kv.finish(&[
        "path",
        "readonly",
        "direct",
        "queues",
        "poll_us",
        "core",
        "sqpoll",
        "id",
        "transport",
    ])?;
    Ok(cfg)
}

/// How a disk reaches the guest, as the launch holds it.
pub enum DiskTransport {
    /// Its virtio-mmio window (on the MMIO bus too).
    Mmio(Arc<Mutex<MmioTransport>>),
    /// The device behind its virtio-pci function (the PCI root holds the function).
    Pci(SharedDevice),
}

/// A disk attached to a VM.
pub struct AttachedDisk {
    /// Its transport.
    pub transport: DiskTransport,
    /// Window base, or its function's BAR 0.
    pub base: u64,
    /// Its GSI, or its first MSI-X vector's.
    pub gsi: u32,
    /// The backing's buffered descriptor (its queue workers zero ranges through it).
    pub disk_fd: std::os::fd::RawFd,
}

/// One disk's window and its queues' counters at teardown.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DiskReport {
    /// `virtio-mmio` or `virtio-pci`.
    pub transport: &'static str,
    /// virtio-mmio window base, or the virtio-pci function's BAR 0.
    pub base: u64,
    /// Its GSI (virtio-pci: its first MSI-X vector's).
    pub gsi: u32,
    /// Each queue's counters.
    pub queues: Vec<devices::virtio::QueueCounters>,
    /// Messages the guest made the VMM log about this disk that the rate limits dropped
    /// (5 a second each for the window and the queue workers, for the VMM's whole life).
    pub log_suppressed: u64,
}

impl std::fmt::Display for DiskReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.transport {
            "virtio-pci" => write!(
                f,
                "disk on virtio-pci at {:#x} (first vector's gsi {}): ",
                self.base, self.gsi
            )?,
            _ => write!(f, "disk at {:#x} (gsi {}): ", self.base, self.gsi)?,
        }
        for (i, q) in self.queues.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{q}")?;
        }
        Ok(())
    }
}

impl Device for AttachedDisk {
    fn fds(&self, fds: &mut DeviceFds) {
        fds.grant(BLOCK_WORKER, disk_grants(self.disk_fd));
        // A PCI function: the vCPUs update KVM's routes and ioeventfds.
        if let DiskTransport::Pci(_) = self.transport {
            fds.pci = true;
        }
    }

    /// Its queue workers, each installing the block worker's filter before it serves
    /// anything.
    fn start(
        &mut self,
        filter: FilterOf<'_>,
        _worker_core: Option<usize>,
    ) -> Result<(), DeviceError> {
        let filter = filter(BLOCK_WORKER);
        let hook: devices::virtio::ThreadHook = Arc::new(move |_kind| match &filter {
            Some(f) => crate::sys::seccomp::apply(BLOCK_WORKER, f).map_err(Into::into),
            None => Ok(()),
        });
        match &mut self.transport {
            DiskTransport::Mmio(t) => t.lock().unwrap_or_else(|e| e.into_inner()).start(hook)?,
            DiskTransport::Pci(d) => d.start(hook)?,
        }
        Ok(())
    }

    /// Stops its queue workers (they write into guest memory); its queues' counters.
    fn stop(&mut self) -> DeviceReport {
        let r = match &mut self.transport {
            DiskTransport::Mmio(t) => {
                let mut t = t.lock().unwrap_or_else(|e| e.into_inner());
                t.shutdown();
                DiskReport {
                    transport: "virtio-mmio",
                    base: self.base,
                    gsi: self.gsi,
                    queues: t.device().stats(),
                    log_suppressed: t.log_suppressed(),
                }
            }
            DiskTransport::Pci(d) => {
                d.reset();
                DiskReport {
                    transport: "virtio-pci",
                    base: self.base,
                    gsi: self.gsi,
                    queues: d.stats(),
                    log_suppressed: d.log_suppressed(),
                }
            }
        };
        DeviceReport::one(SECTION, &r, r.to_string())
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_confined_block_worker_cannot_make_or_change_an_io_uring() {
        // io_uring_setup (a fresh ring without the worker's restrictions) and
        // io_uring_register (changing a ring's) end a confined worker; io_uring_enter on
        // the ring it already has is its job.
        let prog = crate::sys::seccomp::filter(BLOCK_WORKER, &Grants::default()).unwrap();
        let setup = || {
            let mut params = [0u8; 120];
            // SAFETY: io_uring_setup with a local parameter block; refused by the filter.
            unsafe { libc::syscall(libc::SYS_io_uring_setup, 8u32, params.as_mut_ptr()) };
        };
        assert_eq!(
            crate::sys::seccomp::confined_child(BLOCK_WORKER, &prog, setup),
            crate::sys::seccomp::EXIT_SECCOMP
        );
        let register = || {
            // SAFETY: io_uring_register on fd -1; refused by the filter before EBADF.
            unsafe { libc::syscall(libc::SYS_io_uring_register, -1, 0u32, 0usize, 0u32) };
        };
        assert_eq!(
            crate::sys::seccomp::confined_child(BLOCK_WORKER, &prog, register),
            crate::sys::seccomp::EXIT_SECCOMP
        );
        let enter = || {
            // SAFETY: io_uring_enter on fd -1 fails with EBADF once the filter lets it by.
            unsafe { libc::syscall(libc::SYS_io_uring_enter, -1, 0u32, 0u32, 0u32, 0usize) };
        };
        assert_eq!(
            crate::sys::seccomp::confined_child(BLOCK_WORKER, &prog, enter),
            0
        );
    }

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
        assert!(!d.pci, "virtio-mmio by default");
        assert!(parse("path=/tmp/y,transport=pci", 1).unwrap().pci);
        assert!(!parse("path=/tmp/y,transport=mmio", 1).unwrap().pci);
        // Behind virtio-pci the disk asks for a function: a page and a vector a queue + 1.
        let ask = parse("path=/tmp/y,transport=pci,queues=2", 0)
            .unwrap()
            .ask(0, &DeviceFacts::default());
        assert!(
            matches!(&ask.needs, Needs::Pci(n) if n.pages == 1 && n.vectors == 3 && n.slot.is_none()),
            "{:?}",
            ask.needs
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
            "path=/x,transport=scsi",
            "path=/x,core=4096",
            "path=/x,id=012345678901234567890",
            "path=/x,junk",
        ] {
            assert!(parse(bad, 0).is_err(), "{bad}");
        }
    }
}
