//! What the kernel reads at its entry: the Linux zero page (`boot_params`) for the 64-bit
//! boot protocol, or `hvm_start_info` for PVH.

use linux_loader::bootparam::{boot_e820_entry, boot_params, setup_header};
use linux_loader::loader::elf::start_info::{
    XEN_HVM_START_MAGIC_VALUE, hvm_memmap_table_entry, hvm_modlist_entry, hvm_start_info,
};

use crate::e820::E820Entry;

/// "HdrS".
const HDRS_MAGIC: u32 = 0x5372_6448;
/// `type_of_loader`: undefined boot loader.
const LOADER_TYPE_UNDEFINED: u8 = 0xff;
/// `loadflags`: protected-mode code loaded at 1 MiB or above.
const LOADED_HIGH: u8 = 0x01;
/// `loadflags`: `heap_end_ptr` is valid.
const CAN_USE_HEAP: u8 = 0x80;
/// Room in the zero page for e820 entries.
pub const ZERO_PAGE_E820_MAX: usize = 128;

/// Inputs of the zero page.
#[derive(Clone, Copy, Debug)]
pub struct LinuxParams<'a> {
    /// The bzImage's own setup header, if the kernel is a bzImage.
    pub setup_header: Option<setup_header>,
    /// Guest address of the NUL-terminated command line.
    pub cmdline_addr: u64,
    /// Command line length without the NUL.
    pub cmdline_len: usize,
    /// Initrd (address, size).
    pub initrd: Option<(u64, u64)>,
    /// The memory map.
    pub e820: &'a [E820Entry],
    /// Guest address of the ACPI RSDP.
    pub rsdp: u64,
}

/// Builds the zero page.
pub fn linux_boot_params(p: &LinuxParams<'_>) -> boot_params {
    let mut bp = boot_params::default();
    match p.setup_header {
        Some(h) => bp.hdr = h,
        None => {
            // An ELF vmlinux carries no setup header: fill what the kernel checks.
            bp.hdr.boot_flag = 0xaa55;
            bp.hdr.header = HDRS_MAGIC;
            bp.hdr.kernel_alignment = 0x0100_0000;
        }
    }
    bp.hdr.type_of_loader = LOADER_TYPE_UNDEFINED;
    bp.hdr.loadflags |= LOADED_HIGH | CAN_USE_HEAP;
    bp.hdr.heap_end_ptr = 0xfe00;
    bp.hdr.cmd_line_ptr = p.cmdline_addr as u32;
    bp.ext_cmd_line_ptr = (p.cmdline_addr >> 32) as u32;
    bp.hdr.cmdline_size = p.cmdline_len as u32 + 1;
    if let Some((addr, size)) = p.initrd {
        bp.hdr.ramdisk_image = addr as u32;
        bp.ext_ramdisk_image = (addr >> 32) as u32;
        bp.hdr.ramdisk_size = size as u32;
        bp.ext_ramdisk_size = (size >> 32) as u32;
    }
    bp.acpi_rsdp_addr = p.rsdp;
    let n = p.e820.len().min(ZERO_PAGE_E820_MAX);
    for (slot, e) in bp.e820_table.iter_mut().zip(&p.e820[..n]) {
        *slot = boot_e820_entry {
            addr: e.addr,
            size: e.size,
            r#type: e.kind,
        };
    }
    bp.e820_entries = n as u8;
    bp
}

/// The PVH start info and the arrays it points at.
#[derive(Clone, Debug)]
pub struct PvhInfo {
    /// The start info itself.
    pub start_info: hvm_start_info,
    /// Memory map entries (at `memmap_paddr`).
    pub memmap: Vec<hvm_memmap_table_entry>,
    /// Module list (the initrd), at `modlist_paddr`.
    pub modules: Vec<hvm_modlist_entry>,
}

/// Builds the PVH start info. `memmap_addr` and `modlist_addr` are where the caller places
/// the two arrays.
pub fn pvh_start_info(
    cmdline_addr: u64,
    e820: &[E820Entry],
    rsdp: u64,
    initrd: Option<(u64, u64)>,
    memmap_addr: u64,
    modlist_addr: u64,
) -> PvhInfo {
    let memmap: Vec<_> = e820
        .iter()
        .map(|e| hvm_memmap_table_entry {
            addr: e.addr,
            size: e.size,
            type_: e.kind,
            reserved: 0,
        })
        .collect();
    let modules: Vec<_> = initrd
        .map(|(paddr, size)| hvm_modlist_entry {
            paddr,
            size,
            cmdline_paddr: 0,
            reserved: 0,
        })
        .into_iter()
        .collect();
    let start_info = hvm_start_info {
        magic: XEN_HVM_START_MAGIC_VALUE,
        version: 1,
        flags: 0,
        nr_modules: modules.len() as u32,
        modlist_paddr: if modules.is_empty() { 0 } else { modlist_addr },
        cmdline_paddr: cmdline_addr,
        rsdp_paddr: rsdp,
        memmap_paddr: memmap_addr,
        memmap_entries: memmap.len() as u32,
        reserved: 0,
    };
    PvhInfo {
        start_info,
        memmap,
        modules,
    }
}

