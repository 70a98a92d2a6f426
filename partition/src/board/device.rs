//! What a launch does with an attached device, whatever its kind: the descriptors its
//! threads and the vCPUs' calls name (what the seccomp filters tie them to), starting its
//! threads under their filters, the step once the guest has stopped, and stopping it with
//! its entry of the launch's report. Each kind implements [`Device`] in its own file
//! ([`crate::board::disks`], [`crate::board::engine`], [`crate::board::vfio`]); the launch
//! pipeline holds them as one list and names no kind (docs/architecture.md, "Adding a
//! device kind").

use std::os::fd::RawFd;
use std::sync::Arc;

use vmm_sys_util::eventfd::EventFd;

use crate::kvm::{Vm, VmError};
use crate::sys::seccomp::{Grants, Role};

/// The descriptors the devices' threads and the vCPUs' calls name, gathered from every
/// device ([`Device::fds`]); the seccomp filters allow those calls on these alone.
#[derive(Clone, Debug, Default)]
pub struct DeviceFds {
    /// A PCI function exists: a vCPU taking a guest's configuration write updates KVM's
    /// memory slots, routes and ioeventfds.
    pub pci: bool,
    /// Host interrupt counters the launcher reads (a passed-through function's).
    pub irq_counts: Vec<RawFd>,
    /// Descriptors whose regions the vCPU threads read and write (`pread64`/`pwrite64`:
    /// a passed-through function's trapped BAR parts and configuration space).
    pub vcpu_regions: Vec<RawFd>,
    /// What a kind's own thread roles may call on its descriptors (`Kind::THREADS`: the
    /// queue workers' `pwrite64` on the disks, the `vfio-return` thread's ioctls on the
    /// VFIO devices and their container).
    pub roles: Vec<(Role, Grants)>,
}

impl DeviceFds {
    /// `role` may also make `grants`' calls.
    pub fn grant(&mut self, role: Role, grants: Grants) {
        self.roles.push((role, grants));
    }

    /// Everything the devices granted `role`, together.
    pub fn granted(&self, role: Role) -> Grants {
        let mut g = Grants::default();
        for (_, more) in self.roles.iter().filter(|(r, _)| *r == role) {
            g.merge(more);
        }
        g
    }
}

/// What the guest's text output tells the launch, whichever device carries it (the
/// console's COM1): when its first byte went by (the launch's "first output") and how many
/// of its lines reported a fault. The launch makes it before the devices are attached and
/// reads it as the guest runs and at the end.
#[derive(Clone, Debug, Default)]
pub struct GuestOutput {
    /// When the guest's first byte of output went by.
    pub first_byte: Arc<std::sync::OnceLock<crate::sys::timeline::Stamp>>,
    /// Lines that reported a process killed by a fatal signal or a kernel Oops.
    pub fault_lines: Arc<std::sync::atomic::AtomicU64>,
}

/// The compiled filter of a thread role, when the launch is confined (`None`: it is not,
/// and threads run unfiltered).
pub type FilterOf<'a> = &'a dyn Fn(Role) -> Option<Arc<seccompiler::BpfProgram>>;

/// Where a kind's entries go in the launch's JSON report (`launch --json`): under `key`,
/// as one object (`one`: at most one device of the kind) or a list; `always`: the key is
/// there even with no device of the kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Section {
    /// The report's key.
    pub key: &'static str,
    /// At most one device of the kind: its entry is an object, not a list.
    pub one: bool,
    /// The key is written with no device of the kind (an empty list).
    pub always: bool,
}

/// A device's entry in the launch's report: its kind's section, what goes there, and the
/// sentence the launch prints for it when it ends (`launch` without `--json`).
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceReport {
    /// Its kind's section.
    pub section: Section,
    /// The entries (a passed-through set has one per function).
    pub entries: Vec<serde_json::Value>,
    /// What the launch says of it.
    pub sentences: Vec<String>,
}

impl DeviceReport {
    /// `entry` (serialized) with `sentence`, in `section`.
    pub fn one(section: Section, entry: &impl serde::Serialize, sentence: String) -> Self {
        Self {
            section,
            entries: vec![serde_json::to_value(entry).unwrap_or_default()],
            sentences: vec![sentence],
        }
    }
}

/// The report's device keys, from every device's entry: each of `sections` (the kinds, in
/// the order the report lists them) under its key.
pub fn sections(
    sections: &[Section],
    reports: &[DeviceReport],
) -> serde_json::Map<String, serde_json::Value> {
    let mut out = serde_json::Map::new();
    for s in sections {
        let entries: Vec<serde_json::Value> = reports
            .iter()
            .filter(|r| r.section == *s)
            .flat_map(|r| r.entries.iter().cloned())
            .collect();
        match (s.one, entries.is_empty()) {
            (_, true) if !s.always => {}
            (true, false) => {
                out.insert(s.key.into(), entries.into_iter().next().unwrap_or_default());
            }
            _ => {
                out.insert(s.key.into(), serde_json::Value::Array(entries));
            }
        }
    }
    out
}

