//! The CPU model: what the guest is told about its CPU beyond what the host supports.
//!
//! - `host`: the host's supported CPUID as it is (plus topology and idle bits, see
//!   [`crate::cpu::cpuid`]). Right wherever guest ring 0 runs natively (VMX, SVM).
//! - `nested-safe`: for hosts whose KVM runs guest ring 0 in its instruction emulator (the
//!   nested `kvm_pvm` module). That emulator refuses a set of instructions a stock Linux
//!   kernel executes in ring 0; the model hides the CPU features that make the kernel use
//!   them, in CPUID and, because this host rewrites part of what KVM_SET_CPUID2 sets, on the
//!   kernel's command line (`clearcpuid=`, which every x86 Linux since 4.x parses, with the
//!   kernel's own feature numbers: word × 32 + bit). It also turns on the SYSCALL repair
//!   (`assist::syscall`): this host leaves a ring-3 SYSCALL in ring 3.
//!
//! `auto` picks `nested-safe` when `/dev/kvm` is the `kvm_pvm` module, `host` otherwise.
//! What was chosen, why, and what the host did with it are in the launch report.

use kvm_bindings::kvm_cpuid_entry2;

/// The model asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuModelRequest {
    /// `nested-safe` on kvm_pvm hosts, else `host`.
    Auto,
    /// The host's CPUID.
    Host,
    /// Hide what a ring-0 emulator refuses.
    NestedSafe,
}

impl std::str::FromStr for CpuModelRequest {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "host" => Ok(Self::Host),
            "nested-safe" => Ok(Self::NestedSafe),
            _ => Err(format!("{s:?}: use auto, host or nested-safe")),
        }
    }
}

/// A CPUID register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reg {
    /// EAX.
    Eax,
    /// EBX.
    Ebx,
    /// ECX.
    Ecx,
    /// EDX.
    Edx,
}

/// A CPU feature the model can hide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Feature {
    /// Linux's name for it (`/proc/cpuinfo`).
    pub name: &'static str,
    /// CPUID leaf.
    pub leaf: u32,
    /// Sub-leaf.
    pub subleaf: u32,
    /// Register.
    pub reg: Reg,
    /// Bit.
    pub bit: u8,
    /// Linux's feature number (`clearcpuid=`): word × 32 + bit, where word 4 is leaf 1 ECX
    /// and word 9 is leaf 7.0 EBX (`arch/x86/include/asm/cpufeatures.h`). `None` for KVM's
    /// paravirtual features, which Linux reads from CPUID directly (CPUID alone hides them).
    pub linux: Option<u16>,
    /// The instruction the ring-0 emulator refuses, and where a kernel meets it.
    pub why: &'static str,
}

const fn leaf1_ecx(name: &'static str, bit: u8, why: &'static str) -> Feature {
    Feature {
        name,
        leaf: 1,
        subleaf: 0,
        reg: Reg::Ecx,
        bit,
        linux: Some(4 * 32 + bit as u16),
        why,
    }
}

const fn leaf7_ebx(name: &'static str, bit: u8, why: &'static str) -> Feature {
    Feature {
        name,
        leaf: 7,
        subleaf: 0,
        reg: Reg::Ebx,
        bit,
        linux: Some(9 * 32 + bit as u16),
        why,
    }
}

const fn leaf7_edx(name: &'static str, bit: u8, why: &'static str) -> Feature {
    Feature {
        name,
        leaf: 7,
        subleaf: 0,
        reg: Reg::Edx,
        bit,
        linux: Some(18 * 32 + bit as u16),
        why,
    }
}

/// A KVM paravirtual feature (leaf 0x4000_0001 EAX).
const fn kvm_pv(name: &'static str, bit: u8, why: &'static str) -> Feature {
    Feature {
        name,
        leaf: 0x4000_0001,
        subleaf: 0,
        reg: Reg::Eax,
        bit,
        linux: None,
        why,
    }
}

