//! Instruction assists: what the VMM does when KVM cannot emulate a guest instruction.
//!
//! On hosts whose KVM runs guest ring 0 in its instruction emulator (the nested `kvm_pvm`
//! module), some instructions a stock kernel executes are refused ("emulation failure").
//! For a short list whose architectural effect the VMM can reproduce exactly, [`decode`]
//! recognises the instruction from the bytes KVM reports and [`execute`] computes its
//! effect from the vCPU's state: a new RIP, flags or MXCSR, segment loads, or an exception
//! or interrupt to deliver through the guest's own IDT. The vCPU loop applies it and
//! resumes. Anything else, or any case the effect is not exactly known (a fault inside
//! the assist itself, an unusual privilege level), is [`Refusal`] and stays a crash report.
//!
//! Pure: no KVM, no guest memory except through the [`GuestVirt`] reader, so every case is
//! unit-tested with synthetic exits. On hosts with hardware virtualization these never
//! fire: ring 0 runs natively there.

/// The instructions assisted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// `int3` (CC): #BP, a trap (the pushed RIP is the next instruction).
    Int3,
    /// `int imm8` (CD ib): the vector through the IDT, RIP after the instruction.
    IntN,
    /// `fwait` (9B): waits for pending x87 exceptions; none pending is a no-op.
    Fwait,
    /// `ldmxcsr m32` (0F AE /2).
    Ldmxcsr,
    /// `sysret` (0F 07, REX.W for 64-bit): return to ring 3 from a SYSCALL.
    Sysret,
    /// A SYSCALL the host delivered to LSTAR without leaving ring 3 (see `syscall`).
    Syscall,
}

impl Kind {
    /// Every kind, in report order.
    pub const ALL: [Kind; 6] = [
        Kind::Int3,
        Kind::IntN,
        Kind::Fwait,
        Kind::Ldmxcsr,
        Kind::Sysret,
        Kind::Syscall,
    ];

    /// Name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Int3 => "int3",
            Kind::IntN => "int_n",
            Kind::Fwait => "fwait",
            Kind::Ldmxcsr => "ldmxcsr",
            Kind::Sysret => "sysret",
            Kind::Syscall => "syscall",
        }
    }
}

/// A decoded instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Insn {
    /// What it is.
    pub kind: Kind,
    /// Its length in bytes.
    pub len: u8,
    /// `int n`: the vector.
    pub vector: u8,
    /// `sysret`: REX.W (return to 64-bit code).
    pub wide: bool,
    /// Memory operand, for `ldmxcsr`.
    pub mem: Option<MemOperand>,
}

/// A ModRM memory operand: `seg:[base + index * scale + disp]`, or RIP-relative.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemOperand {
    /// Base register (0 = RAX .. 15 = R15), if any.
    pub base: Option<u8>,
    /// Index register and scale, if any.
    pub index: Option<(u8, u8)>,
    /// Displacement (sign-extended).
    pub disp: i64,
    /// RIP-relative (relative to the next instruction).
    pub rip_relative: bool,
    /// FS or GS override.
    pub seg: Seg,
    /// 32-bit address size (0x67).
    pub addr32: bool,
}

/// The segment of a memory operand (in 64-bit mode only FS and GS have a base).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seg {
    /// Flat.
    Flat,
    /// FS base.
    Fs,
    /// GS base.
    Gs,
}

/// Why an instruction is not assisted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Not on the list.
    #[error("not an instruction the VMM assists")]
    Unknown,
    /// The bytes end before the instruction does.
    #[error("instruction bytes cut short")]
    Truncated,
    /// Not at CPL 0 (the assisted forms are kernel instructions here).
    #[error("at CPL {0}, where this host does not refuse it")]
    Privilege(u8),
    /// Not in 64-bit mode.
    #[error("outside 64-bit mode")]
    NotLongMode,
    /// The memory operand could not be read.
    #[error("its memory operand at {0:#x} is not mapped")]
    Unmapped(u64),
    /// An x87 exception is pending with CR0.NE clear (legacy FERR# reporting).
    #[error("a pending x87 exception with CR0.NE clear")]
    LegacyFpuError,
}