impl PvhInfo {
    /// The start info as the guest sees it (56 bytes, little endian).
    pub fn start_info_bytes(&self) -> [u8; 56] {
        let s = &self.start_info;
        let mut b = [0u8; 56];
        b[0..4].copy_from_slice(&s.magic.to_le_bytes());
        b[4..8].copy_from_slice(&s.version.to_le_bytes());
        b[8..12].copy_from_slice(&s.flags.to_le_bytes());
        b[12..16].copy_from_slice(&s.nr_modules.to_le_bytes());
        b[16..24].copy_from_slice(&s.modlist_paddr.to_le_bytes());
        b[24..32].copy_from_slice(&s.cmdline_paddr.to_le_bytes());
        b[32..40].copy_from_slice(&s.rsdp_paddr.to_le_bytes());
        b[40..48].copy_from_slice(&s.memmap_paddr.to_le_bytes());
        b[48..52].copy_from_slice(&s.memmap_entries.to_le_bytes());
        b
    }

    /// The memory map array (24 bytes an entry).
    pub fn memmap_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(self.memmap.len() * 24);
        for e in &self.memmap {
            b.extend_from_slice(&e.addr.to_le_bytes());
            b.extend_from_slice(&e.size.to_le_bytes());
            b.extend_from_slice(&e.type_.to_le_bytes());
            b.extend_from_slice(&0u32.to_le_bytes());
        }
        b
    }

    /// The module list array (32 bytes an entry).
    pub fn modlist_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(self.modules.len() * 32);
        for m in &self.modules {
            b.extend_from_slice(&m.paddr.to_le_bytes());
            b.extend_from_slice(&m.size.to_le_bytes());
            b.extend_from_slice(&m.cmdline_paddr.to_le_bytes());
            b.extend_from_slice(&0u64.to_le_bytes());
        }
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::e820::{E820_RAM, build};
    use crate::layout::MemoryLayout;

    #[test]
    fn zero_page_for_elf() {
        let e820 = build(&MemoryLayout::new(64 << 20).unwrap());
        let bp = linux_boot_params(&LinuxParams {
            setup_header: None,
            cmdline_addr: 0x20000,
            cmdline_len: 10,
            initrd: Some((0x300_0000, 0x1234)),
            e820: &e820,
            rsdp: 0xe0000,
        });
        // Copy out of the packed struct before comparing.
        let (hdr, ptr, size) = (bp.hdr.header, bp.hdr.cmd_line_ptr, bp.hdr.cmdline_size);
        assert_eq!((hdr, ptr, size), (HDRS_MAGIC, 0x20000, 11));
        let (img, rsz) = (bp.hdr.ramdisk_image, bp.hdr.ramdisk_size);
        assert_eq!((img, rsz), (0x300_0000, 0x1234));
        assert_eq!(bp.e820_entries as usize, e820.len());
        let last = bp.e820_table[e820.len() - 1];
        let (a, s, t) = (last.addr, last.size, last.r#type);
        assert_eq!((a, s, t), (0x100000, (64 << 20) - 0x100000, E820_RAM));
        let rsdp = bp.acpi_rsdp_addr;
        assert_eq!(rsdp, 0xe0000);
        assert_eq!(bp.hdr.type_of_loader, 0xff);
    }

    #[test]
    fn zero_page_keeps_bzimage_header() {
        let h = setup_header {
            version: 0x020f,
            xloadflags: 0x7f,
            code32_start: 0x100000,
            ..Default::default()
        };
        let bp = linux_boot_params(&LinuxParams {
            setup_header: Some(h),
            cmdline_addr: 0x1_0002_0000,
            cmdline_len: 0,
            initrd: None,
            e820: &[],
            rsdp: 0,
        });
        let (v, x, lf) = (bp.hdr.version, bp.hdr.xloadflags, bp.hdr.loadflags);
        assert_eq!((v, x), (0x020f, 0x7f));
        assert_eq!(
            lf & (LOADED_HIGH | CAN_USE_HEAP),
            LOADED_HIGH | CAN_USE_HEAP
        );
        let ext = bp.ext_cmd_line_ptr;
        assert_eq!(ext, 1);
        let rd = bp.hdr.ramdisk_image;
        assert_eq!(rd, 0);
    }

    #[test]
    fn pvh_info() {
        let e820 = build(&MemoryLayout::new(64 << 20).unwrap());
        let p = pvh_start_info(0x20000, &e820, 0xe0000, None, 0x6040, 0x6800);
        assert_eq!(p.start_info.magic, XEN_HVM_START_MAGIC_VALUE);
        assert_eq!(p.start_info.memmap_entries as usize, e820.len());
        assert_eq!(p.start_info.nr_modules, 0);
        assert_eq!(p.start_info.modlist_paddr, 0);
        let p = pvh_start_info(
            0x20000,
            &e820,
            0xe0000,
            Some((0x400000, 99)),
            0x6040,
            0x6800,
        );
        assert_eq!(p.start_info.nr_modules, 1);
        assert_eq!(p.modules[0].size, 99);
        assert_eq!(p.start_info.modlist_paddr, 0x6800);
        let b = p.start_info_bytes();
        assert_eq!(
            u32::from_le_bytes(b[0..4].try_into().unwrap()),
            XEN_HVM_START_MAGIC_VALUE
        );
        assert_eq!(u64::from_le_bytes(b[24..32].try_into().unwrap()), 0x20000);
        assert_eq!(p.memmap_bytes().len(), 24 * e820.len());
        assert_eq!(p.modlist_bytes().len(), 32);
    }
}
