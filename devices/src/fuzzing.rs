//! The bodies of the fuzz targets in `devices/fuzz` (run with `scripts/fuzz.sh`), kept here
//! so that `cargo test` replays the committed corpus through exactly the same code
//! (`partition/tests/fuzz_corpus.rs`). Every input is hostile guest memory and register traffic: the
//! code under test may refuse it, never panic, loop or touch memory outside the guest's.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use crate::BusDevice;
use crate::virtio::block::request::{self, Limits, Parsed};
use crate::virtio::block::{BlockConfig, VirtioBlock};
use crate::virtio::mmio::MmioTransport;
use crate::virtio::pci::PciTransport;
use crate::virtio::queue::QueueSetup;
use crate::virtio::{VirtioDevice, VirtioInterrupt};

/// Guest memory in one, two or three regions with holes between them (as a partition's
/// RAM sits around the MMIO hole), filled from `body` region by region.
fn memory(layout: u8, body: &[u8]) -> GuestMemoryMmap {
    let regions: &[(u64, usize)] = match layout % 3 {
        0 => &[(0, 64 << 10)],
        1 => &[(0, 32 << 10), (0x10000, 32 << 10)],
        _ => &[(0, 16 << 10), (0x8000, 16 << 10), (0x20000, 32 << 10)],
    };
    let ranges: Vec<(GuestAddress, usize)> =
        regions.iter().map(|&(a, l)| (GuestAddress(a), l)).collect();
    let mem = GuestMemoryMmap::from_ranges(&ranges).unwrap_or_else(|_| unreachable_memory());
    let mut rest = body;
    for &(start, len) in regions {
        // The first 4 KiB stay zero (room for the queue's own rings to be found there).
        let skip = if start == 0 { 0x1000 } else { 0 };
        let n = rest.len().min(len - skip);
        let _ = mem.write_slice(&rest[..n], GuestAddress(start + skip as u64));
        rest = &rest[n..];
    }
    mem
}

fn unreachable_memory() -> GuestMemoryMmap {
    panic!("fixed guest memory layout refused")
}

/// The virtqueue and the virtio-blk request parser over fuzzer-made guest memory: any
/// queue size (powers of two or not), ring placement, features, and chains taken while
/// earlier ones are still in flight, returned in an order the fuzzer picks.
pub fn virtqueue(data: &[u8]) {
    if data.len() < 16 {
        return;
    }
    let mem = memory(data[8], &data[16..]);
    let setup = QueueSetup {
        size: u16::from_le_bytes([data[0], data[1]]) % 520,
        desc_table: 0x1000 + 16 * data[2] as u64,
        avail_ring: 0x3000 + 2 * data[3] as u64,
        used_ring: 0x5000 + 4 * data[4] as u64,
        ready: data[5] & 0x80 == 0,
        ..QueueSetup::new(256)
    };
    let lim = Limits {
        capacity: u64::from_le_bytes([data[6], data[7], 0, 0, 0, 0, 0, 0]),
        read_only: data[5] & 4 != 0,
        seg_max: 128,
        max_segments: 16,
        max_segment_sectors: 1 << 22,
    };
    let Ok(mut q) = setup.start(&mem, data[5] & 2 != 0, data[5] & 1 != 0) else {
        return;
    };
    let size = q.size();
    let mut inflight: VecDeque<u16> = VecDeque::new();
    let script = &data[9..16];
    for step in 0..4 * size as usize {
        let op = script[step % script.len()].rotate_left((step / script.len()) as u32);
        match op & 3 {
            0 | 1 => match q.pop(&mem) {
                Ok(Some(chain)) => {
                    let parsed = request::parse(&chain, &mem, &lim);
                    let head = match &parsed {
                        Parsed::Ok(r) => r.head,
                        Parsed::Fail { head, .. } => *head,
                    };
                    assert!(head < size, "a head out of range was accepted");
                    inflight.push_back(head);
                }
                Ok(None) => {}
                Err(_) => return,
            },
            2 => {
                let head = if op & 4 == 0 {
                    inflight.pop_front()
                } else {
                    inflight.pop_back()
                };
                if let Some(h) = head {
                    if q.add_used(&mem, h, op as u32).is_err() {
                        return;
                    }
                    let _ = q.needs_interrupt(&mem);
                }
            }
            _ => {
                if op & 4 == 0 {
                    let _ = q.enable_notification(&mem);
                } else {
                    let _ = q.disable_notification(&mem);
                }
            }
        }
    }
}

