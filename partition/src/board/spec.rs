//! The one list of device kinds: [`DeviceSpec`], a request of any kind, each kind one line
//! of the `device_kinds!` list below (its variant and its request type, which implements
//! [`Kind`] in the kind's file). From that line come the variant and one visit of the kind
//! ([`each_kind`]), through which every step drives all kinds: the `--device` words
//! ([`parse_device`]), the report's sections ([`sections`]), the configuration's rules
//! ([`DeviceSpec::conflict`]), the host's facts, the plan's asks, the open step and the
//! attach step, each kind's devices handed to it together. The top floor of `board/`: it
//! names the kinds, and no kind imports it.

use std::path::Path;

use crate::board::device::{DeviceFds, Section};
use crate::board::kind::{Attached, Board, DeviceFacts, Kind, KindError, Placed};
use crate::board::resources::{Ask, Place};
use crate::config::keyvalue::{KeyValueError, KeyValues};
use crate::sys::seccomp::Role;

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

/// One kind of the list, as [`each_kind`] hands it to a [`Visit`]: how to find a request
/// of it among any, and how its opened parts go in and out of [`Opened`].
pub struct KindOf<K: Kind> {
    /// A request of this kind, if `d` is one.
    pub pick: fn(&DeviceSpec) -> Option<&K>,
    /// A request of it as a [`DeviceSpec`].
    pub spec: fn(K) -> DeviceSpec,
    /// What was opened for one of its devices, as any kind's.
    pub wrap: fn(K::Opened) -> Opened,
    /// Back out (None: it is another kind's).
    pub unwrap: fn(Opened) -> Option<K::Opened>,
}

/// Something done with each kind of the list in turn ([`each_kind`]).
pub trait Visit {
    /// Does it with kind `K`.
    fn kind<K: Kind>(&mut self, of: KindOf<K>) -> Result<(), KindError>;
}

/// The list of kinds: `Variant(RequestType)`, one line a kind, in the order the launch
/// attaches, stops and reports them (the disks, the engine, the passed-through functions,
/// whose mappings must outlive the engine's, and the console, flushed once every other
/// device has stopped).
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

        impl DeviceSpec {
            /// The request, as any kind's.
            fn request(&self) -> &dyn Request {
                match self {
                    $(Self::$variant(r) => r,)+
                }
            }
        }

        /// Hands each kind of the list to `v`, in the list's order.
        #[allow(unreachable_patterns)]
        pub fn each_kind(v: &mut impl Visit) -> Result<(), KindError> {
            $(
                v.kind::<$ty>(KindOf {
                    pick: |d| match d {
                        DeviceSpec::$variant(r) => Some(r),
                        _ => None,
                    },
                    spec: DeviceSpec::$variant,
                    wrap: Opened::$variant,
                    unwrap: |o| match o {
                        Opened::$variant(x) => Some(x),
                        _ => None,
                    },
                })?;
            )+
            Ok(())
        }
    };
}

device_kinds! {
    Disk(devices::virtio::block::BlockConfig),
    Engine(crate::board::engine::Engine),
    Vfio(crate::board::vfio::Function),
    Console(crate::board::console::Console),
}

/// What is asked of one request whatever its kind (the [`Kind`] methods that take `self`).
trait Request {
    fn written(&self) -> String;
    fn facts(&self, root: &Path) -> Result<DeviceFacts, KindError>;
    fn ask(&self, index: usize, facts: &DeviceFacts) -> Ask;
}

impl<K: Kind> Request for K {
    fn written(&self) -> String {
        Kind::written(self)
    }
    fn facts(&self, root: &Path) -> Result<DeviceFacts, KindError> {
        Kind::facts(self, root)
    }
    fn ask(&self, index: usize, facts: &DeviceFacts) -> Ask {
        Kind::ask(self, index, facts)
    }
}

/// [`each_kind`] for a visit that cannot fail.
fn visit_all(v: &mut impl Visit) {
    let _ = each_kind(v);
}

