//! The board a launch builds its machine on: where every device goes and how each kind is
//! wired to KVM, apart from the pipeline that decides when ([`crate::machine`]). Nothing
//! here imports the pipeline (`partition/tests/module_graph.rs` keeps that so).
//!
//! - [`resources`]: the one allocator of interrupt lines, MMIO and port ranges, PCI slots
//!   and memory slots, and the machine plan made from it before anything is opened.
//! - [`device`]: what the launch does with an attached device of any kind (its
//!   descriptors for the filters, its threads, its report entry).
//! - The kinds, a file each: [`disks`] (`--disk`: virtio-blk on [`virtio_mmio`], served by
//!   the io_uring worker), [`engine`] (`--device engine`), [`vfio`] (`--device vfio=`: a
//!   host PCI function given to the partition); the PCI ones on the root in [`pci`].
//! - [`console`]: the guest's serial output, capped, watched for fault lines, its first
//!   byte stamped.
//! - [`DeviceSpec`]: the one list of the kinds a launch request can ask for, each kind's
//!   request a variant (`LaunchConfig::devices` holds them in the order asked).

pub mod console;
pub mod device;
pub mod disks;
pub mod engine;
pub mod pci;
pub mod resources;
pub mod vfio;
pub mod virtio_mmio;

use devices::pci::submit::DoorbellMode;
use devices::virtio::block::BlockConfig;

/// A device a launch asks for, of any kind: the list of kinds, each request parsed and
/// placed by its kind's file (a disk by [`disks`], the engine by [`engine`] and [`pci`], a
/// passed-through function by [`vfio`] and [`pci`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceSpec {
    /// A virtio-blk disk (`--disk`, [`disks::parse`]).
    Disk(BlockConfig),
    /// The submission engine with this doorbell (`--device engine`, [`pci::parse`]).
    Engine {
        /// How its doorbell page reaches it.
        doorbell: DoorbellMode,
    },
    /// A host PCI function passed through with VFIO (`--device vfio=`, [`pci::parse`]).
    Vfio {
        /// Its address, DDDD:BB:DD.F.
        bdf: String,
    },
}

impl DeviceSpec {
    /// A function on the PCI root (the engine, a passed-through function), not a
    /// virtio-mmio device.
    pub fn is_pci(&self) -> bool {
        !matches!(self, Self::Disk(_))
    }

    /// A disk's configuration.
    pub fn disk(&self) -> Option<&BlockConfig> {
        match self {
            Self::Disk(c) => Some(c),
            _ => None,
        }
    }

    /// A passed-through function's address.
    pub fn vfio(&self) -> Option<&str> {
        match self {
            Self::Vfio { bdf } => Some(bdf),
            _ => None,
        }
    }
}

impl std::fmt::Display for DeviceSpec {
    /// As a user writes it after its option (`--disk PATH...`, `--device ...`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Disk(c) => write!(f, "{}", c.path.display()),
            Self::Engine { doorbell } => write!(f, "engine,doorbell={}", doorbell.name()),
            Self::Vfio { bdf } => write!(f, "vfio={bdf}"),
        }
    }
}
