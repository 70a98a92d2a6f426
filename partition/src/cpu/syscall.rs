//! The SYSCALL repair.
//!
//! The nested `kvm_pvm` host executes a ring-3 SYSCALL by loading RIP from LSTAR, RCX and
//! R11 with the return address and flags, and RFLAGS masked by SFMASK, but leaves CS and
//! SS (so CPL) as they were. The kernel's entry code then faults in ring 3 on its own
//! supervisor page: a #PF with CR2 = RIP = LSTAR and a user instruction-fetch error code.
//! The VMM stops the guest at its #PF handler (a debug breakpoint), recognises that
//! signature in the exception frame, unwinds the fault and finishes the SYSCALL: CS and SS
//! from STAR, RSP and RFLAGS as they were at the fault, RIP = LSTAR.

use super::assist::{Assist, Effect, Kind, SegLoad, effects};

/// #PF error code bits: user mode and instruction fetch.
const PF_USER_FETCH: u64 = (1 << 2) | (1 << 4);

/// The exception frame the guest's #PF handler was entered with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PfFrame {
    /// Error code.
    pub error_code: u64,
    /// Faulting RIP.
    pub rip: u64,
    /// CS at the fault.
    pub cs: u64,
    /// RFLAGS at the fault.
    pub rflags: u64,
    /// RSP at the fault.
    pub rsp: u64,
}

impl PfFrame {
    /// Reads the frame from its six quadwords at the handler's RSP.
    pub fn from_words(w: [u64; 5]) -> Self {
        Self {
            error_code: w[0],
            rip: w[1],
            cs: w[2],
            rflags: w[3],
            rsp: w[4],
        }
    }
}

/// RFLAGS.RF: SYSCALL clears it.
const RFLAGS_RF: u64 = 1 << 16;

/// What the registers at the guest's #PF handler say about the fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A SYSCALL the host left in ring 3: finish it with this.
    Repair(Assist),
    /// A user-mode fault at LSTAR that is not the shape of a broken SYSCALL (another
    /// error code, or CR2 elsewhere): delivered to the guest as it is (a SIGSEGV for
    /// the process in Linux), and counted, never silent.
    Unmatched,
    /// Any other page fault: the guest's own.
    Ordinary,
}

/// Whether this #PF is a SYSCALL the host left in ring 3, and if so how to finish it as
/// SYSCALL would have: CS and SS from STAR, RSP as it was, RIP = LSTAR, and RFLAGS =
/// the user's (SYSCALL saved them in R11) less SFMASK and RF, never the frame's.
pub fn classify(
    frame: &PfFrame,
    cr2: u64,
    lstar: u64,
    star: u64,
    r11: u64,
    sfmask: u64,
) -> Verdict {
    if lstar == 0 || frame.cs & 3 != 3 {
        return Verdict::Ordinary;
    }
    let broken =
        frame.rip == lstar && cr2 == lstar && frame.error_code & PF_USER_FETCH == PF_USER_FETCH;
    if !broken {
        return if frame.rip == lstar || cr2 == lstar {
            Verdict::Unmatched
        } else {
            Verdict::Ordinary
        };
    }
    let kcs = ((star >> 32) & 0xfffc) as u16;
    Verdict::Repair(Assist {
        kind: Kind::Syscall,
        effects: effects(&[
            Effect::Segments {
                cs: SegLoad {
                    selector: kcs,
                    dpl: 0,
                    code: true,
                    long: true,
                },
                ss: SegLoad {
                    selector: kcs + 8,
                    dpl: 0,
                    code: false,
                    long: false,
                },
            },
            Effect::Rsp(frame.rsp),
            Effect::Rflags((r11 & !sfmask & !RFLAGS_RF) | 2),
            Effect::Rip(lstar),
        ]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::assist::Effect;

    #[test]
    fn a_broken_syscall_is_repaired_and_nothing_else_is() {
        let lstar = 0xffff_ffff_81c0_0080;
        let star = 0x0023_0010_0000_0000;
        // Linux's SFMASK: TF, DF, IF, IOPL, AC, NT.
        let sfmask = 0x4_7700;
        let frame = PfFrame {
            error_code: 0x15, // present, user, instruction fetch
            rip: lstar,
            cs: 0x33,
            rflags: 0x10602, // what the host left: IF, DF, RF
            rsp: 0x7ffc_d163_8b50,
        };
        // The user's RFLAGS as SYSCALL saved them: AC, RF, DF, IF, ZF, PF.
        let r11 = 0x5_0646;
        let Verdict::Repair(a) = classify(&frame, lstar, lstar, star, r11, sfmask) else {
            panic!("not repaired");
        };
        assert_eq!(a.kind, Kind::Syscall);
        assert_eq!(
            a.effects.as_slice(),
            [
                Effect::Segments {
                    cs: SegLoad {
                        selector: 0x10,
                        dpl: 0,
                        code: true,
                        long: true
                    },
                    ss: SegLoad {
                        selector: 0x18,
                        dpl: 0,
                        code: false,
                        long: false
                    }
                },
                Effect::Rsp(frame.rsp),
                // R11 less SFMASK and RF: only ZF, PF (and the fixed bit) are left; IF,
                // DF, AC from the user, and what the frame held, never reach the entry.
                Effect::Rflags(0x46),
                Effect::Rip(lstar)
            ]
        );
        // Ordinary page faults go to the guest's handler untouched.
        for f in [
            PfFrame { cs: 0x10, ..frame }, // kernel mode
            PfFrame {
                rip: lstar + 1,
                ..frame
            }, // elsewhere
        ] {
            assert_eq!(
                classify(&f, 0x1000, lstar, star, r11, sfmask),
                Verdict::Ordinary,
                "{f:?}"
            );
        }
        assert_eq!(
            classify(&frame, 0, 0, star, r11, sfmask),
            Verdict::Ordinary,
            "LSTAR not set"
        );
        // A user fault at LSTAR of another shape is not repaired, and says so.
        assert_eq!(
            classify(&frame, 0x1000, lstar, star, r11, sfmask),
            Verdict::Unmatched,
            "CR2 elsewhere"
        );
        let write = PfFrame {
            error_code: 0x6,
            ..frame
        };
        assert_eq!(
            classify(&write, lstar, lstar, star, r11, sfmask),
            Verdict::Unmatched,
            "a data write"
        );
    }
}