/// The vCPU state an assist reads.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu {
    /// RIP of the instruction.
    pub rip: u64,
    /// RAX..R15.
    pub gprs: [u64; 16],
    /// RFLAGS.
    pub rflags: u64,
    /// Current privilege level (CS.DPL).
    pub cpl: u8,
    /// EFER.LMA and CS.L.
    pub long_mode: bool,
    /// CR0.
    pub cr0: u64,
    /// CR4.
    pub cr4: u64,
    /// EFER.
    pub efer: u64,
    /// FS base.
    pub fs_base: u64,
    /// GS base.
    pub gs_base: u64,
    /// x87 status word.
    pub fsw: u16,
    /// IA32_STAR (SYSCALL/SYSRET selectors).
    pub star: u64,
}

/// A guest-virtual address with no mapping (or no RAM behind it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unmapped;

/// Reads guest-virtual memory (through the guest's page tables).
pub trait GuestVirt {
    /// Fills `buf` from `gva`, or says part of it is not mapped.
    fn read(&self, gva: u64, buf: &mut [u8]) -> Result<(), Unmapped>;
}

/// A segment register load, as the vCPU will hold it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegLoad {
    /// Selector.
    pub selector: u16,
    /// Descriptor privilege level.
    pub dpl: u8,
    /// Code (else data).
    pub code: bool,
    /// 64-bit code segment (L).
    pub long: bool,
}

/// What the vCPU must do, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Continue at this RIP.
    Rip(u64),
    /// Set RFLAGS.
    Rflags(u64),
    /// Set RSP.
    Rsp(u64),
    /// Set MXCSR.
    Mxcsr(u32),
    /// Load CS and SS.
    Segments {
        /// CS.
        cs: SegLoad,
        /// SS.
        ss: SegLoad,
    },
    /// Deliver an exception (at the RIP set before it).
    Exception {
        /// Vector.
        vector: u8,
        /// Error code, for the vectors that push one.
        error_code: Option<u32>,
    },
    /// Deliver an interrupt vector through the IDT (as `int n` does at CPL 0).
    Interrupt(u8),
}

/// An assist: what it was and what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assist {
    /// The instruction.
    pub kind: Kind,
    /// The effects, applied in order.
    pub effects: heapless::Vec<Effect, 4>,
}

const VEC_UD: u8 = 6;
const VEC_NM: u8 = 7;
const VEC_GP: u8 = 13;
const VEC_MF: u8 = 16;
const VEC_BP: u8 = 3;
const CR0_MP: u64 = 1 << 1;
const CR0_EM: u64 = 1 << 2;
const CR0_TS: u64 = 1 << 3;
const CR0_NE: u64 = 1 << 5;
const CR4_OSFXSR: u64 = 1 << 9;
const EFER_SCE: u64 = 1 << 0;
/// x87 status word: error summary (an unmasked exception is pending).
const FSW_ES: u16 = 1 << 7;
/// MXCSR bits that may be set (FLAGS, MASKS, RC, FZ, DAZ); the rest is #GP.
pub const MXCSR_MASK: u32 = 0xffff;
/// RFLAGS bits SYSRET takes from R11 (RF and VM are cleared, bit 1 is set).
const SYSRET_RFLAGS_MASK: u64 = 0x3c_7fd7;

