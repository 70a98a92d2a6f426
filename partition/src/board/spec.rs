//! What a launch asks of the board, of any kind: [`DeviceSpec`], the one list of the kinds
//! (each kind's request a variant, parsed in its kind's file: [`crate::board::disks`],
//! [`crate::board::engine`], [`crate::board::vfio`]). The launch request and the plan hold
//! every device as one list of them.

use devices::pci::submit::DoorbellMode;
use devices::virtio::block::BlockConfig;

/// A device a launch asks for, of any kind: the list of kinds, each request parsed and
/// placed by its kind's file (a disk by `disks`, the engine by `engine` and `pci`, a
/// passed-through function by `vfio` and `pci`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceSpec {
    /// A virtio-blk disk (`--disk`, [`crate::board::disks::parse`]).
    Disk(BlockConfig),
    /// The submission engine with this doorbell (`--device engine`, [`crate::board::engine::parse`]).
    Engine {
        /// How its doorbell page reaches it.
        doorbell: DoorbellMode,
    },
    /// A host PCI function passed through with VFIO (`--device vfio=`, [`crate::board::vfio::parse`]).
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
