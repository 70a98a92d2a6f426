//! The one list of device kinds: [`DeviceSpec`], a request of any kind, each kind one line
//! of the [`device_kinds!`] list below (its variant and its request type, which implements
//! [`Kind`] in the kind's file). From that line come the variant, the kind's `--device`
//! words ([`parse_device`]), its report section ([`sections`]), and every step the launch
//! drives all kinds through: the configuration's rules ([`DeviceSpec::conflict`]), the
//! host's facts, the plan's asks, the open step and the attach step, each kind's devices
//! handed to it together. The top floor of `board/`: it names the kinds, and no kind
//! imports it.

use std::path::Path;

use crate::board::device::{DeviceFds, Section};
use crate::board::kind::{Attached, Board, DeviceFacts, Kind, KindError, Placed};
use crate::board::resources::{Ask, Place};
use crate::config::keyvalue::{KeyValueError, KeyValues};

/// A `--device` argument no kind takes, or whose words its kind refuses.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("--device {spec:?}: {why}")]
pub struct DeviceArgError {
    /// The argument.
    pub spec: String,
    /// What is wrong.
    pub why: String,
}

impl From<KeyValueError> for DeviceArgError {
    fn from(e: KeyValueError) -> Self {
        Self {
            spec: e.spec,
            why: e.why,
        }
    }
}

