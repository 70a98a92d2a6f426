//! A vCPU's registers as the instruction assists see them and change them: the guest's
//! virtual memory read through the vCPU's page tables, the CPU state an assist decides on,
//! and carrying out its effects on the registers, segments and FPU state.

use kvm_bindings::{kvm_regs, kvm_segment, kvm_sregs};
use kvm_ioctls::VcpuFd;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::cpu::assist::{self, Assist, Effect, GuestVirt, SegLoad};
use crate::kvm::vm::MSR_STAR;

/// Guest-virtual reads through this vCPU's page tables (KVM_TRANSLATE, page by page).
pub(super) struct VcpuVirt<'a> {
    pub(super) fd: &'a VcpuFd,
    pub(super) mem: &'a GuestMemoryMmap,
}

impl GuestVirt for VcpuVirt<'_> {
    fn read(&self, gva: u64, buf: &mut [u8]) -> Result<(), assist::Unmapped> {
        let mut done = 0usize;
        while done < buf.len() {
            let a = gva.checked_add(done as u64).ok_or(assist::Unmapped)?;
            let t = self.fd.translate_gva(a).map_err(|_| assist::Unmapped)?;
            if t.valid == 0 {
                return Err(assist::Unmapped);
            }
            let n = ((0x1000 - (a & 0xfff)) as usize).min(buf.len() - done);
            self.mem
                .read_slice(&mut buf[done..done + n], GuestAddress(t.physical_address))
                .map_err(|_| assist::Unmapped)?;
            done += n;
        }
        Ok(())
    }
}

pub(super) fn read_msr(fd: &VcpuFd, index: u32) -> Result<u64, kvm_ioctls::Error> {
    let mut m = kvm_bindings::Msrs::from_entries(&[kvm_bindings::kvm_msr_entry {
        index,
        ..Default::default()
    }])
    .map_err(|_| kvm_ioctls::Error::new(libc::ENOMEM))?;
    fd.get_msrs(&mut m)?;
    Ok(m.as_slice()[0].data)
}

/// EFER.LMA.
const EFER_LMA: u64 = 1 << 10;
/// u32 index of FCW (low half) and FSW (high half) in the XSAVE legacy region.
const XSAVE_FCW_FSW: usize = 0;
/// u32 index of MXCSR in the XSAVE legacy region (byte 24).
const XSAVE_MXCSR: usize = 6;
/// u32 index of the low half of XSTATE_BV in the XSAVE header (byte 512).
const XSAVE_XSTATE_BV: usize = 128;
/// XSTATE_BV's SSE component bit (XMM registers and MXCSR).
const XFEATURE_MASK_SSE: u32 = 1 << 1;

/// The assist's view of the vCPU, with the registers it came from.
pub(super) fn cpu_state(
    fd: &VcpuFd,
) -> Result<(assist::Cpu, kvm_regs, kvm_sregs), kvm_ioctls::Error> {
    let r = fd.get_regs()?;
    let s = fd.get_sregs()?;
    // The XSAVE image, not KVM_GET_FPU: the nested kvm_pvm host returns MXCSR 0 there and
    // ignores MXCSR set through KVM_SET_FPU.
    let xsave = fd.get_xsave()?;
    let cpu = assist::Cpu {
        rip: r.rip,
        gprs: [
            r.rax, r.rcx, r.rdx, r.rbx, r.rsp, r.rbp, r.rsi, r.rdi, r.r8, r.r9, r.r10, r.r11,
            r.r12, r.r13, r.r14, r.r15,
        ],
        rflags: r.rflags,
        cpl: s.cs.dpl,
        long_mode: s.efer & EFER_LMA != 0 && s.cs.l != 0,
        cr0: s.cr0,
        cr4: s.cr4,
        efer: s.efer,
        fs_base: s.fs.base,
        gs_base: s.gs.base,
        fsw: (xsave.region[XSAVE_FCW_FSW] >> 16) as u16,
        star: read_msr(fd, MSR_STAR)?,
    };
    Ok((cpu, r, s))
}

pub(super) fn segment(l: &SegLoad) -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector: l.selector,
        // Execute/read or read/write, accessed.
        type_: if l.code { 11 } else { 3 },
        present: 1,
        dpl: l.dpl,
        db: u8::from(!l.long),
        s: 1,
        l: u8::from(l.long),
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    }
}

/// Carries out an assist's effects on the vCPU.
pub(super) fn apply(
    fd: &VcpuFd,
    mut regs: kvm_regs,
    mut sregs: kvm_sregs,
    a: &Assist,
) -> Result<(), kvm_ioctls::Error> {
    let mut events = None;
    let mut mxcsr = None;
    let mut sregs_dirty = false;
    for e in &a.effects {
        match *e {
            Effect::Rip(v) => regs.rip = v,
            Effect::Rflags(v) => regs.rflags = v,
            Effect::Rsp(v) => regs.rsp = v,
            Effect::Mxcsr(v) => mxcsr = Some(v),
            Effect::Segments { cs, ss } => {
                sregs.cs = segment(&cs);
                sregs.ss = segment(&ss);
                sregs_dirty = true;
            }
            Effect::Exception { vector, error_code } => {
                let mut ev = fd.get_vcpu_events()?;
                ev.exception.injected = 1;
                ev.exception.nr = vector;
                ev.exception.has_error_code = u8::from(error_code.is_some());
                ev.exception.error_code = error_code.unwrap_or(0);
                events = Some(ev);
            }
            Effect::Interrupt(vector) => {
                let mut ev = fd.get_vcpu_events()?;
                ev.interrupt.injected = 1;
                ev.interrupt.nr = vector;
                ev.interrupt.soft = 0;
                events = Some(ev);
            }
        }
    }
    if sregs_dirty {
        fd.set_sregs(&sregs)?;
    }
    fd.set_regs(&regs)?;
    if let Some(v) = mxcsr {
        let mut x = fd.get_xsave()?;
        x.region[XSAVE_MXCSR] = v;
        // MXCSR is part of the SSE component: with the SSE bit of XSTATE_BV clear (the
        // guest has not touched SSE state yet) KVM_SET_XSAVE ignores it. The XMM registers
        // in the image are then the init state, zeros, which setting the bit keeps.
        x.region[XSAVE_XSTATE_BV] |= XFEATURE_MASK_SSE;
        // SAFETY: `x` is the kvm_xsave KVM_GET_XSAVE just filled, of the size KVM_SET_XSAVE
        // reads; only MXCSR changed.
        unsafe { fd.set_xsave(&x)? };
        if log::log_enabled!(log::Level::Debug) {
            let back = fd.get_xsave().map(|b| b.region[XSAVE_MXCSR]);
            log::debug!("ldmxcsr assist: MXCSR {v:#x} set, KVM_GET_XSAVE reads back {back:?}");
        }
    }
    if let Some(ev) = events {
        fd.set_vcpu_events(&ev)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_loads_become_flat_segments() {
        let cs = segment(&SegLoad {
            selector: 0x33,
            dpl: 3,
            code: true,
            long: true,
        });
        assert_eq!(
            (cs.selector, cs.dpl, cs.l, cs.db, cs.type_),
            (0x33, 3, 1, 0, 11)
        );
        assert_eq!(
            (cs.base, cs.limit, cs.present, cs.s, cs.g),
            (0, 0xffff_ffff, 1, 1, 1)
        );
        let ss = segment(&SegLoad {
            selector: 0x18,
            dpl: 0,
            code: false,
            long: false,
        });
        assert_eq!(
            (ss.selector, ss.dpl, ss.l, ss.db, ss.type_),
            (0x18, 0, 0, 1, 3)
        );
    }
}
