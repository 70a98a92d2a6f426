//! Identity page tables for the 64-bit entry: 0..4 GiB mapped with 2 MiB pages.
//!
//! 2 MiB pages because the nested KVM on the development hosts shuts a guest down when it
//! meets 1 GiB pages. The Linux boot protocol only needs the kernel, the zero page and the
//! command line mapped; a kernel builds its own tables right away.

use crate::layout::{PD_ADDR, PDPT_ADDR, PML4_ADDR};

/// Present | writable.
const PRESENT_RW: u64 = 0x3;
/// Present | writable | page size (2 MiB leaf).
const LEAF_2M: u64 = 0x83;
/// Page directories (one per GiB).
pub const PD_COUNT: usize = 4;

/// The tables as (guest address, 512 entries) pages: PML4, PDPT, then [`PD_COUNT`] PDs.
pub fn identity_tables() -> [(u64, [u64; 512]); 2 + PD_COUNT] {
    let mut pml4 = [0u64; 512];
    pml4[0] = PDPT_ADDR | PRESENT_RW;
    let mut pdpt = [0u64; 512];
    let mut out = [(0u64, [0u64; 512]); 2 + PD_COUNT];
    for (g, slot) in pdpt.iter_mut().take(PD_COUNT).enumerate() {
        let pd_addr = PD_ADDR + (g as u64) * 0x1000;
        *slot = pd_addr | PRESENT_RW;
        let mut pd = [0u64; 512];
        for (i, e) in pd.iter_mut().enumerate() {
            *e = (((g as u64) << 30) + ((i as u64) << 21)) | LEAF_2M;
        }
        out[2 + g] = (pd_addr, pd);
    }
    out[0] = (PML4_ADDR, pml4);
    out[1] = (PDPT_ADDR, pdpt);
    out
}

/// Translates `va` through [`identity_tables`] the way the MMU would (for tests).
pub fn walk(tables: &[(u64, [u64; 512])], va: u64) -> Option<u64> {
    let page = |addr: u64| tables.iter().find(|t| t.0 == addr).map(|t| &t.1);
    let pml4e = page(PML4_ADDR)?[((va >> 39) & 0x1ff) as usize];
    if pml4e & 1 == 0 {
        return None;
    }
    let pdpte = page(pml4e & !0xfff)?[((va >> 30) & 0x1ff) as usize];
    if pdpte & 1 == 0 {
        return None;
    }
    let pde = page(pdpte & !0xfff)?[((va >> 21) & 0x1ff) as usize];
    if pde & 0x81 != 0x81 {
        return None;
    }
    Some((pde & !0x1f_ffff & 0x000f_ffff_ffff_ffff) | (va & 0x1f_ffff))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_below_4g_nothing_above() {
        let t = identity_tables();
        for va in [
            0u64,
            0x1234,
            0x7000,
            0x100_0000,
            0xbfff_ffff,
            0xfee0_0000,
            0xffff_ffff,
        ] {
            assert_eq!(walk(&t, va), Some(va), "{va:#x}");
        }
        assert_eq!(walk(&t, 0x1_0000_0000), None);
        assert_eq!(walk(&t, 0xffff_8000_0000_0000), None);
    }
}
