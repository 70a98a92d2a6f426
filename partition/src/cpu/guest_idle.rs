//! What a stock Linux guest makes of the MONITOR/MWAIT CPUID it is shown, and the leaf 5
//! that lets it idle in MWAIT C1 (docs/idle.md, "Which idle loop the guest picks").
//!
//! Linux (6.0 on; Debian's 6.1, arch/x86/kernel/process.c, `prefer_mwait_c1_over_halt` and
//! `select_idle_routine`) idles in MWAIT C1 (hint 0) when: no `idle=poll|halt|nomwait` on
//! its command line, CPUID.1:ECX.MONITOR, not AMD erratum 400 (families 0xf and 0x10), and,
//! when leaf 5 says the MWAIT extensions exist (ECX bit 0), leaf 5 EDX[7:4] counts at least
//! one C1 sub-state. There is no vendor test. Otherwise it idles in HLT.

use serde::Serialize;

/// CPUID leaf 1 ECX: running under a hypervisor.
pub const LEAF1_ECX_HYPERVISOR: u32 = 1 << 31;
/// Leaf 5 ECX bit 0: MWAIT extensions; EDX's sub-state counts are valid.
pub const LEAF5_ECX_EMX: u32 = 1 << 0;
/// Leaf 5 EDX bits 7:4: how many C1 sub-states MWAIT takes (Linux's
/// `MWAIT_C1_SUBSTATE_MASK`).
pub const LEAF5_EDX_C1_SUBSTATES: u32 = 0xf0;

/// The leaf 5 a guest is shown from the host's `[eax, ebx, ecx, edx]`: as the host's, but a
/// leaf that enumerates sub-states (EMX) and counts no C1 sub-state (AMD reserves EDX and
/// leaves it 0; QEMU's emulated CPUs do too) counts one, sub-state 0, which is MWAIT's hint
/// 0: C1, the state every MWAIT implementation has (Linux uses hint 0 with no leaf 5 check
/// at all when EMX is clear). Without it a stock Linux guest idles in HLT and every
/// cross-vCPU wake-up is an IPI.
pub fn guest_leaf5(host: [u32; 4]) -> [u32; 4] {
    let [a, b, c, mut d] = host;
    if c & LEAF5_ECX_EMX != 0 && d & LEAF5_EDX_C1_SUBSTATES == 0 {
        d |= 1 << 4;
    }
    [a, b, c, d]
}

/// Whether this host runs a guest's MWAIT as a wait: not when it is itself a QEMU TCG
/// machine (hypervisor leaf vendor "TCGTCGTCGTCG"), whose `helper_mwait`
/// (target/i386/tcg's misc_helper.c, QEMU 7.2 and 10.0 alike) with more than one CPU runs MWAIT as PAUSE and
/// returns at once. There a guest idling in MWAIT spins its host's CPU, which the `mwait`
/// policy never promised (that is `poll`), and the rig's outer machine lost its timer
/// wake-ups under it (docs/idle.md); its own leaf is kept and the guest halts.
pub fn host_mwait_waits() -> bool {
    let l1 = core::arch::x86_64::__cpuid(1);
    if l1.ecx & LEAF1_ECX_HYPERVISOR == 0 {
        return true;
    }
    let h = core::arch::x86_64::__cpuid(0x4000_0000);
    !runs_mwait_as_pause(&vendor_string([h.ebx, h.ecx, h.edx]))
}

/// The 12-byte vendor string CPUID spells in three registers, given in the leaf's order
/// (leaf 0: EBX, EDX, ECX; the hypervisor leaf: EBX, ECX, EDX).
pub fn vendor_string(regs: [u32; 3]) -> [u8; 12] {
    let mut v = [0u8; 12];
    for (chunk, r) in v.chunks_exact_mut(4).zip(regs) {
        chunk.copy_from_slice(&r.to_le_bytes());
    }
    v
}

/// Whether the hypervisor of vendor `vendor` runs MWAIT as PAUSE (QEMU's TCG).
fn runs_mwait_as_pause(vendor: &[u8; 12]) -> bool {
    vendor == b"TCGTCGTCGTCG"
}

/// The idle loop a stock Linux guest runs when no cpuidle driver takes over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IdleRoutine {
    /// `mwait_idle`: MONITOR on its flags, MWAIT hint 0; a wake-up is a store, no IPI.
    Mwait,
    /// `default_idle` (or the AMD erratum 400 variant): HLT; a wake-up is an IPI.
    Hlt,
    /// `idle=poll`: it spins; a wake-up is a store.
    Poll,
}

/// Which loop the guest will idle in, and why, from the CPUID it was given.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GuestIdle {
    /// The loop.
    pub routine: IdleRoutine,
    /// Why, in the kernel's terms.
    pub why: String,
}

/// The CPUID words the choice reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IdleCpuidView {
    /// Leaf 0's vendor string is "AuthenticAMD".
    pub amd: bool,
    /// Leaf 1's display family (base family, plus the extended family when base is 0xf).
    pub family: u32,
    /// Leaf 1 ECX bit 3.
    pub monitor: bool,
    /// Leaf 5 as shown, if there is one.
    pub leaf5: Option<[u32; 4]>,
}

