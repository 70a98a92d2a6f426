//! Register state at the first instruction, for each entry protocol.
//!
//! `boot` never calls an ioctl: it returns plain `kvm_regs`/`kvm_fpu` values and patches a
//! `kvm_sregs` the caller read from the vCPU, and `partition` writes them back.

use kvm_bindings::{kvm_fpu, kvm_regs, kvm_segment, kvm_sregs};

use crate::gdt::{self, CODE32_SEL, CODE64_SEL, DATA_SEL, Segment, TSS_SEL};
use crate::layout::{BOOT_STACK_TOP, PML4_ADDR, PVH_INFO_ADDR, ZERO_PAGE_ADDR};

/// CR0: PE | MP | ET | NE | WP | AM | PG.
pub const CR0_LONG: u64 = 0x8005_0033;
/// CR0: PE | ET (PVH: protected mode, paging off).
pub const CR0_PVH: u64 = 0x11;
/// CR4: PAE | PGE | OSFXSR | OSXMMEXCPT.
pub const CR4_LONG: u64 = 0x6a0;
/// EFER: SCE | LME | LMA | NXE.
pub const EFER_LONG: u64 = 0xd01;

/// How the kernel is entered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BootProtocol {
    /// Linux x86-64 boot protocol: long mode, paging on, RSI = zero page.
    Linux64,
    /// PVH: 32-bit protected mode, paging off, EBX = hvm_start_info.
    Pvh,
}

impl core::fmt::Display for BootProtocol {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Self::Linux64 => "linux64",
            Self::Pvh => "pvh",
        })
    }
}

/// Registers for the boot vCPU.
#[derive(Clone, Copy, Debug)]
pub struct EntryState {
    /// Protocol these registers implement.
    pub protocol: BootProtocol,
    /// General-purpose registers.
    pub regs: kvm_regs,
    /// x87/SSE state.
    pub fpu: kvm_fpu,
}

fn kvm_seg(s: Segment) -> kvm_segment {
    kvm_segment {
        base: s.base,
        limit: s.limit,
        selector: s.selector,
        type_: s.type_,
        present: s.present,
        dpl: s.dpl,
        db: s.db,
        s: s.s,
        l: s.l,
        g: s.g,
        avl: s.avl,
        unusable: 0,
        padding: 0,
    }
}

impl EntryState {
    /// State for entering at `entry` with `protocol`.
    pub fn new(protocol: BootProtocol, entry: u64) -> Self {
        let mut regs = kvm_regs {
            rip: entry,
            rflags: 0x2,
            ..Default::default()
        };
        match protocol {
            BootProtocol::Linux64 => {
                regs.rsi = ZERO_PAGE_ADDR;
                regs.rsp = BOOT_STACK_TOP;
                regs.rbp = BOOT_STACK_TOP;
            }
            BootProtocol::Pvh => regs.rbx = PVH_INFO_ADDR,
        }
        let fpu = kvm_fpu {
            fcw: 0x37f,
            mxcsr: 0x1f80,
            ..Default::default()
        };
        Self {
            protocol,
            regs,
            fpu,
        }
    }

    /// Patches `sregs` (read from the vCPU) with segments, control registers and the GDT.
    pub fn apply_sregs(&self, sregs: &mut kvm_sregs) {
        let code = match self.protocol {
            BootProtocol::Linux64 => CODE64_SEL,
            BootProtocol::Pvh => CODE32_SEL,
        };
        let data = kvm_seg(gdt::boot_segment(DATA_SEL));
        sregs.cs = kvm_seg(gdt::boot_segment(code));
        sregs.ds = data;
        sregs.es = data;
        sregs.fs = data;
        sregs.gs = data;
        sregs.ss = data;
        sregs.tr = kvm_seg(gdt::boot_segment(TSS_SEL));
        sregs.gdt.base = gdt::GDT_BASE;
        sregs.gdt.limit = gdt::GDT_LIMIT;
        sregs.idt.base = 0;
        sregs.idt.limit = 0;
        match self.protocol {
            BootProtocol::Linux64 => {
                sregs.cr0 = CR0_LONG;
                sregs.cr3 = PML4_ADDR;
                sregs.cr4 = CR4_LONG;
                sregs.efer = EFER_LONG;
            }
            BootProtocol::Pvh => {
                sregs.cr0 = CR0_PVH;
                sregs.cr3 = 0;
                sregs.cr4 = 0;
                sregs.efer = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linux64_state() {
        let e = EntryState::new(BootProtocol::Linux64, 0x100_0000);
        assert_eq!(
            (e.regs.rip, e.regs.rsi, e.regs.rflags),
            (0x100_0000, ZERO_PAGE_ADDR, 2)
        );
        let mut s = kvm_sregs::default();
        e.apply_sregs(&mut s);
        assert_eq!((s.cs.selector, s.cs.l, s.cs.db), (0x10, 1, 0));
        assert_eq!(s.ds.selector, 0x18);
        assert_eq!((s.tr.selector, s.tr.type_), (0x20, 11));
        assert_eq!(
            (s.cr0, s.cr3, s.cr4, s.efer),
            (CR0_LONG, PML4_ADDR, CR4_LONG, EFER_LONG)
        );
    }

    #[test]
    fn pvh_state() {
        let e = EntryState::new(BootProtocol::Pvh, 0x10_0040);
        assert_eq!((e.regs.rip, e.regs.rbx), (0x10_0040, PVH_INFO_ADDR));
        let mut s = kvm_sregs::default();
        e.apply_sregs(&mut s);
        assert_eq!(
            (s.cs.selector, s.cs.l, s.cs.db, s.cs.limit),
            (0x08, 0, 1, 0xffff_ffff)
        );
        assert_eq!((s.cr0 & 0x8000_0001, s.efer), (1, 0));
    }
}
