//! The kinds `--device` names, and the dispatch of a `--device` argument to the kind its
//! first word names: the one table a kind asked with `--device` adds a line to. Above the
//! kinds' files (it calls their parsers); nothing of the board imports it.

use crate::board::pci::PciError;
use crate::board::spec::DeviceSpec;
use crate::board::{engine, vfio};
use crate::config::keyvalue::{KeyValueError, KeyValues};

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
pub fn parse_device(spec: &str) -> Result<DeviceSpec, PciError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use devices::pci::submit::DoorbellMode;

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
                e.is_usage() && matches!(e, PciError::Spec { .. }),
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
