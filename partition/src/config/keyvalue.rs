//! `key=value` lists as users write them (`--disk path=FILE,readonly=on`, `--device
//! engine,doorbell=trap`), parsed by one parser into typed values, and the value types every
//! edge shares: `--disk`, `--device`, `--cores`, the host plan file (through serde, by the
//! same `FromStr`) and the local API.
//!
//! A list is items separated by commas; an item is `key=value`, or (first item only, when
//! the caller allows one) a bare word naming a kind. Keys may not repeat; a value is read
//! by its type's `FromStr`, and a key the caller did not read is refused, naming the keys
//! that are known.

use std::fmt::Display;
use std::str::FromStr;

use serde::Deserialize;

use super::cores::{self, CoreError};
use super::size::{self, SizeError};

/// A list or a value that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{spec:?}: {why}")]
pub struct KeyValueError {
    /// The whole list as written.
    pub spec: String,
    /// What is wrong.
    pub why: String,
}

/// A parsed `key=value` list, read key by key.
#[derive(Debug)]
pub struct KeyValues<'a> {
    spec: &'a str,
    head: Option<&'a str>,
    pairs: Vec<(&'a str, &'a str, bool)>,
}

impl<'a> KeyValues<'a> {
    /// Parses `spec` as `key=value[,key=value…]`.
    pub fn parse(spec: &'a str) -> Result<Self, KeyValueError> {
        Self::parse_items(spec, false)
    }

    /// Parses `spec` as `KIND[,key=value…]` or `key=value[,…]`: a first item without `=`
    /// is the kind ([`Self::head`]).
    pub fn parse_with_kind(spec: &'a str) -> Result<Self, KeyValueError> {
        Self::parse_items(spec, true)
    }

    fn parse_items(spec: &'a str, kind: bool) -> Result<Self, KeyValueError> {
        let mut out = Self {
            spec,
            head: None,
            pairs: Vec::new(),
        };
        for (i, item) in spec.split(',').enumerate() {
            match item.split_once('=') {
                Some(("", _)) => return Err(out.error(format!("{item:?} has no key"))),
                Some((k, v)) => {
                    if out.pairs.iter().any(|(pk, _, _)| *pk == k) {
                        return Err(out.error(format!("{k}= given twice")));
                    }
                    out.pairs.push((k, v, false));
                }
                None if kind && i == 0 && !item.is_empty() => out.head = Some(item),
                None => return Err(out.error(format!("{item:?} is not key=value"))),
            }
        }
        Ok(out)
    }

    /// The kind named first, if the list began with one.
    pub fn head(&self) -> Option<&'a str> {
        self.head
    }

    /// An error about this list.
    pub fn error(&self, why: String) -> KeyValueError {
        KeyValueError {
            spec: self.spec.into(),
            why,
        }
    }

    /// The value of `key` as a `T`, if given.
    pub fn get<T>(&mut self, key: &str) -> Result<Option<T>, KeyValueError>
    where
        T: FromStr,
        T::Err: Display,
    {
        let Some(p) = self.pairs.iter_mut().find(|(k, _, _)| *k == key) else {
            return Ok(None);
        };
        p.2 = true;
        let v = p.1;
        v.parse::<T>()
            .map(Some)
            .map_err(|e| self.error(format!("{key}={v}: {e}")))
    }

    /// The value of `key` as a `T`; an error if it is missing.
    pub fn require<T>(&mut self, key: &str) -> Result<T, KeyValueError>
    where
        T: FromStr,
        T::Err: Display,
    {
        self.get(key)?
            .ok_or_else(|| self.error(format!("{key}= is required")))
    }

    /// Ends the reading: a key nobody read is an error naming the `known` ones.
    pub fn finish(self, known: &[&str]) -> Result<(), KeyValueError> {
        match self.pairs.iter().find(|(_, _, used)| !used) {
            Some((k, _, _)) => {
                Err(self.error(format!("unknown key {k:?} (known: {})", known.join(", "))))
            }
            None => Ok(()),
        }
    }
}

/// `on` or `off` (also `true`/`false`, `1`/`0`, `yes`/`no`, as earlier releases took).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OnOff(pub bool);

impl FromStr for OnOff {
    type Err = &'static str;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "on" | "true" | "1" | "yes" => Ok(Self(true)),
            "off" | "false" | "0" | "no" => Ok(Self(false)),
            _ => Err("use on or off"),
        }
    }
}

/// A byte size as people write it ("64M", "1GiB", "4096"; [`size::parse`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct ByteSize(pub u64);

impl FromStr for ByteSize {
    type Err = SizeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        size::parse(s).map(Self)
    }
}

impl TryFrom<String> for ByteSize {
    type Error = SizeError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

/// A core list ("1", "0,2", "2-5"; [`cores::parse`]).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct CoreList(pub Vec<usize>);

impl FromStr for CoreList {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        cores::parse(s).map(Self)
    }
}

impl TryFrom<String> for CoreList {
    type Error = CoreError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

/// Which cores a launch runs on: a list, or those of the cgroup it runs in (a pod's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CoreSelection {
    /// These, vCPU i on the i-th.
    List(Vec<usize>),
    /// `from-cgroup`: the cores of this process's cpuset cgroup, if they are exclusive.
    FromCgroup,
}

