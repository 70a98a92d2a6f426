//! The body of the fuzz target in `boot/fuzz` (run with `scripts/fuzz.sh`), kept here so that
//! `cargo test` replays the committed corpus through exactly the same code
//! (`partition/tests/fuzz_corpus.rs`). The input is a kernel image from a user who may be hostile or
//! mistaken: every parser (ELF, bzImage, the PVH note, the bzImage payload) may refuse it,
//! never panic, read out of bounds or allocate without bound.

use vm_memory::{GuestAddress, GuestMemoryMmap};

use crate::kernel::KernelImage;
use crate::layout::MemoryLayout;
use crate::regs::BootProtocol;
use crate::{BootConfig, setup};

/// Guest memory the size of a small partition.
const GUEST: u64 = 32 << 20;

/// Recognise, extract, check and load `data` as a kernel, and build the boot structures.
pub fn kernel(data: &[u8]) {
    let _ = crate::extract::extract_vmlinux(data);
    let Ok(k) = KernelImage::from_bytes(data.to_vec()) else {
        return;
    };
    let _ = (k.footprint(), k.has_pvh(), k.cmdline_max(), k.kind());
    let Ok(layout) = MemoryLayout::new(GUEST) else {
        return;
    };
    if k.check_fits(&layout).is_err() {
        return;
    }
    let ranges: Vec<_> = layout
        .ram_ranges()
        .iter()
        .map(|r| (GuestAddress(r.guest_addr), r.len as usize))
        .collect();
    let Ok(mem) = GuestMemoryMmap::<()>::from_ranges(&ranges) else {
        return;
    };
    let protocol = if k.has_pvh() && data.len() % 2 == 1 {
        BootProtocol::Pvh
    } else {
        BootProtocol::Linux64
    };
    let _ = setup(
        &mem,
        &layout,
        &BootConfig {
            kernel: &k,
            initrd: Some(&data[..data.len().min(4096)]),
            cmdline: "console=ttyS0",
            cpus: 2,
            protocol,
            virtio_mmio: &[],
            isa: &[],
            sleep_port: 0x600,
            pci: None,
            memory_zeroed: false,
        },
    );
}

#[cfg(test)]
mod tests {
    use crate::kernel::tests::{tiny_bzimage, tiny_elf};

    /// Seeds for the fuzzer: the shapes the parsers know (ELF with and without a PVH note,
    /// bzImages with gzip and LZ4 payloads). `WRITE_FUZZ_SEEDS=1 cargo test -p boot
    /// write_fuzz_seeds -- --ignored` writes them to fuzz/seeds/kernel.
    #[test]
    #[ignore]
    fn write_fuzz_seeds() {
        use std::io::Write;
        if std::env::var_os("WRITE_FUZZ_SEEDS").is_none() {
            return;
        }
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/kernel");
        std::fs::create_dir_all(&dir).unwrap();
        let elf = tiny_elf(0x200000, &[0xf4; 16], 4096, None);
        let pvh = tiny_elf(0x200000, &[0xf4; 16], 0, Some(0x200000));
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&elf).unwrap();
        let mut gz = gz.finish().unwrap();
        gz.extend_from_slice(&(elf.len() as u32).to_le_bytes());
        let mut lz = 0x184c_2102u32.to_le_bytes().to_vec();
        let c = lz4_flex::block::compress(&elf);
        lz.extend_from_slice(&(c.len() as u32).to_le_bytes());
        lz.extend_from_slice(&c);
        lz.extend_from_slice(&(elf.len() as u32).to_le_bytes());
        let bz = |payload: &[u8]| {
            let mut b = tiny_bzimage(0x020f, 0x7f, payload);
            b[0x248..0x24c].copy_from_slice(&0u32.to_le_bytes());
            b[0x24c..0x250].copy_from_slice(&(payload.len() as u32).to_le_bytes());
            b
        };
        for (name, bytes) in [
            ("elf", elf.clone()),
            ("elf-pvh", pvh),
            ("bzimage-gzip", bz(&gz)),
            ("bzimage-lz4", bz(&lz)),
            ("bzimage-plain", tiny_bzimage(0x020c, 0x1, &[0xf4; 64])),
        ] {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    }

    #[test]
    fn short_and_odd_inputs_are_refused_quietly() {
        for len in [0usize, 4, 64, 0x208, 0x1000] {
            let d: Vec<u8> = (0..len).map(|i| (i * 131 + 7) as u8).collect();
            crate::fuzzing::kernel(&d);
        }
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        crate::fuzzing::kernel(&elf);
        crate::fuzzing::kernel(&tiny_elf(0x200000, &[0xf4; 16], 0, Some(0x200000)));
    }
}