/// The list of kinds: `Variant(RequestType)`, one line a kind, in the order the launch
/// attaches, stops and reports them (the disks, the engine, the passed-through functions:
/// those last, as their mappings must outlive the engine's).
macro_rules! device_kinds {
    ($($variant:ident($ty:ty)),+ $(,)?) => {
        /// A device a launch asks for, of any kind.
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub enum DeviceSpec {
            $(
                #[doc = concat!("A `", stringify!($ty), "` request.")]
                $variant($ty),
            )+
        }

        /// What the open step opened for one device, of its kind.
        pub enum Opened {
            $(
                #[doc = concat!("A `", stringify!($ty), "`'s.")]
                $variant(<$ty as Kind>::Opened),
            )+
        }

        /// The descriptors a machine with a device of every kind gives the seccomp filters,
        /// placeholders from 6 up (docs/security.md's table).
        pub fn example_fds() -> DeviceFds {
            let mut fds = DeviceFds::default();
            let mut next = 6;
            $(
                <$ty as Kind>::example_fds(&mut fds, next);
                next += 4;
            )+
            let _ = next;
            fds
        }

        /// Each kind's key in the launch's JSON report, in the order the report lists them.
        pub fn sections() -> Vec<Section> {
            vec![$(<$ty as Kind>::SECTION),+]
        }

        /// The kinds `--device` names: (word, form, parser).
        type ParseKind = fn(KeyValues<'_>) -> Result<DeviceSpec, KeyValueError>;
        fn device_forms() -> Vec<(&'static str, &'static str, ParseKind)> {
            let mut v: Vec<(&'static str, &'static str, ParseKind)> = Vec::new();
            $(
                if let Some((word, form)) = <$ty as Kind>::DEVICE_FORM {
                    v.push((word, form, |kv| <$ty as Kind>::parse(kv).map(DeviceSpec::$variant)));
                }
            )+
            v
        }

        #[allow(unreachable_patterns)]
        impl DeviceSpec {
            /// As a user writes it after its option (`--disk PATH...`, `--device ...`).
            pub fn written(&self) -> String {
                match self {
                    $(Self::$variant(r) => r.written(),)+
                }
            }

            /// Why `self` cannot join the devices `asked` before it.
            pub fn conflict(&self, asked: &[DeviceSpec]) -> Option<String> {
                match self {
                    $(Self::$variant(r) => {
                        let earlier: Vec<&$ty> = asked
                            .iter()
                            .filter_map(|a| match a {
                                Self::$variant(x) => Some(x),
                                _ => None,
                            })
                            .collect();
                        r.conflict(&earlier)
                    })+
                }
            }

            /// What the host under `root` has for it (refused: why it cannot serve it).
            pub fn facts(&self, root: &Path) -> Result<DeviceFacts, KindError> {
                match self {
                    $(Self::$variant(r) => r.facts(root),)+
                }
            }

            /// What each of `devices` takes from the board, with its facts (`facts[i]`).
            pub fn asks(devices: &[DeviceSpec], facts: &[DeviceFacts]) -> Vec<Ask> {
                let none = DeviceFacts::default();
                devices
                    .iter()
                    .enumerate()
                    .map(|(i, d)| {
                        let f = facts.get(i).unwrap_or(&none);
                        let index = devices[..i]
                            .iter()
                            .filter(|e| std::mem::discriminant(*e) == std::mem::discriminant(d))
                            .count();
                        match d {
                            $(Self::$variant(r) => r.ask(index, f),)+
                        }
                    })
                    .collect()
            }

            /// Opens what `devices` name, each kind's together: one [`Opened`] a device.
            pub fn open_all(devices: &[DeviceSpec]) -> Result<Vec<Opened>, KindError> {
                let mut out: Vec<Option<Opened>> = devices.iter().map(|_| None).collect();
                $(
                    let idx: Vec<usize> = devices
                        .iter()
                        .enumerate()
                        .filter(|(_, d)| matches!(d, Self::$variant(_)))
                        .map(|(i, _)| i)
                        .collect();
                    let group: Vec<&$ty> = idx
                        .iter()
                        .filter_map(|i| match &devices[*i] {
                            Self::$variant(r) => Some(r),
                            _ => None,
                        })
                        .collect();
                    if !group.is_empty() {
                        let opened = <$ty as Kind>::open(&group)?;
                        if opened.len() != idx.len() {
                            return Err(KindError::new(
                                format!("{}: opened {} of {}", stringify!($ty), opened.len(), idx.len()),
                                false,
                            ));
                        }
                        for (i, o) in idx.into_iter().zip(opened) {
                            out[i] = Some(Opened::$variant(o));
                        }
                    }
                )+
                Ok(out.into_iter().flatten().collect())
            }

            /// Attaches `devices`, each at `places[i]` with `opened[i]`, each kind's together,
            /// in the list's order of kinds.
            pub fn attach_all(
                board: &mut Board<'_>,
                devices: &[DeviceSpec],
                places: &[Place],
                opened: Vec<Opened>,
            ) -> Result<Vec<Attached>, KindError> {
                if places.len() != devices.len() || opened.len() != devices.len() {
                    return Err(KindError::new(
                        format!(
                            "{} devices, {} places, {} opened",
                            devices.len(),
                            places.len(),
                            opened.len()
                        ),
                        false,
                    ));
                }
                let mut items: Vec<Option<(&DeviceSpec, &Place, Opened)>> = devices
                    .iter()
                    .zip(places)
                    .zip(opened)
                    .map(|((d, p), o)| Some((d, p, o)))
                    .collect();
                let mut out = Vec::new();
                $(
                    let mut group: Vec<Placed<$ty>> = Vec::new();
                    for slot in items.iter_mut() {
                        if let Some((Self::$variant(_), _, Opened::$variant(_))) = slot {
                            if let Some((Self::$variant(r), p, Opened::$variant(o))) = slot.take() {
                                group.push(Placed {
                                    request: r.clone(),
                                    place: p.clone(),
                                    opened: o,
                                });
                            }
                        }
                    }
                    if !group.is_empty() {
                        out.push(<$ty as Kind>::attach(board, group)?);
                    }
                )+
                if items.iter().any(Option::is_some) {
                    return Err(KindError::new("a device's opened part is of another kind", false));
                }
                Ok(out)
            }
        }
    };
}

device_kinds! {
    Disk(devices::virtio::block::BlockConfig),
    Engine(crate::board::engine::Engine),
    Vfio(crate::board::vfio::Function),
}

impl std::fmt::Display for DeviceSpec {
    /// As a user writes it after its option (`--disk PATH...`, `--device ...`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.written())
    }
}