/// Decodes the instruction at the start of `bytes` (64-bit mode).
pub fn decode(bytes: &[u8]) -> Result<Insn, Refusal> {
    let mut i = 0;
    let mut seg = Seg::Flat;
    let mut addr32 = false;
    let mut simd_prefix = false;
    let mut rex = 0u8;
    // Legacy prefixes, then at most one REX right before the opcode.
    loop {
        let b = *bytes.get(i).ok_or(Refusal::Truncated)?;
        match b {
            0x64 => seg = Seg::Fs,
            0x65 => seg = Seg::Gs,
            0x2e | 0x36 | 0x3e | 0x26 => {}
            0x67 => addr32 = true,
            0x66 | 0xf2 | 0xf3 => simd_prefix = true,
            0xf0 => return Err(Refusal::Unknown),
            0x40..=0x4f => {
                rex = b;
                i += 1;
                break;
            }
            _ => break,
        }
        i += 1;
        if i > 14 {
            return Err(Refusal::Unknown);
        }
    }
    let op = *bytes.get(i).ok_or(Refusal::Truncated)?;
    let plain = |kind, len: usize| Insn {
        kind,
        len: len as u8,
        vector: 0,
        wide: false,
        mem: None,
    };
    match op {
        0xcc if !simd_prefix && rex == 0 => Ok(plain(Kind::Int3, i + 1)),
        0xcd if !simd_prefix && rex == 0 => {
            let v = *bytes.get(i + 1).ok_or(Refusal::Truncated)?;
            Ok(Insn {
                vector: v,
                ..plain(Kind::IntN, i + 2)
            })
        }
        0x9b if rex == 0 => Ok(plain(Kind::Fwait, i + 1)),
        0x0f => match *bytes.get(i + 1).ok_or(Refusal::Truncated)? {
            0x07 if !simd_prefix => Ok(Insn {
                wide: rex & 0x08 != 0,
                ..plain(Kind::Sysret, i + 2)
            }),
            0xae if !simd_prefix => {
                let (reg, mem, len) = modrm(bytes, i + 2, rex, seg, addr32)?;
                match (reg & 7, mem) {
                    (2, Some(m)) => Ok(Insn {
                        mem: Some(m),
                        ..plain(Kind::Ldmxcsr, len)
                    }),
                    _ => Err(Refusal::Unknown),
                }
            }
            _ => Err(Refusal::Unknown),
        },
        _ => Err(Refusal::Unknown),
    }
}

/// Decodes a ModRM (and SIB and displacement) at `at`: (reg field, memory operand if not a
/// register form, total instruction length so far).
fn modrm(
    bytes: &[u8],
    at: usize,
    rex: u8,
    seg: Seg,
    addr32: bool,
) -> Result<(u8, Option<MemOperand>, usize), Refusal> {
    let get = |i: usize| bytes.get(i).copied().ok_or(Refusal::Truncated);
    let m = get(at)?;
    let (md, reg, rm) = (m >> 6, ((m >> 3) & 7) | ((rex & 4) << 1), m & 7);
    if md == 3 {
        return Ok((reg, None, at + 1));
    }
    let mut len = at + 1;
    let mut op = MemOperand {
        base: None,
        index: None,
        disp: 0,
        rip_relative: false,
        seg,
        addr32,
    };
    let rex_b = (rex & 1) << 3;
    if rm == 4 {
        let sib = get(len)?;
        len += 1;
        let (scale, idx, base) = (sib >> 6, ((sib >> 3) & 7) | ((rex & 2) << 2), sib & 7);
        if idx != 4 {
            op.index = Some((idx, 1 << scale));
        }
        if base == 5 && md == 0 {
            op.disp = i32::from_le_bytes(four(bytes, len)?) as i64;
            len += 4;
        } else {
            op.base = Some(base | rex_b);
        }
    } else if rm == 5 && md == 0 {
        op.rip_relative = true;
        op.disp = i32::from_le_bytes(four(bytes, len)?) as i64;
        len += 4;
    } else {
        op.base = Some(rm | rex_b);
    }
    match md {
        1 => {
            op.disp = get(len)? as i8 as i64;
            len += 1;
        }
        2 => {
            op.disp = i32::from_le_bytes(four(bytes, len)?) as i64;
            len += 4;
        }
        _ => {}
    }
    Ok((reg, Some(op), len))
}

fn four(bytes: &[u8], at: usize) -> Result<[u8; 4], Refusal> {
    bytes
        .get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .ok_or(Refusal::Truncated)
}

/// The length of the instruction at the start of `bytes` if it is a no-op: `nop` (90),
/// the multi-byte `nop r/m` (0F 1F /0, with 66 prefixes), or `endbr64`/`endbr32`. Running
/// past such an instruction is executing it.
pub fn nop_len(bytes: &[u8]) -> Option<u8> {
    let prefixes = bytes.iter().take_while(|&&b| b == 0x66).count();
    let rest = &bytes[prefixes..];
    let len = match rest {
        [0x90, ..] if prefixes == 0 => 1,
        [0xf3, 0x0f, 0x1e, 0xfa | 0xfb, ..] if prefixes == 0 => 4,
        [0x0f, 0x1f, ..] => match modrm(rest, 2, 0, Seg::Flat, false) {
            Ok((0, _, len)) => len,
            _ => return None,
        },
        _ => return None,
    };
    u8::try_from(prefixes + len).ok().filter(|&l| l <= 15)
}