impl FromStr for CoreSelection {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "from-cgroup" => Ok(Self::FromCgroup),
            list => cores::parse(list).map(Self::List),
        }
    }
}

/// A host PCI function's full address, `DDDD:BB:DD.F` as `lspci -D` prints it: 4 hex
/// digits of domain, 2 of bus, 2 of device (up to 0x1f), 1 of function (0-7).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PciAddress(pub String);

impl FromStr for PciAddress {
    type Err = &'static str;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let hex = |t: &str, n: usize| t.len() == n && t.bytes().all(|b| b.is_ascii_hexdigit());
        let bad = "not a PCI address (DDDD:BB:DD.F, as in lspci -D)";
        let mut parts = s.split(':');
        let (Some(dom), Some(bus), Some(df), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad);
        };
        let Some((dev, func)) = df.split_once('.') else {
            return Err(bad);
        };
        let ok = hex(dom, 4)
            && hex(bus, 2)
            && hex(dev, 2)
            && u8::from_str_radix(dev, 16).is_ok_and(|d| d < 32)
            && func.len() == 1
            && matches!(func.as_bytes()[0], b'0'..=b'7');
        if ok { Ok(Self(s.into())) } else { Err(bad) }
    }
}

impl Display for PciAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_into_typed_values_and_every_mistake_is_named() {
        let mut kv = KeyValues::parse("path=/x,readonly=on,queues=4,size=64M").unwrap();
        assert_eq!(kv.require::<String>("path").unwrap(), "/x");
        assert_eq!(kv.get::<OnOff>("readonly").unwrap(), Some(OnOff(true)));
        assert_eq!(kv.get::<OnOff>("direct").unwrap(), None);
        assert_eq!(kv.get::<u16>("queues").unwrap(), Some(4));
        assert_eq!(
            kv.get::<ByteSize>("size").unwrap(),
            Some(ByteSize(64 << 20))
        );
        kv.finish(&["path", "readonly", "direct", "queues", "size"])
            .unwrap();

        let e = |spec: &str| KeyValues::parse(spec).unwrap_err().why;
        assert_eq!(e("path=/x,path=/y"), "path= given twice");
        assert_eq!(e("path=/x,junk"), "\"junk\" is not key=value");
        assert_eq!(e("=on"), "\"=on\" has no key");
        assert_eq!(e(""), "\"\" is not key=value");

        let mut kv = KeyValues::parse("readonly=maybe,colour=red").unwrap();
        let bad = kv.get::<OnOff>("readonly").unwrap_err();
        assert_eq!(
            bad.to_string(),
            "\"readonly=maybe,colour=red\": readonly=maybe: use on or off"
        );
        let mut kv = KeyValues::parse("colour=red").unwrap();
        assert!(
            kv.require::<String>("path")
                .unwrap_err()
                .why
                .contains("path= is required")
        );
        let unknown = kv.finish(&["path"]).unwrap_err();
        assert_eq!(unknown.why, "unknown key \"colour\" (known: path)");
    }

    #[test]
    fn a_kind_may_lead_the_list() {
        let mut kv = KeyValues::parse_with_kind("engine,doorbell=trap").unwrap();
        assert_eq!(kv.head(), Some("engine"));
        assert_eq!(kv.require::<String>("doorbell").unwrap(), "trap");
        let kv = KeyValues::parse_with_kind("vfio=0000:00:04.0").unwrap();
        assert_eq!(kv.head(), None);
        // Only the first item may be a bare word.
        assert!(KeyValues::parse_with_kind("engine,trap").is_err());
        assert!(KeyValues::parse("engine").is_err());
    }

    #[test]
    fn shared_value_types_parse_strictly() {
        assert_eq!("from-cgroup".parse(), Ok(CoreSelection::FromCgroup));
        assert_eq!("2-3".parse(), Ok(CoreSelection::List(vec![2, 3])));
        assert!("from-cgroups".parse::<CoreSelection>().is_err());
        assert_eq!("1,0".parse::<CoreList>().map(|c| c.0), Ok(vec![1, 0]));
        for good in ["0000:00:04.0", "abcd:ff:1f.7"] {
            assert!(good.parse::<PciAddress>().is_ok(), "{good}");
        }
        for bad in [
            "00:04.0",
            "0000:00:20.0",
            "0000:00:04.8",
            "0000:0g:04.0",
            "0000:00:04.0:1",
            "",
        ] {
            assert!(bad.parse::<PciAddress>().is_err(), "{bad}");
        }
        assert_eq!("yes".parse(), Ok(OnOff(true)));
        for bad in ["On", "2", "y", ""] {
            assert!(bad.parse::<OnOff>().is_err(), "{bad}");
        }
        // Serde reads the same types by the same FromStr (the host plan file).
        #[derive(Deserialize)]
        struct F {
            memory: ByteSize,
            cores: CoreList,
        }
        let f: F = toml::from_str("memory = \"1G\"\ncores = \"1-2\"").unwrap();
        assert_eq!(
            (f.memory, f.cores),
            (ByteSize(1 << 30), CoreList(vec![1, 2]))
        );
        assert!(toml::from_str::<F>("memory = \"lots\"\ncores = \"1\"").is_err());
    }
}