/// What `nested-safe` hides: first each feature whose instruction stopped a Debian kernel
/// here, then two that only cost time (the emulator steps a `rep movsb`/`rep stosb` one
/// byte at a time; without them the kernel's memset, memcpy and clear_page move 8 bytes a
/// step).
pub const NESTED_SAFE_HIDDEN: &[Feature] = &[
    leaf1_ecx("cx16", 13, "lock cmpxchg16b (SLUB's lockless freelists)"),
    leaf1_ecx(
        "xsave",
        26,
        "xsave/xrstor (FPU state; AVX and AVX-512 go with it, the x87 state then uses fxsave)",
    ),
    leaf1_ecx("popcnt", 23, "popcnt (hweight alternatives)"),
    leaf7_ebx("smap", 20, "clac/stac (every kernel entry and user access)"),
    leaf1_ecx(
        "ssse3",
        9,
        "SSSE3 in ring 0 (BLAKE2s of the random number generator)",
    ),
    leaf1_ecx("sse4_1", 19, "SSE4.1 in ring 0 (crypto and checksum code)"),
    leaf1_ecx("sse4_2", 20, "crc32 in ring 0 (crc32c)"),
    leaf1_ecx("pclmulqdq", 1, "pclmulqdq in ring 0 (CRC and GHASH code)"),
    leaf1_ecx("aes", 25, "AES-NI in ring 0"),
    leaf7_ebx("sha_ni", 29, "SHA extensions in ring 0"),
    leaf7_ebx(
        "erms",
        9,
        "rep movsb/stosb, stepped a byte at a time (time only)",
    ),
    leaf7_edx("fsrm", 4, "rep movsb for short copies (time only)"),
    leaf7_ebx(
        "fsgsbase",
        0,
        "rdgsbase/wrgsbase (the kernel's paranoid entry and context switch)",
    ),
    // KVM's paravirtual IPI: our guest kernel's KVM_HC_SEND_IPI `vmcall` was re-executed by
    // the host's emulator forever (traced: vCPU 1 looping on `0f 01 c1` in __send_ipi_mask
    // while vCPU 0 waited for its IPI); without it Linux sends IPIs through the local APIC.
    // PV_UNHALT and PV_SCHED_YIELD stay: hiding them too made a 2-vCPU Debian boot spin on
    // locks (soft lockups) for more than twice as long.
    kvm_pv(
        "kvm_pv_send_ipi",
        11,
        "KVM_HC_SEND_IPI (vmcall) for every IPI to several CPUs",
    ),
];

/// Kernel parameters `nested-safe` adds because guest ring 0 runs at the emulator's pace
/// (about a microsecond an instruction): each removes boot work that is minutes there.
/// Later words of the user's override them.
pub const NESTED_SAFE_PARAMS: &[(&str, &str)] = &[
    (
        "cryptomgr.notests",
        "skip the crypto self-tests (RSA among them: minutes of emulated ring 0)",
    ),
    (
        "init_on_alloc=0",
        "do not zero every page the allocator hands out (Debian's default is 1)",
    ),
    (
        "initcall_blacklist=ftrace_check_for_weak_functions,trace_eval_init",
        "skip two tracing initcalls that are minutes here: ftrace's scan of every traced \
         function with a symbol lookup (it only keeps overridden weak functions out of \
         available_filter_functions) and the rewrite of every trace event's format with \
         enum values (formats then show the enum names); tracing itself works",
    ),
];

/// The model in force for a launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuModel {
    /// `host` or `nested-safe`.
    pub name: &'static str,
    /// Why this one (for `auto`, what was detected).
    pub why: String,
    /// Features hidden from the guest.
    pub hidden: &'static [Feature],
    /// Words the model puts on the guest's command line (before the user's, so a user can
    /// override them).
    pub cmdline: String,
    /// Whether SYSCALL is repaired (the host leaves it in ring 3).
    pub syscall_repair: bool,
}

/// Whether `/dev/kvm` is the nested kvm_pvm module.
pub fn host_is_kvm_pvm() -> bool {
    std::path::Path::new("/sys/module/kvm_pvm").exists()
}

