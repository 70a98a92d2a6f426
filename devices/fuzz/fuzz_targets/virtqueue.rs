//! Feeds arbitrary guest memory to the virtqueue and the virtio-blk request parser: a
//! descriptor table, an avail ring and request headers all come from the fuzzer. Nothing
//! may panic, loop forever or touch memory outside the guest's.
#![no_main]

use devices::virtio::block::request::{self, Limits, Parsed};
use devices::virtio::queue::QueueSetup;
use libfuzzer_sys::fuzz_target;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const MEM: usize = 64 << 10;

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), MEM)]).unwrap();
    // The rest of the input becomes guest memory from 0x1000 on: descriptor table, rings,
    // headers, indirect tables, all at the fuzzer's mercy.
    let body = &data[8..];
    let _ = mem.write_slice(&body[..body.len().min(MEM - 0x1000)], GuestAddress(0x1000));
    let setup = QueueSetup {
        size: 1u16 << (data[0] % 9),
        desc_table: 0x1000 + 16 * (data[1] as u64),
        avail_ring: 0x3000 + 2 * (data[2] as u64),
        used_ring: 0x5000 + 4 * (data[3] as u64),
        ready: true,
        ..QueueSetup::new(256)
    };
    let lim = Limits {
        capacity: u64::from_le_bytes([data[5], data[6], data[7], 0, 0, 0, 0, 0]),
        read_only: data[4] & 4 != 0,
        seg_max: 128,
        max_segments: 16,
        max_segment_sectors: 1 << 22,
    };
    let Ok(mut q) = setup.start(&mem, data[4] & 2 != 0, data[4] & 1 != 0) else {
        return;
    };
    for _ in 0..q.size() {
        match q.pop(&mem) {
            Ok(Some(chain)) => {
                let parsed = request::parse(&chain, &mem, &lim);
                let head = match &parsed {
                    Parsed::Ok(r) => r.head,
                    Parsed::Fail { head, .. } => *head,
                };
                assert!(head < q.size());
                let _ = q.add_used(&mem, head, 1);
                let _ = q.needs_interrupt(&mem);
            }
            Ok(None) | Err(_) => break,
        }
    }
});
