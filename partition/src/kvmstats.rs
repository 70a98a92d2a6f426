//! KVM's binary statistics (`KVM_GET_STATS_FD`): per-VM and per-vCPU counters such as
//! `halt_exits` and `halt_attempted_poll`, read straight from the kernel. Used to show what
//! the host actually did with an idle policy, not only what we asked.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;

/// `_IO(KVMIO, 0xce)`.
const KVM_GET_STATS_FD: libc::c_ulong = 0xae_ce;
const HEADER_LEN: usize = 24;
const DESC_FIXED: usize = 16;

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

impl Stats {
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
        let name_size = u32_at(&h, 4).ok_or(StatsError::Malformed)? as usize;
        let num = u32_at(&h, 8).ok_or(StatsError::Malformed)? as usize;
        let desc_offset = u32_at(&h, 16).ok_or(StatsError::Malformed)? as u64;
        let data_offset = u32_at(&h, 20).ok_or(StatsError::Malformed)? as u64;
        if name_size == 0 || name_size > 256 || num > 4096 {
            return Err(StatsError::Malformed);
        }
        let stride = DESC_FIXED + name_size;
        let mut d = vec![0u8; stride * num];
        file.read_exact_at(&mut d, desc_offset)?;
        let descs = d
            .chunks(stride)
            .map(|c| {
                let size = u16::from_le_bytes([c[6], c[7]]);
                let offset = u32::from_le_bytes([c[8], c[9], c[10], c[11]]);
                let name = &c[DESC_FIXED..];
                let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
                (
                    String::from_utf8_lossy(&name[..end]).into_owned(),
                    offset,
                    size,
                )
            })
            .collect();
        Ok(Self {
            file,
            data_offset,
            descs,
        })
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
    fn reads_vm_and_vcpu_stats() {
        let Ok(kvm) = kvm_ioctls::Kvm::new() else {
            eprintln!("SKIPPED reads_vm_and_vcpu_stats: /dev/kvm is not usable");
            return;
        };
        let vm = kvm.create_vm().unwrap();
        let vcpu = vm.create_vcpu(0).unwrap();
        let Ok(s) = Stats::open(&vcpu) else {
            eprintln!("SKIPPED reads_vm_and_vcpu_stats: KVM_GET_STATS_FD not offered");
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