/// Resolves a request on a host that is (or is not) kvm_pvm.
pub fn resolve(req: CpuModelRequest, kvm_pvm: bool) -> CpuModel {
    let nested = match req {
        CpuModelRequest::Auto => kvm_pvm,
        CpuModelRequest::Host => false,
        CpuModelRequest::NestedSafe => true,
    };
    let why = match (req, kvm_pvm) {
        (CpuModelRequest::Auto, true) => {
            "auto: /dev/kvm is the nested kvm_pvm module, whose emulator runs guest ring 0 \
             and refuses these instructions"
        }
        (CpuModelRequest::Auto, false) => "auto: guest ring 0 runs natively on this host",
        _ => "asked for",
    }
    .to_string();
    if !nested {
        return CpuModel {
            name: "host",
            why,
            hidden: &[],
            cmdline: String::new(),
            syscall_repair: false,
        };
    }
    let bits: Vec<String> = NESTED_SAFE_HIDDEN
        .iter()
        .filter_map(|f| f.linux.map(|n| n.to_string()))
        .collect();
    let params: Vec<&str> = NESTED_SAFE_PARAMS.iter().map(|(p, _)| *p).collect();
    CpuModel {
        name: "nested-safe",
        why,
        hidden: NESTED_SAFE_HIDDEN,
        cmdline: format!("clearcpuid={} {}", bits.join(","), params.join(" ")),
        syscall_repair: true,
    }
}

/// The guest's command line: the model's words, then the user's. Linux takes the last
/// `clearcpuid=` it finds, so a user's own `clearcpuid=` is folded into the model's (the
/// user's bits added to the model's, in one word, where the user's stood) rather than
/// replacing it; every other word of the user's stays as it is and, coming later, overrides
/// the model's.
pub fn command_line(model: &CpuModel, user: &str) -> String {
    let model_bits = model
        .cmdline
        .split_ascii_whitespace()
        .find_map(|w| w.strip_prefix("clearcpuid="));
    let user_has_one = user
        .split_ascii_whitespace()
        .any(|w| w.starts_with("clearcpuid="));
    if model_bits.is_none() || !user_has_one {
        // The user's line as it is (only trimmed), after the model's words.
        return [model.cmdline.as_str(), user.trim()]
            .into_iter()
            .filter(|p| !p.is_empty())
            .collect::<Vec<_>>()
            .join(" ");
    }
    // The model's other words first, then the user's with the merged clearcpuid=.
    let mut words: Vec<String> = model
        .cmdline
        .split_ascii_whitespace()
        .filter(|w| !w.starts_with("clearcpuid="))
        .map(str::to_string)
        .collect();
    let mut merged = false;
    for w in user.split_ascii_whitespace() {
        match (w.strip_prefix("clearcpuid="), model_bits) {
            (Some(theirs), Some(ours)) if !merged => {
                words.push(format!("clearcpuid={ours},{theirs}"));
                merged = true;
            }
            (Some(theirs), Some(_)) => {
                // A second clearcpuid= of the user's: its bits join the merged word.
                if let Some(m) = words.iter_mut().find(|x| x.starts_with("clearcpuid=")) {
                    m.push(',');
                    m.push_str(theirs);
                }
            }
            _ => words.push(w.to_string()),
        }
    }
    words.join(" ")
}

fn reg(e: &mut kvm_cpuid_entry2, r: Reg) -> &mut u32 {
    match r {
        Reg::Eax => &mut e.eax,
        Reg::Ebx => &mut e.ebx,
        Reg::Ecx => &mut e.ecx,
        Reg::Edx => &mut e.edx,
    }
}

impl CpuModel {
    /// Clears the hidden features in `entries`.
    pub fn apply(&self, entries: &mut [kvm_cpuid_entry2]) {
        for f in self.hidden {
            for e in entries
                .iter_mut()
                .filter(|e| e.function == f.leaf && e.index == f.subleaf)
            {
                *reg(e, f.reg) &= !(1u32 << f.bit);
            }
        }
    }

