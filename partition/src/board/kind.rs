//! A device kind as the generic code drives it: [`Kind`], implemented in each kind's own
//! file by the kind's request type (a disk's `BlockConfig`, [`crate::board::engine::Engine`],
//! [`crate::board::vfio::Function`]), and what the launch's steps hand a kind and get back:
//! the host's facts it needs ([`DeviceFacts`]), what it takes from the board (an [`Ask`],
//! placed by [`crate::board::resources::MachinePlan`] as a [`Place`]), what it opened before guest
//! memory was taken (`Kind::Opened`), and its attach step ([`Board`] in, [`Attached`] out).
//! The one list of kinds is [`crate::board::spec`]'s; nothing else names a kind.

use std::path::Path;
use std::sync::Arc;

use devices::Bus;
use devices::pci::passthrough::PhysicalBar;

use crate::board::device::{Device, DeviceFds, GuestOutput, PciAttachment, Section};
use crate::board::resources::{Ask, Place, Resources};
use crate::config::keyvalue::{KeyValueError, KeyValues};
use crate::kvm::Vm;
use crate::memory::GuestMemory;
use crate::sys::seccomp::Role;

/// A kind's failure at any step, with whether it is the user's mistake (exit 2) or the
/// host's.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct KindError {
    error: Box<dyn std::error::Error + Send + Sync>,
    usage: bool,
}

impl KindError {
    /// `error`, a mistake in what the user asked when `usage`.
    pub fn new(error: impl Into<Box<dyn std::error::Error + Send + Sync>>, usage: bool) -> Self {
        Self {
            error: error.into(),
            usage,
        }
    }

    /// A mistake in what the user asked (exit 2), not a failure of the host.
    pub fn is_usage(&self) -> bool {
        self.usage
    }
}

/// What the host has for one device, read with the launch's host facts (a passed-through
/// function's BARs, from sysfs); empty for a kind that needs nothing of the host.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceFacts {
    /// A host function's BARs.
    pub bars: Option<Vec<PhysicalBar>>,
}

/// What a kind's attach step builds on: the VM, guest memory, the MMIO bus, the pools
/// (for what is taken at attach), the partition's cores and the device threads' core.
pub struct Board<'a> {
    /// The VM.
    pub vm: &'a Arc<Vm>,
    /// Guest memory.
    pub memory: &'a Arc<GuestMemory>,
    /// The MMIO bus (virtio-mmio windows go here; PCI functions go on the root).
    pub mmio: &'a mut Bus,
    /// The port bus (a legacy device at its ISA ports: the console's COM1).
    pub pio: &'a mut Bus,
    /// Where a device carrying the guest's text output tells the launch of it.
    pub output: &'a GuestOutput,
    /// The plan's pools, for GSIs and memory slots taken at attach.
    pub resources: &'a mut Resources,
    /// The partition's cores (a passed-through function's interrupts are steered there).
    pub cores: &'a [usize],
    /// The core device threads run on, when one is free of vCPUs.
    pub worker_core: Option<usize>,
    /// Doorbells through ioeventfd (off: `--no-ioeventfd`).
    pub ioeventfd: bool,
}

/// One device of a kind, as its attach step gets it: the request, where the plan put it,
/// and what was opened for it.
pub struct Placed<K: Kind> {
    /// The request.
    pub request: K,
    /// Its place.
    pub place: Place,
    /// What the open step opened for it.
    pub opened: K::Opened,
}

/// What a kind's attach step hands back: the devices the launch keeps (started, stopped
/// and reported in this order) and the functions for the PCI root.
#[derive(Default)]
pub struct Attached {
    /// The devices.
    pub devices: Vec<Box<dyn Device>>,
    /// Its PCI functions, each with its slot, vectors and BAR bindings.
    pub functions: Vec<PciAttachment>,
}

/// A device kind: everything of it the launch's generic steps ask, each implemented in the
/// kind's file (docs/architecture.md, "Adding a device kind").
pub trait Kind: Sized + Clone + std::fmt::Debug + PartialEq + Eq {
    /// Its key in the launch's JSON report.
    const SECTION: Section;
    /// With `--device`: the word a request of the kind starts with (`KIND[,...]`, or
    /// `KIND=VALUE`) and how it is written, for the refusal of an unknown kind; None: the
    /// kind is asked another way (`--disk`).
    const DEVICE_FORM: Option<(&'static str, &'static str)> = None;
    /// The roles of the threads a device of the kind starts, each with the system calls
    /// it makes beyond the common set: the launch compiles each one's filter (tied to the
    /// descriptors the kind's devices grant it in [`Device::fds`]) and docs/security.md's
    /// table lists it.
    const THREADS: &'static [Role] = &[];
    /// What the open step opens for a device of the kind (a disk's backing).
    type Opened: Send;

    /// The request of the kind the board has when the launch asks for none (the console:
    /// COM1 on stdout); None: a launch may have none.
    fn implied() -> Option<Self> {
        None
    }

    /// A `--device` argument's words, the kind's word first (only kinds with a
    /// [`Kind::DEVICE_FORM`] are handed one).
    fn parse(kv: KeyValues<'_>) -> Result<Self, KeyValueError> {
        Err(kv.error("not a --device kind".into()))
    }

    /// The request as the user writes it after its option.
    fn written(&self) -> String;

    /// Why the request cannot join `earlier` ones of its kind (a second engine, a
    /// function asked for twice).
    fn conflict(&self, earlier: &[&Self]) -> Option<String> {
        let _ = earlier;
        None
    }

    /// What the host under `root` (normally `/`) has for it, read-only; a request the host
    /// cannot serve is refused here, naming why.
    fn facts(&self, root: &Path) -> Result<DeviceFacts, KindError> {
        let _ = root;
        Ok(DeviceFacts::default())
    }

    /// What it takes from the board; `index` is its place among the requests of its kind.
    fn ask(&self, index: usize, facts: &DeviceFacts) -> Ask;

    /// Opens what the kind's requests name, all together (so they are checked against each
    /// other), before guest memory is taken: one `Opened` a request, in order.
    fn open(all: &[&Self]) -> Result<Vec<Self::Opened>, KindError>;

    /// Attaches every device of the kind, each where it was placed.
    fn attach(board: &mut Board<'_>, all: Vec<Placed<Self>>) -> Result<Attached, KindError>;

    /// What a device of the kind adds to the descriptors the seccomp filters name
    /// ([`Device::fds`]), with placeholder descriptors (`first`, `first + 1`...): how
    /// docs/security.md's table shows every condition a kind brings.
    fn example_fds(fds: &mut DeviceFds, first: i32) {
        let _ = (fds, first);
    }
}