/// Each kind's key in the launch's JSON report, in the order the report lists them.
pub fn sections() -> Vec<Section> {
    struct Sections(Vec<Section>);
    impl Visit for Sections {
        fn kind<K: Kind>(&mut self, _: KindOf<K>) -> Result<(), KindError> {
            self.0.push(K::SECTION);
            Ok(())
        }
    }
    let mut s = Sections(Vec::new());
    visit_all(&mut s);
    s.0
}

/// The roles of every kind's threads, in the list's order (`Kind::THREADS`): the launch
/// compiles a filter for each, and docs/security.md's table lists them.
pub fn thread_roles() -> Vec<Role> {
    struct Roles(Vec<Role>);
    impl Visit for Roles {
        fn kind<K: Kind>(&mut self, _: KindOf<K>) -> Result<(), KindError> {
            self.0.extend_from_slice(K::THREADS);
            Ok(())
        }
    }
    let mut r = Roles(Vec::new());
    visit_all(&mut r);
    r.0
}

/// The descriptors a machine with a device of every kind gives the seccomp filters,
/// each kind's placeholders four apart from 6 up (docs/security.md's table).
pub fn example_fds() -> DeviceFds {
    struct Example(DeviceFds, i32);
    impl Visit for Example {
        fn kind<K: Kind>(&mut self, _: KindOf<K>) -> Result<(), KindError> {
            K::example_fds(&mut self.0, self.1);
            self.1 += 4;
            Ok(())
        }
    }
    let mut e = Example(DeviceFds::default(), 6);
    visit_all(&mut e);
    e.0
}

impl DeviceSpec {
    /// As a user writes it after its option (`--disk PATH...`, `--device ...`).
    pub fn written(&self) -> String {
        self.request().written()
    }

    /// What the host under `root` has for it (refused: why it cannot serve it).
    pub fn facts(&self, root: &Path) -> Result<DeviceFacts, KindError> {
        self.request().facts(root)
    }