/// Why a device's thread did not start.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// A virtio device's queue threads.
    #[error("starting the disk's queue threads: {0}")]
    Virtio(#[from] devices::virtio::DeviceError),
    /// A thread of the device's own.
    #[error("starting {what}: {source}")]
    Thread {
        /// Which thread.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
}

/// An attached device of any kind, as the launch drives it.
pub trait Device: Send {
    /// Adds the descriptors its threads and the vCPUs' calls on it name.
    fn fds(&self, fds: &mut DeviceFds);

    /// Starts its threads (the VMM has given up root), each installing its role's filter
    /// (`filter`) before it serves anything; `worker_core` is the core device threads run
    /// on when one is free of vCPUs.
    fn start(
        &mut self,
        filter: FilterOf<'_>,
        worker_core: Option<usize>,
    ) -> Result<(), DeviceError> {
        let _ = (filter, worker_core);
        Ok(())
    }

    /// Every vCPU has stopped; runs before any device is stopped (a passed-through function
    /// reads its interrupt counts and is quieted here, so its DMA ends first).
    fn guest_stopped(&mut self) {}

    /// Stops its threads (they write into guest memory: before it goes) and says what it
    /// did.
    fn stop(&mut self) -> DeviceReport;
}

/// Every device's descriptors.
pub fn fds_of(list: &[Box<dyn Device>]) -> DeviceFds {
    let mut fds = DeviceFds::default();
    for d in list {
        d.fds(&mut fds);
    }
    fds
}

/// What follows a PCI function's BAR when the guest moves it (a memory slot, an
/// ioeventfd): the PCI root calls it with the BAR's old and new guest address.
pub trait BarBinding: Send {
    /// The BAR left `old` (if it was placed) and is now at `new` (if it is placed).
    fn moved(&self, vm: &Vm, old: Option<u64>, new: Option<u64>) -> Result<(), VmError>;
}

/// A PCI function as a kind hands it to the PCI root (`crate::board::pci`): its slot, the
/// function, each MSI-X vector's GSI and irqfd (vector order), and what follows its BARs.
pub struct PciAttachment {
    /// Its slot on bus 0.
    pub slot: u8,
    /// The function.
    pub function: Box<dyn devices::pci::PciFunction>,
    /// Each vector's GSI and line.
    pub vectors: Vec<(u32, Arc<EventFd>)>,
    /// (BAR index, what follows it).
    pub bindings: Vec<(usize, Box<dyn BarBinding>)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAKES: Section = Section {
        key: "fakes",
        one: false,
        always: true,
    };
    const SOLO: Section = Section {
        key: "solo",
        one: true,
        always: false,
    };

    /// The fakes' thread role.
    const FAKE_THREAD: Role = Role {
        name: "fake",
        thread: "`fake`",
        calls: &[],
    };

    /// What a fake grants its role on `fd`.
    fn fake_grants(fd: RawFd) -> Grants {
        Grants {
            pwrite: Some(crate::sys::seccomp::Fds {
                what: "the fakes' descriptors",
                fds: vec![fd],
            }),
            ..Grants::default()
        }
    }

    /// A device that records what the launch did with it.
    struct Fake {
        fd: RawFd,
        log: Arc<std::sync::Mutex<Vec<String>>>,
    }

    impl Device for Fake {
        fn fds(&self, fds: &mut DeviceFds) {
            fds.grant(FAKE_THREAD, fake_grants(self.fd));
        }
        fn start(&mut self, filter: FilterOf<'_>, core: Option<usize>) -> Result<(), DeviceError> {
            let confined = filter(FAKE_THREAD).is_some();
            self.log
                .lock()
                .unwrap()
                .push(format!("start {} {confined} {core:?}", self.fd));
            Ok(())
        }
        fn guest_stopped(&mut self) {
            self.log
                .lock()
                .unwrap()
                .push(format!("stopped {}", self.fd));
        }
        fn stop(&mut self) -> DeviceReport {
            self.log.lock().unwrap().push(format!("stop {}", self.fd));
            DeviceReport::one(FAKES, &self.fd, format!("fake {}", self.fd))
        }
    }

    #[test]
    fn every_device_gives_its_descriptors_and_its_report_in_order() {
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut list: Vec<Box<dyn Device>> = [7, 9]
            .into_iter()
            .map(|fd| {
                Box::new(Fake {
                    fd,
                    log: log.clone(),
                }) as Box<dyn Device>
            })
            .collect();
        // Both fakes' descriptors, granted to their role together; none to another role.
        let fds = fds_of(&list);
        assert_eq!(fds.granted(FAKE_THREAD).pwrite.unwrap().fds, vec![7, 9]);
        assert!(fds.granted(Role::MAIN).pwrite.is_none());
        for d in &mut list {
            d.start(&|_| None, Some(3)).unwrap();
        }
        for d in &mut list {
            d.guest_stopped();
        }
        let reports: Vec<DeviceReport> = list.iter_mut().map(|d| d.stop()).collect();
        assert_eq!(
            *log.lock().unwrap(),
            [
                "start 7 false Some(3)",
                "start 9 false Some(3)",
                "stopped 7",
                "stopped 9",
                "stop 7",
                "stop 9"
            ]
        );
        let json = serde_json::Value::Object(sections(&[FAKES, SOLO], &reports));
        assert_eq!(json, serde_json::json!({"fakes": [7, 9]}));
        let solo = DeviceReport::one(SOLO, &"x", String::new());
        let json = serde_json::Value::Object(sections(&[FAKES, SOLO], &[solo]));
        assert_eq!(json, serde_json::json!({"fakes": [], "solo": "x"}));
    }
}
