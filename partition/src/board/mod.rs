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

use crate::config::keyvalue::{KeyValueError, KeyValues};

/// A device a launch asks for, of any kind: the list of kinds, each request parsed and
/// placed by its kind's file (a disk by [`disks`], the engine by [`engine`] and [`pci`], a
/// passed-through function by [`vfio`] and [`pci`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceSpec {
    /// A virtio-blk disk (`--disk`, [`disks::parse`]).
    Disk(BlockConfig),
    /// The submission engine with this doorbell (`--device engine`, [`engine::parse`]).
    Engine {
        /// How its doorbell page reaches it.
        doorbell: DoorbellMode,
    },
    /// A host PCI function passed through with VFIO (`--device vfio=`, [`vfio::parse`]).
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

/// The kinds `--device` names: the word that starts a request of the kind (`KIND[,...]`,
/// or `KIND=VALUE` for a kind whose request is one value), how it is written, and the
/// kind's parser of its words (in the kind's file). A new kind asked with `--device` adds
/// a line here.
type ParseKind = fn(KeyValues<'_>) -> Result<DeviceSpec, KeyValueError>;
const DEVICE_KINDS: [(&str, &str, ParseKind); 2] = [
    (
        "engine",
        "engine[,doorbell=trap|ioeventfd|mapped]",
        engine::parse,
    ),
    ("vfio", "vfio=DDDD:BB:DD.F", vfio::parse),
];

/// A `--device` argument: the kind it names, parsed by that kind (the words only; what the
/// host must offer is asked with its facts).
pub fn parse_device(spec: &str) -> Result<DeviceSpec, pci::PciError> {
    let kv = KeyValues::parse_with_kind(spec)?;
    let named = |word: &str| match kv.head() {
        Some(h) => h == word,
        None => spec
            .strip_prefix(word)
            .is_some_and(|rest| rest.starts_with('=')),
    };
    match DEVICE_KINDS.iter().find(|(word, _, _)| named(word)) {
        Some((_, _, parse)) => Ok(parse(kv)?),
        None => {
            let forms: Vec<&str> = DEVICE_KINDS.iter().map(|(_, form, _)| *form).collect();
            Err(kv
                .error(format!(
                    "{:?} is not a device: {}",
                    kv.head().unwrap_or(spec),
                    forms.join(" or ")
                ))
                .into())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_device_kind_parses_its_own_words() {
        assert_eq!(
            parse_device("engine").unwrap(),
            DeviceSpec::Engine {
                doorbell: DoorbellMode::Mapped
            }
        );
        for (s, m) in [
            ("engine,doorbell=trap", DoorbellMode::Trap),
            ("engine,doorbell=ioeventfd", DoorbellMode::Ioeventfd),
            ("engine,doorbell=mapped", DoorbellMode::Mapped),
        ] {
            assert_eq!(parse_device(s).unwrap(), DeviceSpec::Engine { doorbell: m });
        }
        // The words alone: whether this host can pass it through is not parsing's question.
        assert_eq!(
            parse_device("vfio=0000:41:00.0").unwrap(),
            DeviceSpec::Vfio {
                bdf: "0000:41:00.0".into()
            }
        );
        for bad in [
            "",
            "gpu",
            "vfiox=0000:41:00.0",
            "engine=1",
            "engine,doorbell=fast",
            "engine,queues=2",
            "engine,doorbell",
            "engine,doorbell=trap,doorbell=mapped",
            "vfio",
            "vfio=",
            "vfio=41:00.0",
            "vfio=0000:41:00.8",
            "vfio=0000:41:20.0",
            "vfio=0000:4g:00.0",
            "vfio=0000:41:00.0:1",
            "vfio=0000:41:00.0,engine=1",
        ] {
            let e = parse_device(bad).unwrap_err();
            assert!(
                e.is_usage() && matches!(e, pci::PciError::Spec { .. }),
                "{bad:?}: {e}"
            );
        }
        // An unknown kind is told every form there is.
        let e = parse_device("gpu").unwrap_err().to_string();
        assert!(
            e.contains("engine[,doorbell=trap|ioeventfd|mapped]")
                && e.contains("vfio=DDDD:BB:DD.F"),
            "{e}"
        );
        // Each request reads back as it is written after --device.
        for s in ["engine,doorbell=trap", "vfio=0000:41:00.0"] {
            assert_eq!(parse_device(s).unwrap().to_string(), s);
        }
    }
}