    /// Why `self` cannot join the devices `asked` before it.
    pub fn conflict(&self, asked: &[DeviceSpec]) -> Option<String> {
        struct Conflict<'a>(&'a DeviceSpec, &'a [DeviceSpec], Option<String>);
        impl Visit for Conflict<'_> {
            fn kind<K: Kind>(&mut self, of: KindOf<K>) -> Result<(), KindError> {
                if let Some(r) = (of.pick)(self.0) {
                    let earlier: Vec<&K> = self.1.iter().filter_map(of.pick).collect();
                    self.2 = r.conflict(&earlier);
                }
                Ok(())
            }
        }
        let mut c = Conflict(self, asked, None);
        visit_all(&mut c);
        c.2
    }

    /// `devices` with the request each kind the launch asked none of implies
    /// (`Kind::implied`: the console on stdout), after those asked.
    pub fn with_implied(devices: Vec<DeviceSpec>) -> Vec<DeviceSpec> {
        struct Implied(Vec<DeviceSpec>);
        impl Visit for Implied {
            fn kind<K: Kind>(&mut self, of: KindOf<K>) -> Result<(), KindError> {
                if !self.0.iter().any(|d| (of.pick)(d).is_some()) {
                    self.0.extend(K::implied().map(of.spec));
                }
                Ok(())
            }
        }
        let mut v = Implied(devices);
        visit_all(&mut v);
        v.0
    }

    /// What each of `devices` takes from the board, with its facts (`facts[i]`); each
    /// request's index is its place among its kind's.
    pub fn asks(devices: &[DeviceSpec], facts: &[DeviceFacts]) -> Vec<Ask> {
        let none = DeviceFacts::default();
        devices
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let same = std::mem::discriminant(d);
                let index = devices[..i]
                    .iter()
                    .filter(|e| std::mem::discriminant(*e) == same)
                    .count();
                d.request().ask(index, facts.get(i).unwrap_or(&none))
            })
            .collect()
    }

    /// Opens what `devices` name, each kind's together: one [`Opened`] a device.
    pub fn open_all(devices: &[DeviceSpec]) -> Result<Vec<Opened>, KindError> {
        struct Open<'a>(&'a [DeviceSpec], Vec<Option<Opened>>);
        impl Visit for Open<'_> {
            fn kind<K: Kind>(&mut self, of: KindOf<K>) -> Result<(), KindError> {
                let (at, group): (Vec<usize>, Vec<&K>) = self
                    .0
                    .iter()
                    .enumerate()
                    .filter_map(|(i, d)| Some((i, (of.pick)(d)?)))
                    .unzip();
                if group.is_empty() {
                    return Ok(());
                }
                let opened = K::open(&group)?;
                if opened.len() != at.len() {
                    return Err(mismatch("opened parts", opened.len(), at.len()));
                }
                for (i, o) in at.into_iter().zip(opened) {
                    self.1[i] = Some((of.wrap)(o));
                }
                Ok(())
            }
        }
        let mut o = Open(devices, devices.iter().map(|_| None).collect());
        each_kind(&mut o)?;
        let opened: Vec<Opened> = o.1.into_iter().flatten().collect();
        match opened.len() == devices.len() {
            true => Ok(opened),
            false => Err(mismatch("opened parts", opened.len(), devices.len())),
        }
    }

    /// Attaches `devices`, each at `places[i]` with `opened[i]`, each kind's together, in
    /// the list's order of kinds: what each kind hands back.
    pub fn attach_all(
        board: &mut Board<'_>,
        devices: &[DeviceSpec],
        places: &[Place],
        opened: Vec<Opened>,
    ) -> Result<Vec<Attached>, KindError> {
        if places.len() != devices.len() {
            return Err(mismatch("places", places.len(), devices.len()));
        }
        if opened.len() != devices.len() {
            return Err(mismatch("opened parts", opened.len(), devices.len()));
        }
        type Item<'a> = Option<(&'a DeviceSpec, &'a Place, Opened)>;
        struct Attach<'a, 'b> {
            board: &'a mut Board<'b>,
            items: Vec<Item<'a>>,
            out: Vec<Attached>,
        }
        impl Visit for Attach<'_, '_> {
            fn kind<K: Kind>(&mut self, of: KindOf<K>) -> Result<(), KindError> {
                let mut group = Vec::new();
                for item in &mut self.items {
                    let Some((d, place, _)) = item else { continue };
                    let (Some(request), place) = ((of.pick)(d), *place) else {
                        continue;
                    };
                    let request = request.clone();
                    let Some((_, _, opened)) = item.take() else {
                        continue;
                    };
                    let opened = (of.unwrap)(opened).ok_or_else(|| {
                        KindError::new(
                            format!("{}: opened as another kind", request.written()),
                            false,
                        )
                    })?;
                    group.push(Placed {
                        request,
                        place: place.clone(),
                        opened,
                    });
                }
                if !group.is_empty() {
                    self.out.push(K::attach(self.board, group)?);
                }
                Ok(())
            }
        }
        let items = devices
            .iter()
            .zip(places)
            .zip(opened)
            .map(|((d, p), o)| Some((d, p, o)))
            .collect();
        let mut a = Attach {
            board,
            items,
            out: Vec::new(),
        };
        each_kind(&mut a)?;
        Ok(a.out)
    }
}