/// A `--device` argument: the kind its first word names, parsed by that kind (the words
/// only; what the host must offer is asked with its facts).
pub fn parse_device(spec: &str) -> Result<DeviceSpec, DeviceArgError> {
    let kv = KeyValues::parse_with_kind(spec)?;
    let named = |word: &str| match kv.head() {
        Some(h) => h == word,
        None => spec
            .strip_prefix(word)
            .is_some_and(|rest| rest.starts_with('=')),
    };
    let forms = device_forms();
    match forms.iter().find(|(word, _, _)| named(word)) {
        Some((_, _, parse)) => Ok(parse(kv)?),
        None => {
            let all: Vec<&str> = forms.iter().map(|(_, form, _)| *form).collect();
            Err(kv
                .error(format!(
                    "{:?} is not a device: {}",
                    kv.head().unwrap_or(spec),
                    all.join(" or ")
                ))
                .into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::board::engine::Engine;
    use crate::board::vfio::Function;
    use devices::pci::submit::DoorbellMode;

    #[test]
    fn each_device_kind_parses_its_own_words() {
        assert_eq!(
            parse_device("engine").unwrap(),
            DeviceSpec::Engine(Engine {
                doorbell: DoorbellMode::Mapped
            })
        );
        for (s, m) in [
            ("engine,doorbell=trap", DoorbellMode::Trap),
            ("engine,doorbell=ioeventfd", DoorbellMode::Ioeventfd),
            ("engine,doorbell=mapped", DoorbellMode::Mapped),
        ] {
            assert_eq!(
                parse_device(s).unwrap(),
                DeviceSpec::Engine(Engine { doorbell: m })
            );
        }
        // The words alone: whether this host can pass it through is not parsing's question.
        assert_eq!(
            parse_device("vfio=0000:41:00.0").unwrap(),
            DeviceSpec::Vfio(Function {
                bdf: "0000:41:00.0".into()
            })
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
            assert_eq!(e.spec, bad, "{bad:?}: {e}");
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

    #[test]
    fn a_function_the_host_cannot_take_is_refused_and_two_that_clash_are_named() {
        // The host's answer, from a made-up root with no VFIO: refused, naming the request.
        let root = std::env::temp_dir().join(format!("spec-refusal-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        let vfio = |b: &str| DeviceSpec::Vfio(Function { bdf: b.into() });
        let e = vfio("0000:41:00.0").facts(&root).unwrap_err();
        assert!(e.is_usage(), "{e}");
        assert!(
            e.to_string().contains("--device \"vfio=0000:41:00.0\"")
                && e.to_string().contains("no /dev/vfio/vfio"),
            "{e}"
        );
        let engine = |d| DeviceSpec::Engine(Engine { doorbell: d });
        let mapped = engine(DoorbellMode::Mapped);
        assert_eq!(mapped.facts(&root).unwrap(), DeviceFacts::default());
        std::fs::remove_dir_all(&root).unwrap();
        let why = engine(DoorbellMode::Trap).conflict(std::slice::from_ref(&mapped));
        assert!(why.is_some_and(|w| w.contains("one submission engine")));
        let disk = DeviceSpec::Disk(devices::virtio::block::BlockConfig::new(
            "/d".into(),
            "d".into(),
        ));
        let asked = [mapped, vfio("0000:41:00.0"), disk.clone()];
        assert_eq!(vfio("0000:42:00.0").conflict(&asked), None);
        assert_eq!(disk.conflict(&asked), None);
        let why = vfio("0000:41:00.0").conflict(&asked);
        assert!(why.is_some_and(|w| w.contains("0000:41:00.0 is asked for twice")));
    }

    #[test]
    fn each_kind_asks_the_board_for_its_place_in_the_order_asked() {
        let disk = |p: &str| {
            DeviceSpec::Disk(devices::virtio::block::BlockConfig::new(p.into(), p.into()))
        };
        let devices = [
            disk("/a"),
            DeviceSpec::Vfio(Function {
                bdf: "0000:41:00.0".into(),
            }),
            DeviceSpec::Engine(Engine {
                doorbell: DoorbellMode::Trap,
            }),
            disk("/b"),
        ];
        let facts = [
            DeviceFacts::default(),
            DeviceFacts {
                bars: Some(Vec::new()),
            },
        ];
        let asks = DeviceSpec::asks(&devices, &facts);
        let owners: Vec<&str> = asks.iter().map(|a| a.owner.as_str()).collect();
        assert_eq!(
            owners,
            [
                "virtio-blk0",
                "the passed-through function 0000:41:00.0",
                "the submission engine",
                "virtio-blk1"
            ]
        );
        assert_eq!(asks[3].written, "/b");
        assert_eq!(
            (&asks[0].needs, &asks[3].needs),
            (
                &crate::board::resources::Needs::VirtioMmio,
                &crate::board::resources::Needs::VirtioMmio
            )
        );
        // Each kind's report section, in the list's order.
        let keys: Vec<&str> = sections().iter().map(|s| s.key).collect();
        assert_eq!(keys, ["disks", "engine", "passthrough"]);
    }
}