    /// The hidden features the host shows anyway in the CPUID it reports back.
    pub fn shown_anyway(&self, back: &[kvm_cpuid_entry2]) -> Vec<&'static str> {
        self.hidden
            .iter()
            .filter(|f| {
                back.iter()
                    .filter(|e| e.function == f.leaf && e.index == f.subleaf)
                    .any(|e| {
                        let mut e = *e;
                        *reg(&mut e, f.reg) & (1u32 << f.bit) != 0
                    })
            })
            .map(|f| f.name)
            .collect()
    }

    /// What the read-back of `shown_anyway` means for the guest: which features its command
    /// line still hides, and which stay visible to it (KVM's paravirtual ones, which Linux
    /// reads from CPUID only). `None` when the host showed none of them.
    pub fn shown_anyway_note(&self, shown_anyway: &[&str]) -> Option<String> {
        if shown_anyway.is_empty() {
            return None;
        }
        let (by_cmdline, visible): (Vec<&Feature>, Vec<&Feature>) = self
            .hidden
            .iter()
            .filter(|f| shown_anyway.contains(&f.name))
            .partition(|f| f.linux.is_some());
        let names = |v: &[&Feature]| v.iter().map(|f| f.name).collect::<Vec<_>>().join(" ");
        let mut parts = Vec::new();
        if !by_cmdline.is_empty() {
            parts.push(format!(
                "{}: the guest's command line hides it instead",
                names(&by_cmdline)
            ));
        }
        if !visible.is_empty() {
            parts.push(format!(
                "{}: NOT hidden, no kernel parameter hides it",
                names(&visible)
            ));
        }
        Some(format!(
            "KVM_GET_CPUID2 shows what the {} model hides: {}",
            self.name,
            parts.join("; ")
        ))
    }

    /// One line for the launch output: the model, why, what it hides and how.
    pub fn describe(&self, shown_anyway: &[&str]) -> String {
        if self.hidden.is_empty() {
            return format!("cpu model {} ({})", self.name, self.why);
        }
        let names: Vec<&str> = self.hidden.iter().map(|f| f.name).collect();
        let mut s = format!(
            "cpu model {} ({}): CPUID hides {}; the kernel command line gets {}",
            self.name,
            self.why,
            names.join(" "),
            self.cmdline
        );
        if !shown_anyway.is_empty() {
            s.push_str(&format!(
                " (the host shows {} in CPUID anyway)",
                shown_anyway.join(" ")
            ));
        }
        if self.syscall_repair {
            s.push_str("; SYSCALL repaired (the host leaves it in ring 3)");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_follows_the_host() {
        assert_eq!(resolve(CpuModelRequest::Auto, true).name, "nested-safe");
        assert_eq!(resolve(CpuModelRequest::Auto, false).name, "host");
        assert_eq!(resolve(CpuModelRequest::Host, true).name, "host");
        assert_eq!(
            resolve(CpuModelRequest::NestedSafe, false).name,
            "nested-safe"
        );
        assert!(resolve(CpuModelRequest::Host, true).cmdline.is_empty());
        assert!(!resolve(CpuModelRequest::Host, true).syscall_repair);
        assert_eq!("nested-safe".parse(), Ok(CpuModelRequest::NestedSafe));
        assert!("fast".parse::<CpuModelRequest>().is_err());
    }

    #[test]
    fn linux_numbers_are_word_times_32_plus_bit() {
        let m = resolve(CpuModelRequest::NestedSafe, true);
        let n = |name| {
            m.hidden
                .iter()
                .find(|f| f.name == name)
                .unwrap()
                .linux
                .unwrap()
        };
        // The numbers a 6.1 kernel printed back as "Clearing CPUID bits: cx16 popcnt smap".
        assert_eq!((n("cx16"), n("popcnt"), n("smap")), (141, 151, 308));
        assert_eq!(n("xsave"), 154);
        assert!(m.cmdline.starts_with("clearcpuid=141,154,151,308,"));
    }

    #[test]
    fn a_users_clearcpuid_adds_to_the_models() {
        let m = resolve(CpuModelRequest::NestedSafe, true);
        let ours = m.cmdline.clone();
        let (bits, params) = ours.split_once(' ').unwrap();
        assert_eq!(
            params,
            "cryptomgr.notests init_on_alloc=0 \
             initcall_blacklist=ftrace_check_for_weak_functions,trace_eval_init"
        );
        assert_eq!(command_line(&m, ""), ours);
        assert_eq!(
            command_line(&m, "console=ttyS0 quiet"),
            format!("{ours} console=ttyS0 quiet")
        );
        // Linux keeps only the last clearcpuid=: the user's bits join ours in one word.
        assert_eq!(
            command_line(
                &m,
                "console=ttyS0 clearcpuid=1 x=1 clearcpuid=2 init_on_alloc=1"
            ),
            format!("{params} console=ttyS0 {bits},1,2 x=1 init_on_alloc=1")
        );
        let host = resolve(CpuModelRequest::Host, true);
        assert_eq!(
            command_line(&host, " console=ttyS0  clearcpuid=297 "),
            "console=ttyS0  clearcpuid=297"
        );
        // Without a clearcpuid= of the user's, the user's line is kept byte for byte.
        assert_eq!(
            command_line(&m, "a  quoted=\"x  y\""),
            format!("{ours} a  quoted=\"x  y\"")
        );
    }

    #[test]
    fn apply_clears_only_the_hidden_bits_and_readback_finds_what_came_back() {
        let m = resolve(CpuModelRequest::NestedSafe, true);
        let mut e = [
            kvm_cpuid_entry2 {
                function: 1,
                ecx: u32::MAX,
                edx: u32::MAX,
                ..Default::default()
            },
            kvm_cpuid_entry2 {
                function: 7,
                index: 0,
                ebx: u32::MAX,
                edx: u32::MAX,
                ..Default::default()
            },
            kvm_cpuid_entry2 {
                function: 7,
                index: 1,
                ebx: u32::MAX,
                ..Default::default()
            },
            kvm_cpuid_entry2 {
                function: 0x4000_0001,
                eax: u32::MAX,
                edx: u32::MAX,
                ..Default::default()
            },
        ];
        m.apply(&mut e);
        let want1 = !((1 << 13) | (1 << 26) | (1 << 23) | (1 << 9) | (1 << 19) | (1 << 20))
            & !((1 << 1) | (1 << 25));
        assert_eq!(e[0].ecx, want1);
        assert_eq!(e[0].edx, u32::MAX);
        assert_eq!(
            e[1].ebx,
            !((1 << 20) | (1 << 29) | (1 << 9) | 1),
            "smap sha_ni erms fsgsbase"
        );
        assert_eq!(e[1].edx, !(1 << 4), "fsrm");
        assert_eq!(e[2].ebx, u32::MAX, "sub-leaf 1 untouched");
        assert_eq!(
            e[3].eax,
            !(1 << 11),
            "PV IPI only: PV spinlocks and yield stay"
        );
        assert_eq!(e[3].edx, u32::MAX, "KVM hints untouched");
        assert!(m.shown_anyway(&e).is_empty());
        assert_eq!(m.shown_anyway_note(&[]), None);
        // A host that puts POPCNT back.
        e[0].ecx |= 1 << 23;
        assert_eq!(m.shown_anyway(&e), ["popcnt"]);
        let d = m.describe(&["popcnt"]);
        assert!(d.contains("hides cx16 xsave popcnt smap"), "{d}");
        assert!(d.contains("shows popcnt in CPUID anyway"), "{d}");
        assert!(d.contains("SYSCALL repaired"), "{d}");
        // A host that shows PV IPIs again: no command line can hide those.
        e[3].eax |= 1 << 11;
        let note = m.shown_anyway_note(&m.shown_anyway(&e)).unwrap();
        assert!(
            note.contains("popcnt: the guest's command line hides it instead"),
            "{note}"
        );
        assert!(note.contains("kvm_pv_send_ipi: NOT hidden"), "{note}");
        // Paravirtual features have no clearcpuid= number.
        assert!(!m.cmdline.contains(",,"), "{}", m.cmdline);
    }
}