/// A list that should be one a device is not.
fn mismatch(what: &str, got: usize, devices: usize) -> KindError {
    KindError::new(format!("{got} {what} for {devices} devices"), false)
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
    struct Parse<'a> {
        spec: &'a str,
        head: Option<&'a str>,
        /// The words, parsed once, until the kind they name takes them.
        kv: Option<KeyValues<'a>>,
        forms: Vec<&'static str>,
        done: Option<Result<DeviceSpec, KeyValueError>>,
    }
    impl Visit for Parse<'_> {
        fn kind<K: Kind>(&mut self, of: KindOf<K>) -> Result<(), KindError> {
            let Some((word, form)) = K::DEVICE_FORM else {
                return Ok(());
            };
            self.forms.push(form);
            let named = match self.head {
                Some(h) => h == word,
                None => self
                    .spec
                    .strip_prefix(word)
                    .is_some_and(|rest| rest.starts_with('=')),
            };
            if named && let Some(kv) = self.kv.take() {
                self.done = Some(K::parse(kv).map(of.spec));
            }
            Ok(())
        }
    }
    let kv = KeyValues::parse_with_kind(spec)?;
    let head = kv.head();
    let mut p = Parse {
        spec,
        head,
        kv: Some(kv),
        forms: Vec::new(),
        done: None,
    };
    visit_all(&mut p);
    match p.done {
        Some(r) => Ok(r?),
        None => Err(DeviceArgError {
            spec: spec.into(),
            why: format!(
                "{:?} is not a device: {}",
                head.unwrap_or(spec),
                p.forms.join(" or ")
            ),
        }),
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
        assert_eq!(keys, ["disks", "engine", "passthrough", "console"]);
    }

    #[test]
    fn a_board_has_its_console_whether_asked_or_not_and_one_only() {
        use crate::board::console::{Console, DEFAULT_LIMIT, Output};
        let disk = DeviceSpec::Disk(devices::virtio::block::BlockConfig::new(
            "/a".into(),
            "a".into(),
        ));
        // None asked: one on stdout at the default limit, after those asked.
        let all = DeviceSpec::with_implied(vec![disk.clone()]);
        assert_eq!(
            all,
            [
                disk.clone(),
                DeviceSpec::Console(Console {
                    output: Output::Stdout,
                    limit: DEFAULT_LIMIT,
                })
            ]
        );
        // Asked: that one, and no other.
        let asked = DeviceSpec::Console(Console {
            output: Output::File("/var/log/guest.log".into()),
            limit: 4096,
        });
        let all = DeviceSpec::with_implied(vec![asked.clone(), disk.clone()]);
        assert_eq!(all, [asked.clone(), disk]);
        // It asks for COM1's ports and line, which the plan gives it and the DSDT names.
        let asks = DeviceSpec::asks(&all, &[]);
        assert_eq!(
            asks[0].needs,
            crate::board::resources::Needs::Isa(crate::board::console::COM1)
        );
        let plan = crate::board::resources::MachinePlan::new(1, &asks, 48).unwrap();
        assert_eq!(plan.isa(), [crate::board::console::COM1]);
        // A second console is the configuration's mistake.
        let second = DeviceSpec::Console(Console::default());
        assert_eq!(
            second.conflict(&[asked]).as_deref(),
            Some("one console per partition")
        );
    }

    #[test]
    fn each_kind_opens_its_devices_together_and_each_keeps_its_place() {
        let dir = std::env::temp_dir().join(format!("spec-open-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a.img"), dir.join("b.img"));
        for p in [&a, &b] {
            std::fs::write(p, vec![0u8; 1 << 20]).unwrap();
        }
        let disk = |p: &std::path::Path| {
            DeviceSpec::Disk(devices::virtio::block::BlockConfig::new(
                p.to_path_buf(),
                "d".into(),
            ))
        };
        let engine = parse_device("engine").unwrap();
        let opened = DeviceSpec::open_all(&[disk(&a), engine.clone(), disk(&b)]).unwrap();
        assert!(matches!(
            opened.as_slice(),
            [Opened::Disk(_), Opened::Engine(()), Opened::Disk(_)]
        ));
        // Checked against each other: one file read-write twice is the user's mistake.
        let e = DeviceSpec::open_all(&[disk(&a), engine, disk(&a)])
            .err()
            .expect("the same file twice");
        assert!(
            e.is_usage() && e.to_string().contains("already attached"),
            "{e}"
        );
        // A backing that is not there is refused, naming it.
        let e = DeviceSpec::open_all(&[disk(&dir.join("none.img"))])
            .err()
            .expect("no such file");
        assert!(e.is_usage() && e.to_string().contains("none.img"), "{e}");
        assert!(DeviceSpec::open_all(&[]).unwrap().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