/// A small disk image shared by every input of the process. Its file is unlinked at once
/// and reached through `/proc/self/fd`, so nothing is left behind however the process
/// ends (a fuzzer is killed more often than it exits).
fn disk_path() -> &'static PathBuf {
    static DISK: OnceLock<(std::fs::File, PathBuf)> = OnceLock::new();
    let (_, path) = DISK.get_or_init(|| {
        use std::os::fd::AsRawFd;
        let p = std::env::temp_dir().join(format!("devices-fuzz-disk-{}", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .expect("creating the fuzzer's disk image");
        let _ = std::fs::remove_file(&p);
        file.set_len(64 << 10)
            .expect("sizing the fuzzer's disk image");
        let path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        (file, path)
    });
    path
}

struct NoIrq;
impl crate::Interrupt for NoIrq {
    fn trigger(&self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Register traffic on a virtio-mmio window holding a real virtio-blk device (its queue
/// threads started, its disk a small file): any sequence of reads and writes of any width
/// at any offset, status changes, activations and resets, with rings and requests in
/// fuzzer-made guest memory. Nothing may panic, hang, or leave a thread behind.
pub fn mmio(data: &[u8]) {
    if data.len() < 2 {
        return;
    }
    let split = (data[0] as usize * 6).min(data.len() - 1);
    let (ops, body) = data[1..].split_at(split.min(data.len() - 1));
    let mem = memory(data[0] >> 4, body);
    let mut cfg = BlockConfig::new(disk_path().clone(), "fuzz".into());
    cfg.queues = 1 + (data[0] & 1) as u16;
    let Ok(mut blk) = VirtioBlock::new(cfg) else {
        return;
    };
    if blk.start(Arc::new(|_| Ok(()))).is_err() {
        return;
    }
    let bells: Vec<Arc<EventFd>> = (0..2)
        .filter_map(|_| EventFd::new(libc::EFD_NONBLOCK).ok().map(Arc::new))
        .collect();
    let mut t = MmioTransport::new(
        Box::new(blk),
        mem,
        Arc::new(VirtioInterrupt::new(Box::new(NoIrq))),
        bells,
    );
    for op in ops.chunks_exact(6) {
        let offset = u16::from_le_bytes([op[0], op[1]]) as u64 % 0x180;
        let value = [op[2], op[3], op[4], op[5]];
        let width = [1usize, 2, 4, 4][(op[0] >> 6) as usize];
        if op[1] & 0x80 == 0 {
            let _ = t.write(offset, &value[..width]);
        } else {
            let mut b = [0u8; 4];
            t.read(offset, &mut b[..width]);
        }
    }
    // Teardown stops the workers (waiting for in-flight I/O) and joins their threads.
    t.shutdown();
}

/// Traffic on a virtio-pci function holding a real virtio-blk device (its queue threads
/// started, its disk a small file): any sequence of configuration-space and BAR 0 reads
/// and writes of any width at any offset (common configuration, ISR, device configuration,
/// notifications, the MSI-X table and pending bits, MSI-X enable), with rings and requests
/// in fuzzer-made guest memory. Nothing may panic, hang, or leave a thread behind.
///
/// An operation is 7 bytes: flags (bit 0 configuration space, bit 1 a read, bits 2-3 the
/// width: 1, 2, 4 or 8 bytes), the offset (16 bits), the value (32 bits, zero-extended).
pub fn virtio_pci(data: &[u8]) {
    use crate::pci::PciFunction;
    if data.len() < 2 {
        return;
    }
    let split = (data[0] as usize * 7).min(data.len() - 1);
    let (ops, body) = data[1..].split_at(split.min(data.len() - 1));
    let mem = memory(data[0] >> 4, body);
    let mut cfg = BlockConfig::new(disk_path().clone(), "fuzz".into());
    cfg.queues = 1 + (data[0] & 1) as u16;
    let queues = usize::from(cfg.queues);
    let Ok(mut blk) = VirtioBlock::new(cfg) else {
        return;
    };
    if blk.start(Arc::new(|_| Ok(()))).is_err() {
        return;
    }
    let bells: Vec<Arc<EventFd>> = (0..queues)
        .filter_map(|_| EventFd::new(libc::EFD_NONBLOCK).ok().map(Arc::new))
        .collect();
    let lines = (0..=queues)
        .map(|_| Box::new(NoIrq) as Box<dyn crate::Interrupt + Sync>)
        .collect();
    let Ok(mut t) = PciTransport::new(Box::new(blk), mem, 0xc000_0000, lines, bells) else {
        return;
    };
    for op in ops.chunks_exact(7) {
        let width = [1usize, 2, 4, 8][usize::from((op[0] >> 2) & 3)];
        let mut value = [0u8; 8];
        value[..4].copy_from_slice(&op[3..7]);
        let at = u64::from(u16::from_le_bytes([op[1], op[2]]));
        match (op[0] & 1 != 0, op[0] & 2 != 0) {
            (true, false) => {
                let _ = t.write_config(at % 0x100, &value[..width.min(4)]);
            }
            (true, true) => {
                let mut b = [0u8; 4];
                t.config().read(at % 0x100, &mut b[..width.min(4)]);
            }
            (false, false) => {
                let _ = t.write_bar(0, at % crate::virtio::pci::BAR_SIZE, &value[..width]);
            }
            (false, true) => {
                let mut b = [0u8; 8];
                t.read_bar(0, at % crate::virtio::pci::BAR_SIZE, &mut b[..width]);
            }
        }
    }
    // Teardown stops the workers (waiting for in-flight I/O) and joins their threads.
    t.shutdown();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shared_disk_opens_as_a_block_device_and_leaves_no_file() {
        let p = disk_path();
        assert_eq!(std::fs::metadata(p).unwrap().len(), 64 << 10);
        let named = std::env::temp_dir().join(format!("devices-fuzz-disk-{}", std::process::id()));
        assert!(!named.exists(), "{} left behind", named.display());
        // The mmio target gives up quietly if this fails: it must not.
        let blk = VirtioBlock::new(BlockConfig::new(p.clone(), "fuzz".into()));
        assert!(blk.is_ok(), "{:?}", blk.err());
    }

    #[test]
    fn the_targets_take_short_and_odd_inputs() {
        for len in [0usize, 1, 2, 15, 16, 17, 64, 1000] {
            let d: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            virtqueue(&d);
            mmio(&d);
            virtio_pci(&d);
        }
    }
}