/// The address a memory operand names.
pub fn effective_address(m: &MemOperand, cpu: &Cpu, insn_len: u8) -> u64 {
    let mut a = m.disp as u64;
    if m.rip_relative {
        a = a.wrapping_add(cpu.rip.wrapping_add(insn_len as u64));
    }
    if let Some(b) = m.base {
        a = a.wrapping_add(cpu.gprs[b as usize]);
    }
    if let Some((i, s)) = m.index {
        a = a.wrapping_add(cpu.gprs[i as usize].wrapping_mul(s as u64));
    }
    if m.addr32 {
        a &= 0xffff_ffff;
    }
    match m.seg {
        Seg::Flat => a,
        Seg::Fs => a.wrapping_add(cpu.fs_base),
        Seg::Gs => a.wrapping_add(cpu.gs_base),
    }
}

fn is_canonical(a: u64) -> bool {
    ((a as i64) << 16 >> 16) as u64 == a
}

pub(crate) fn effects(list: &[Effect]) -> heapless::Vec<Effect, 4> {
    // At most four effects per assist (the longest, SYSRET, has three).
    heapless::Vec::from_slice(list).unwrap_or_default()
}

/// Computes the effect of `insn` on a vCPU in state `cpu`.
pub fn execute(insn: &Insn, cpu: &Cpu, mem: &dyn GuestVirt) -> Result<Assist, Refusal> {
    if !cpu.long_mode {
        return Err(Refusal::NotLongMode);
    }
    if cpu.cpl != 0 {
        return Err(Refusal::Privilege(cpu.cpl));
    }
    let next = cpu.rip.wrapping_add(insn.len as u64);
    let fault = |vector, error_code| {
        effects(&[
            Effect::Rip(cpu.rip),
            Effect::Exception { vector, error_code },
        ])
    };
    let e = match insn.kind {
        // A trap: the handler sees the address after the int3.
        Kind::Int3 => effects(&[
            Effect::Rip(next),
            Effect::Exception {
                vector: VEC_BP,
                error_code: None,
            },
        ]),
        // At CPL 0 the gate's DPL check always passes; no error code is pushed.
        Kind::IntN => effects(&[Effect::Rip(next), Effect::Interrupt(insn.vector)]),
        Kind::Fwait => {
            if cpu.cr0 & (CR0_MP | CR0_TS) == (CR0_MP | CR0_TS) {
                fault(VEC_NM, None)
            } else if cpu.fsw & FSW_ES != 0 {
                if cpu.cr0 & CR0_NE == 0 {
                    return Err(Refusal::LegacyFpuError);
                }
                fault(VEC_MF, None)
            } else {
                effects(&[Effect::Rip(next)])
            }
        }
        Kind::Ldmxcsr => {
            if cpu.cr0 & CR0_EM != 0 || cpu.cr4 & CR4_OSFXSR == 0 {
                fault(VEC_UD, None)
            } else if cpu.cr0 & CR0_TS != 0 {
                fault(VEC_NM, None)
            } else {
                let m = insn.mem.ok_or(Refusal::Unknown)?;
                let gva = effective_address(&m, cpu, insn.len);
                let mut b = [0u8; 4];
                mem.read(gva, &mut b).map_err(|_| Refusal::Unmapped(gva))?;
                let v = u32::from_le_bytes(b);
                if v & !MXCSR_MASK != 0 {
                    fault(VEC_GP, Some(0))
                } else {
                    effects(&[Effect::Mxcsr(v), Effect::Rip(next)])
                }
            }
        }
        Kind::Sysret => {
            let rcx = cpu.gprs[1];
            let r11 = cpu.gprs[11];
            if cpu.efer & EFER_SCE == 0 {
                fault(VEC_UD, None)
            } else if insn.wide && !is_canonical(rcx) {
                // Intel raises #GP(0) in ring 0 before changing anything.
                fault(VEC_GP, Some(0))
            } else {
                let base = ((cpu.star >> 48) & 0xfffc) as u16;
                let cs = if insn.wide { base + 16 } else { base };
                effects(&[
                    Effect::Segments {
                        cs: SegLoad {
                            selector: cs | 3,
                            dpl: 3,
                            code: true,
                            long: insn.wide,
                        },
                        ss: SegLoad {
                            selector: (base + 8) | 3,
                            dpl: 3,
                            code: false,
                            long: false,
                        },
                    },
                    Effect::Rflags((r11 & SYSRET_RFLAGS_MASK) | 2),
                    Effect::Rip(if insn.wide { rcx } else { rcx & 0xffff_ffff }),
                ])
            }
        }
        Kind::Syscall => return Err(Refusal::Unknown),
    };
    Ok(Assist {
        kind: insn.kind,
        effects: e,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Mem(Vec<(u64, Vec<u8>)>);
    impl GuestVirt for Mem {
        fn read(&self, gva: u64, buf: &mut [u8]) -> Result<(), Unmapped> {
            for (base, bytes) in &self.0 {
                if gva >= *base && gva + buf.len() as u64 <= base + bytes.len() as u64 {
                    let o = (gva - base) as usize;
                    buf.copy_from_slice(&bytes[o..o + buf.len()]);
                    return Ok(());
                }
            }
            Err(Unmapped)
        }
    }
    const NOMEM: Mem = Mem(Vec::new());

    fn kernel_cpu() -> Cpu {
        Cpu {
            rip: 0xffff_ffff_8100_0000,
            rflags: 0x246,
            cpl: 0,
            long_mode: true,
            cr0: 0x8005_0033,
            cr4: 0x6a0,
            efer: 0xd01,
            star: 0x0023_0010_0000_0000,
            ..Default::default()
        }
    }

    fn run(bytes: &[u8], cpu: &Cpu, mem: &dyn GuestVirt) -> Result<Assist, Refusal> {
        execute(&decode(bytes)?, cpu, mem)
    }

    #[test]
    fn int3_is_a_trap_after_the_instruction() {
        let c = kernel_cpu();
        let a = run(&[0xcc, 0x90, 0x90], &c, &NOMEM).unwrap();
        assert_eq!(a.kind, Kind::Int3);
        assert_eq!(
            a.effects.as_slice(),
            [
                Effect::Rip(c.rip + 1),
                Effect::Exception {
                    vector: 3,
                    error_code: None
                }
            ]
        );
    }

    #[test]
    fn int_n_delivers_its_vector_after_the_instruction() {
        let c = kernel_cpu();
        let a = run(&[0xcd, 0x80], &c, &NOMEM).unwrap();
        assert_eq!(
            a.effects.as_slice(),
            [Effect::Rip(c.rip + 2), Effect::Interrupt(0x80)]
        );
        assert_eq!(decode(&[0xcd]), Err(Refusal::Truncated));
    }

    #[test]
    fn fwait_is_a_no_op_unless_something_is_pending() {
        let mut c = kernel_cpu();
        assert_eq!(
            run(&[0x9b], &c, &NOMEM).unwrap().effects.as_slice(),
            [Effect::Rip(c.rip + 1)]
        );
        // TS and MP: #NM at the fwait itself (a fault).
        c.cr0 |= CR0_TS | CR0_MP;
        assert_eq!(
            run(&[0x9b], &c, &NOMEM).unwrap().effects.as_slice(),
            [
                Effect::Rip(c.rip),
                Effect::Exception {
                    vector: 7,
                    error_code: None
                }
            ]
        );
        // An unmasked x87 exception pending: #MF with CR0.NE, refused without it.
        c.cr0 &= !(CR0_TS | CR0_MP);
        c.fsw = FSW_ES | 1;
        assert!(matches!(
            run(&[0x9b], &c, &NOMEM).unwrap().effects[1],
            Effect::Exception { vector: 16, .. }
        ));
        c.cr0 &= !CR0_NE;
        assert_eq!(run(&[0x9b], &c, &NOMEM), Err(Refusal::LegacyFpuError));
    }

    #[test]
    fn ldmxcsr_reads_its_operand_through_every_addressing_form() {
        let mut c = kernel_cpu();
        c.gprs[4] = 0xffff_c900_0000_1000; // RSP
        c.gprs[9] = 0x2; // R9
        c.gs_base = 0xffff_8880_0000_0000;
        let at = |a: u64, v: u32| (a, v.to_le_bytes().to_vec());
        let mem = Mem(vec![
            at(0xffff_c900_0000_1004, 0x1f80),
            at(0xffff_c900_0000_1000 + 2 * 4 + 0x20, 0x1f81),
            at(0xffff_8880_0000_0040, 0x9fc0),
            at(c.rip + 9 + 0x100, 0x1f82),
        ]);
        // ldmxcsr 4(%rsp): 0f ae 54 24 04 (the kernel's kernel_fpu_begin).
        let a = run(&[0x0f, 0xae, 0x54, 0x24, 0x04], &c, &mem).unwrap();
        assert_eq!(a.kind, Kind::Ldmxcsr);
        assert_eq!(
            a.effects.as_slice(),
            [Effect::Mxcsr(0x1f80), Effect::Rip(c.rip + 5)]
        );
        // ldmxcsr 0x20(%rsp,%r9,4): REX.X, SIB 0x8c (scale 4, index 1 | X = R9, base RSP).
        let a = run(&[0x42, 0x0f, 0xae, 0x54, 0x8c, 0x20], &c, &mem);
        assert_eq!(a.unwrap().effects[0], Effect::Mxcsr(0x1f81));
        // %gs:0x40 with no base: 65 0f ae 14 25 40 00 00 00.
        let a = run(&[0x65, 0x0f, 0xae, 0x14, 0x25, 0x40, 0, 0, 0], &c, &mem).unwrap();
        assert_eq!(a.effects[0], Effect::Mxcsr(0x9fc0));
        // RIP-relative: 0f ae 15 disp32, relative to the end (9 bytes with two fillers).
        let a = run(&[0x2e, 0x3e, 0x0f, 0xae, 0x15, 0, 1, 0, 0], &c, &mem).unwrap();
        assert_eq!(
            a.effects.as_slice(),
            [Effect::Mxcsr(0x1f82), Effect::Rip(c.rip + 9)]
        );
    }

    #[test]
    fn ldmxcsr_faults_as_the_cpu_would() {
        let mut c = kernel_cpu();
        c.gprs[4] = 0x1000;
        let mem = Mem(vec![(0x1004, 0x1_0000u32.to_le_bytes().to_vec())]);
        let insn = [0x0f, 0xae, 0x54, 0x24, 0x04];
        // Reserved bits: #GP(0) at the instruction.
        assert_eq!(
            run(&insn, &c, &mem).unwrap().effects.as_slice(),
            [
                Effect::Rip(c.rip),
                Effect::Exception {
                    vector: 13,
                    error_code: Some(0)
                }
            ]
        );
        // Unmapped operand: the VMM does not invent a #PF, it refuses.
        c.gprs[4] = 0x9000;
        assert_eq!(run(&insn, &c, &mem), Err(Refusal::Unmapped(0x9004)));
        // CR0.TS: #NM; no OSFXSR: #UD.
        c.cr0 |= CR0_TS;
        assert!(matches!(
            run(&insn, &c, &mem).unwrap().effects[1],
            Effect::Exception { vector: 7, .. }
        ));
        c.cr4 &= !CR4_OSFXSR;
        assert!(matches!(
            run(&insn, &c, &mem).unwrap().effects[1],
            Effect::Exception { vector: 6, .. }
        ));
        // The register form (mod = 3) is another instruction.
        assert_eq!(decode(&[0x0f, 0xae, 0xd0]), Err(Refusal::Unknown));
        // With a 66/F3 prefix, 0f ae is something else too.
        assert_eq!(
            decode(&[0xf3, 0x0f, 0xae, 0x14, 0x24]),
            Err(Refusal::Unknown)
        );
    }

    #[test]
    fn sysret_returns_to_ring_3_with_the_selectors_star_names() {
        let mut c = kernel_cpu();
        c.gprs[1] = 0x40_1000; // RCX: return address
        c.gprs[11] = 0x1_0246 | (1 << 17); // R11 with RF and VM set: both are cleared
        let a = run(&[0x48, 0x0f, 0x07], &c, &NOMEM).unwrap();
        assert_eq!(a.kind, Kind::Sysret);
        // STAR[63:48] = 0x23: SS = 0x2b, CS = 0x33 (Linux's __USER_DS, __USER_CS).
        assert_eq!(
            a.effects.as_slice(),
            [
                Effect::Segments {
                    cs: SegLoad {
                        selector: 0x33,
                        dpl: 3,
                        code: true,
                        long: true
                    },
                    ss: SegLoad {
                        selector: 0x2b,
                        dpl: 3,
                        code: false,
                        long: false
                    }
                },
                Effect::Rflags(0x246),
                Effect::Rip(0x40_1000)
            ]
        );
        // 32-bit sysret: CS = STAR[63:48] (compat), RIP = ECX.
        c.gprs[1] = 0xdead_0000_0804_8000;
        let a = run(&[0x0f, 0x07], &c, &NOMEM).unwrap();
        assert!(matches!(
            a.effects[0],
            Effect::Segments {
                cs: SegLoad {
                    selector: 0x23,
                    long: false,
                    ..
                },
                ..
            }
        ));
        assert_eq!(a.effects[2], Effect::Rip(0x0804_8000));
        // A non-canonical return address: #GP(0) in ring 0.
        c.gprs[1] = 0x0000_8000_0000_0000;
        assert_eq!(
            run(&[0x48, 0x0f, 0x07], &c, &NOMEM).unwrap().effects[1],
            Effect::Exception {
                vector: 13,
                error_code: Some(0)
            }
        );
        // SYSCALL/SYSRET disabled: #UD.
        c.efer &= !EFER_SCE;
        assert!(matches!(
            run(&[0x48, 0x0f, 0x07], &c, &NOMEM).unwrap().effects[1],
            Effect::Exception { vector: 6, .. }
        ));
    }

    #[test]
    fn outside_the_list_or_ring_0_nothing_is_assisted() {
        let mut c = kernel_cpu();
        for bytes in [
            &[0xf0, 0x48, 0x0f, 0xc7, 0x4d, 0x20][..], // lock cmpxchg16b
            &[0x0f, 0x01, 0xca],                       // clac
            &[0xf3, 0x48, 0x0f, 0xb8, 0xc7],           // popcnt
            &[0x66, 0x44, 0x0f, 0x6e, 0xf9],           // movd %ecx,%xmm15
            &[0x0f, 0xae, 0x64, 0x24, 0x08],           // xsave 8(%rsp)
            &[0x48, 0xcc],                             // REX before int3: not int3
            &[],
        ] {
            assert!(decode(bytes).is_err(), "{bytes:02x?}");
        }
        c.cpl = 3;
        assert_eq!(run(&[0xcc], &c, &NOMEM), Err(Refusal::Privilege(3)));
        c.cpl = 0;
        c.long_mode = false;
        assert_eq!(run(&[0xcc], &c, &NOMEM), Err(Refusal::NotLongMode));
        // Prefix soup never reads past the bytes or loops.
        assert!(decode(&[0x66; 20]).is_err());
        assert_eq!(decode(&[0x0f, 0xae, 0x54, 0x24]), Err(Refusal::Truncated));
    }

    #[test]
    fn no_ops_are_recognised_with_their_length() {
        assert_eq!(nop_len(&[0x90, 0x90, 0x90]), Some(1));
        assert_eq!(nop_len(&[0x0f, 0x1f, 0x00, 0xfc]), Some(3));
        assert_eq!(nop_len(&[0x0f, 0x1f, 0x40, 0x00]), Some(4));
        assert_eq!(nop_len(&[0x0f, 0x1f, 0x44, 0x00, 0x00]), Some(5));
        assert_eq!(nop_len(&[0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00]), Some(6));
        assert_eq!(nop_len(&[0x0f, 0x1f, 0x80, 0, 0, 0, 0]), Some(7));
        assert_eq!(nop_len(&[0xf3, 0x0f, 0x1e, 0xfa]), Some(4));
        // Not no-ops: cld, a 0F 1F with reg != 0, clac, truncated forms.
        assert_eq!(nop_len(&[0xfc]), None);
        assert_eq!(nop_len(&[0x0f, 0x1f, 0x48, 0x00]), None);
        assert_eq!(nop_len(&[0x0f, 0x01, 0xca]), None);
        assert_eq!(nop_len(&[0x0f, 0x1f, 0x44]), None);
        assert_eq!(nop_len(&[]), None);
    }
}