/// What a Linux 6.0+ guest given `cpu` and `cmdline` idles in (before any cpuidle driver:
/// under `cpuidle.off=1` this is the loop it runs).
pub fn predict(cpu: IdleCpuidView, cmdline: &str) -> GuestIdle {
    let said = |routine, why: &str| GuestIdle {
        routine,
        why: why.to_string(),
    };
    let mut idle_word = None;
    for w in cmdline.split_ascii_whitespace() {
        match w.strip_prefix("idle=") {
            Some("poll") => return said(IdleRoutine::Poll, "idle=poll on its command line"),
            Some(v @ ("halt" | "nomwait")) => idle_word = Some(v),
            _ => {}
        }
    }
    if let Some(v) = idle_word {
        return GuestIdle {
            routine: IdleRoutine::Hlt,
            why: format!("idle={v} on its command line"),
        };
    }
    if cpu.amd && matches!(cpu.family, 0xf | 0x10) {
        return said(
            IdleRoutine::Hlt,
            "AMD family 0xf/0x10 (erratum 400): the kernel's E400-aware HLT loop",
        );
    }
    if !cpu.monitor {
        return said(IdleRoutine::Hlt, "CPUID.1:ECX.MONITOR is clear");
    }
    // KVM answers a leaf it was not given with zeros: no extensions.
    let [_, _, ecx, edx] = cpu.leaf5.unwrap_or_default();
    if ecx & LEAF5_ECX_EMX == 0 {
        return said(
            IdleRoutine::Mwait,
            "MONITOR shown, leaf 5 without extensions: MWAIT hint 0 (C1)",
        );
    }
    let c1 = (edx & LEAF5_EDX_C1_SUBSTATES) >> 4;
    if c1 == 0 {
        return said(
            IdleRoutine::Hlt,
            "leaf 5 counts no C1 sub-state (EDX[7:4] = 0)",
        );
    }
    GuestIdle {
        routine: IdleRoutine::Mwait,
        why: format!("MONITOR shown, leaf 5 counts {c1} C1 sub-state(s): MWAIT hint 0 (C1)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AMD_LEAF5: [u32; 4] = [64, 64, 3, 0];

    fn zen() -> IdleCpuidView {
        IdleCpuidView {
            amd: true,
            family: 0x17,
            monitor: true,
            leaf5: Some(guest_leaf5(AMD_LEAF5)),
        }
    }

    #[test]
    fn a_leaf_without_a_c1_sub_state_gets_one_and_nothing_else_changes() {
        // AMD's leaf 5 (EDX reserved, 0): one C1 sub-state added, the rest as the host's.
        assert_eq!(guest_leaf5(AMD_LEAF5), [64, 64, 3, 0x10]);
        // An Intel leaf with C0-C3 sub-states is passed on as it is.
        let intel = [64, 64, 3, 0x0000_2220];
        assert_eq!(guest_leaf5(intel), intel);
        // With C2 sub-states but no C1, C1 is added beside them.
        assert_eq!(guest_leaf5([64, 64, 1, 0x200]), [64, 64, 1, 0x210]);
        // Without EMX, EDX means nothing and stays as it was.
        assert_eq!(guest_leaf5([64, 64, 0, 0]), [64, 64, 0, 0]);
    }

    #[test]
    fn the_guest_picks_what_linux_would() {
        assert_eq!(predict(zen(), "console=ttyS0").routine, IdleRoutine::Mwait);
        // The host's raw AMD leaf: HLT, and the reason names EDX.
        let raw = IdleCpuidView {
            leaf5: Some(AMD_LEAF5),
            ..zen()
        };
        let g = predict(raw, "");
        assert_eq!(g.routine, IdleRoutine::Hlt);
        assert!(g.why.contains("no C1 sub-state"), "{}", g.why);
        // Without extensions hint 0 is taken as is.
        let plain = IdleCpuidView {
            leaf5: Some([64, 64, 0, 0]),
            ..zen()
        };
        assert_eq!(predict(plain, "").routine, IdleRoutine::Mwait);
        let hidden = IdleCpuidView {
            monitor: false,
            ..zen()
        };
        assert_eq!(predict(hidden, "").routine, IdleRoutine::Hlt);
        // No leaf 5 reads as zeros: no extensions, hint 0 taken as is.
        let no_leaf = IdleCpuidView {
            leaf5: None,
            ..zen()
        };
        assert_eq!(predict(no_leaf, "").routine, IdleRoutine::Mwait);
        let e400 = IdleCpuidView {
            family: 0x10,
            ..zen()
        };
        assert!(predict(e400, "").why.contains("erratum 400"));
        // Intel's family 0x10 is no erratum.
        let intel = IdleCpuidView {
            amd: false,
            family: 0x10,
            ..zen()
        };
        assert_eq!(predict(intel, "").routine, IdleRoutine::Mwait);
    }

    #[test]
    fn only_an_emulator_that_spins_on_mwait_keeps_the_hosts_leaf() {
        assert!(runs_mwait_as_pause(b"TCGTCGTCGTCG"));
        assert!(!runs_mwait_as_pause(b"KVMKVMKVM\0\0\0"));
        assert!(!runs_mwait_as_pause(b"Microsoft Hv"));
    }

    #[test]
    fn the_command_line_overrides_the_cpuid() {
        assert_eq!(predict(zen(), "a idle=poll b").routine, IdleRoutine::Poll);
        let g = predict(zen(), "idle=nomwait");
        assert_eq!(
            (g.routine, g.why.as_str()),
            (IdleRoutine::Hlt, "idle=nomwait on its command line")
        );
        assert_eq!(predict(zen(), "idle=halt").routine, IdleRoutine::Hlt);
        // Words that only look alike change nothing.
        assert_eq!(
            predict(zen(), "xidle=halt idle=bogus").routine,
            IdleRoutine::Mwait
        );
    }
}
