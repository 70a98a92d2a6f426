//! KVM's binary statistics (`KVM_GET_STATS_FD`): per-VM and per-vCPU counters such as
//! `halt_exits` and `halt_attempted_poll`, read straight from the kernel. Used to show what
//! the host actually did with an idle policy, not only what we asked.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;

use std::mem::{offset_of, size_of};

use kvm_bindings::{kvm_stats_desc, kvm_stats_header};

/// `_IO(KVMIO, 0xce)` (kvm-ioctls does not wrap it).
const KVM_GET_STATS_FD: libc::c_ulong = 0xae_ce;
/// The header, and the fixed part of each descriptor (its name follows), as the kernel's
/// UAPI lays them out.
const HEADER_LEN: usize = size_of::<kvm_stats_header>();
const DESC_FIXED: usize = size_of::<kvm_stats_desc>();

/// Errors opening or parsing a stats fd.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    /// The ioctl or a read failed.
    #[error("KVM stats: {0}")]
    Io(#[from] std::io::Error),
    /// The layout does not make sense.
    #[error("KVM stats: malformed header")]
    Malformed,
}

/// An open stats fd with its descriptors.
#[derive(Debug)]
pub struct Stats {
    file: File,
    data_offset: u64,
    descs: Vec<(String, u32, u16)>,
}

fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?))
}

fn u16_at(b: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?))
}

/// What the stats header says, checked for sense.
#[derive(Debug, PartialEq, Eq)]
struct Header {
    name_size: usize,
    num_desc: usize,
    desc_offset: u64,
    data_offset: u64,
}

impl Header {
    fn parse(h: &[u8]) -> Option<Self> {
        let f = |o| u32_at(h, o);
        let name_size = f(offset_of!(kvm_stats_header, name_size))? as usize;
        let num_desc = f(offset_of!(kvm_stats_header, num_desc))? as usize;
        let header = Self {
            name_size,
            num_desc,
            desc_offset: f(offset_of!(kvm_stats_header, desc_offset))? as u64,
            data_offset: f(offset_of!(kvm_stats_header, data_offset))? as u64,
        };
        (name_size > 0 && name_size <= 256 && num_desc <= 4096).then_some(header)
    }

    fn stride(&self) -> usize {
        DESC_FIXED + self.name_size
    }

    /// (name, data offset, element count) of each descriptor in `d`.
    fn descriptors(&self, d: &[u8]) -> Vec<(String, u32, u16)> {
        d.chunks_exact(self.stride())
            .filter_map(|c| {
                let size = u16_at(c, offset_of!(kvm_stats_desc, size))?;
                let offset = u32_at(c, offset_of!(kvm_stats_desc, offset))?;
                let name = &c[DESC_FIXED..];
                let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
                Some((
                    String::from_utf8_lossy(&name[..end]).into_owned(),
                    offset,
                    size,
                ))
            })
            .collect()
    }
}

/// A vCPU's idle counters where its statistics may be missing (a KVM without the binary
/// stats descriptor): none then. The report, the ledger and the API read them so.
pub fn idle_counters_of(stats: Option<&Stats>) -> BTreeMap<String, u64> {
    stats.map(Stats::idle_counters).unwrap_or_default()
}

impl Stats {
    /// Its descriptor (what a confined thread's filter lets it pread).
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        self.file.as_raw_fd()
    }

    /// Opens the stats of a VM or vCPU fd.
    pub fn open(fd: &impl AsRawFd) -> Result<Self, StatsError> {
        // SAFETY: KVM_GET_STATS_FD takes no argument and returns a new fd or -1.
        let raw = unsafe { libc::ioctl(fd.as_raw_fd(), KVM_GET_STATS_FD as _) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        // SAFETY: `raw` is a fresh fd that nothing else owns.
        let file = unsafe { File::from_raw_fd(raw) };
        let mut h = [0u8; HEADER_LEN];
        file.read_exact_at(&mut h, 0)?;
        let header = Header::parse(&h).ok_or(StatsError::Malformed)?;
        let mut d = vec![0u8; header.stride() * header.num_desc];
        file.read_exact_at(&mut d, header.desc_offset)?;
        Ok(Self {
            file,
            data_offset: header.data_offset,
            descs: header.descriptors(&d),
        })
    }

    /// The statistics an idle policy shows in: the `halt_*` counters and `exits`.
    pub fn idle_counters(&self) -> BTreeMap<String, u64> {
        self.read()
            .into_iter()
            .filter(|(k, _)| k.starts_with("halt_") || k == "exits")
            .collect()
    }

    /// Current values (the first element of each statistic).
    pub fn read(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for (name, offset, size) in &self.descs {
            if *size == 0 {
                continue;
            }
            let mut v = [0u8; 8];
            if self
                .file
                .read_exact_at(&mut v, self.data_offset + *offset as u64)
                .is_ok()
            {
                out.insert(name.clone(), u64::from_le_bytes(v));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_and_descriptors_follow_the_uapi_layout() {
        // flags, name_size 8, num_desc 2, id_offset, desc_offset 0x40, data_offset 0x100.
        let mut h = Vec::new();
        for v in [0u32, 8, 2, 24, 0x40, 0x100] {
            h.extend_from_slice(&v.to_le_bytes());
        }
        let hd = Header::parse(&h).unwrap();
        assert_eq!(
            hd,
            Header {
                name_size: 8,
                num_desc: 2,
                desc_offset: 0x40,
                data_offset: 0x100
            }
        );
        let desc = |size: u16, offset: u32, name: &[u8]| {
            let mut d = vec![0u8; DESC_FIXED + 8];
            d[6..8].copy_from_slice(&size.to_le_bytes());
            d[8..12].copy_from_slice(&offset.to_le_bytes());
            d[DESC_FIXED..DESC_FIXED + name.len()].copy_from_slice(name);
            d
        };
        let mut d = desc(1, 0, b"exits");
        d.extend(desc(1, 8, b"halt_exi")); // a name filling its field, no NUL
        assert_eq!(
            hd.descriptors(&d),
            [("exits".to_string(), 0, 1), ("halt_exi".to_string(), 8, 1)]
        );
        // Nonsense sizes are refused, a short header too.
        h[4..8].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(Header::parse(&h), None);
        assert_eq!(Header::parse(&h[..12]), None);
    }

    #[test]
    fn reads_vm_and_vcpu_stats() {
        let Ok(kvm) = kvm_ioctls::Kvm::new() else {
            skip::skip(
                "partition::kvm::stats::reads_vm_and_vcpu_stats",
                "/dev/kvm is not usable",
            );
            return;
        };
        let vm = kvm.create_vm().unwrap();
        let vcpu = vm.create_vcpu(0).unwrap();
        let Ok(s) = Stats::open(&vcpu) else {
            skip::skip(
                "partition::kvm::stats::reads_vm_and_vcpu_stats",
                "KVM_GET_STATS_FD not offered",
            );
            return;
        };
        let v = s.read();
        assert!(v.contains_key("halt_exits"), "{v:?}");
        assert_eq!(v["halt_exits"], 0);
        assert!(
            Stats::open(&vm)
                .unwrap()
                .read()
                .contains_key("remote_tlb_flush")
        );
    }
}
