//! Interrupt delivery that hardware can take: APICv (Intel), AVIC and x2AVIC (AMD), IPI
//! virtualization (Intel's IPIv). What the host's KVM has on, read from its module
//! parameters, and a VM made so that nothing of ours gives KVM a reason to turn it off
//! (docs/idle.md, "Interrupt delivery hardware can take").
//!
//! Linux 6.1 (Debian's; `enum kvm_apicv_inhibit` in arch/x86/include/asm/kvm_host.h) turns
//! APIC virtualization off for a whole VM ("inhibits" it) for reasons a VMM controls:
//! - an in-kernel PIT in reinject mode (`APICV_INHIBIT_REASON_PIT_REINJ`, AMD only):
//!   KVM_CREATE_PIT2 starts the PIT in it (i8254.c); KVM_REINJECT_CONTROL ends it;
//! - no in-kernel irqchip (`ABSENT`): ours always has one;
//! - an APIC ID or APIC base changed from its reset value (`APIC_ID_MODIFIED`,
//!   `APIC_BASE_MODIFIED`): we write a vCPU's LAPIC once, for its LINT0/LINT1 modes, with
//!   the ID KVM gave it, and `KVM_CAP_X2APIC_API`'s 32-bit IDs keep KVM_SET_LAPIC from
//!   rewriting an x2APIC ID;
//! - `KVM_GUESTDBG_BLOCKIRQ` (`BLOCKIRQ`): never set.
//!
//! Not an inhibit but a cost: on AMD without x2AVIC, a vCPU in x2APIC mode runs "hybrid"
//! AVIC, its x2APIC MSR accesses intercepted (`avic_activate_vmcb`, svm/avic.c), an IPI's
//! ICR write among them; in xAPIC mode AVIC takes the ICR write. So where the host's AVIC is
//! on and x2AVIC is not, the guest is shown no x2APIC. And `KVM_CAP_MAX_VCPU_ID` sized to
//! the partition sizes Intel IPIv's PID-pointer table to it (`vmx_get_pid_table_order`,
//! vmx.c), not to KVM_MAX_VCPU_IDS (4,096 IDs in 6.1).

use std::path::Path;

use serde::Serialize;

/// CPUID leaf 1 ECX bit 21: x2APIC.
pub const LEAF1_ECX_X2APIC: u32 = 1 << 21;
/// CPUID 0x8000000A (SVM features) EDX bit 18: x2AVIC (`X86_FEATURE_X2AVIC`).
pub const SVM_EDX_X2AVIC: u32 = 1 << 18;

/// What the host's KVM has on for APIC virtualization.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct HostApicAccel {
    /// The vendor KVM module loaded: `kvm_intel`, `kvm_amd`, another (`kvm_pvm`), or none.
    pub module: Option<String>,
    /// APICv (kvm_intel's `enable_apicv`) or AVIC (kvm_amd's `avic`); both parameters
    /// read false when the hardware lacks it (KVM clears them at load). None: the module
    /// has no such parameter.
    pub apicv: Option<bool>,
    /// AMD: AVIC on and the CPU's x2AVIC (CPUID 0x8000000A EDX bit 18), which KVM then
    /// uses for guests in x2APIC mode.
    pub x2avic: Option<bool>,
    /// Intel: IPI virtualization (kvm_intel's `enable_ipiv`, Linux 5.19 on).
    pub ipiv: Option<bool>,
    /// The same in words.
    pub summary: String,
}

/// Reads the host's KVM APIC virtualization from the module tree `sys_module`
/// (/sys/module) and, on AMD, the host's CPUID 0x8000000A EDX (`svm_edx`).
pub fn host_accel(sys_module: &Path, svm_edx: Option<u32>) -> HostApicAccel {
    let param = |m: &str, p: &str| -> Option<bool> {
        let s = std::fs::read_to_string(sys_module.join(m).join("parameters").join(p)).ok()?;
        match s.trim() {
            "Y" | "y" | "1" => Some(true),
            "N" | "n" | "0" => Some(false),
            _ => None,
        }
    };
    let yes_no = |b: Option<bool>| match b {
        Some(true) => "on",
        Some(false) => "off",
        None => "unknown",
    };
    if sys_module.join("kvm_intel").is_dir() {
        let apicv = param("kvm_intel", "enable_apicv");
        let ipiv = param("kvm_intel", "enable_ipiv");
        return HostApicAccel {
            module: Some("kvm_intel".into()),
            apicv,
            x2avic: None,
            ipiv,
            summary: format!(
                "kvm_intel: APICv {}, IPI virtualization {}",
                yes_no(apicv),
                yes_no(ipiv)
            ),
        };
    }
    if sys_module.join("kvm_amd").is_dir() {
        let apicv = param("kvm_amd", "avic");
        let x2avic = apicv.map(|on| on && svm_edx.is_some_and(|d| d & SVM_EDX_X2AVIC != 0));
        return HostApicAccel {
            module: Some("kvm_amd".into()),
            apicv,
            x2avic,
            ipiv: None,
            summary: format!("kvm_amd: AVIC {}, x2AVIC {}", yes_no(apicv), yes_no(x2avic)),
        };
    }
    let other = std::fs::read_dir(sys_module).ok().and_then(|d| {
        let mut names: Vec<String> = d
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with("kvm_"))
            .collect();
        names.sort();
        names.into_iter().next()
    });
    let summary = match &other {
        Some(m) => format!("{m}: no APIC virtualization this VMM knows of (no APICv/AVIC)"),
        None => "no vendor KVM module loaded".into(),
    };
    HostApicAccel {
        module: other,
        summary,
        ..Default::default()
    }
}

/// This host's: /sys/module and, on an AMD CPU that has the leaf, CPUID 0x8000000A EDX.
/// Read once a process (module parameters are fixed while the module is loaded), so a
/// launch's VM creation reads no sysfs file for it.
pub fn host_accel_here() -> HostApicAccel {
    static HERE: std::sync::OnceLock<HostApicAccel> = std::sync::OnceLock::new();
    HERE.get_or_init(|| host_accel(Path::new("/sys/module"), host_svm_edx()))
        .clone()
}

fn host_svm_edx() -> Option<u32> {
    let l0 = core::arch::x86_64::__cpuid(0);
    let vendor = crate::cpu::guest_idle::vendor_string([l0.ebx, l0.edx, l0.ecx]);
    if &vendor != b"AuthenticAMD" && &vendor != b"HygonGenuine" {
        return None;
    }
    let max = core::arch::x86_64::__cpuid(0x8000_0000).eax;
    (max >= 0x8000_000a).then(|| core::arch::x86_64::__cpuid(0x8000_000a).edx)
}

/// Whether a guest of this host is shown x2APIC: not where AVIC is on without x2AVIC
/// (there x2APIC mode would intercept each IPI's ICR write that xAPIC mode's AVIC takes).
pub fn show_x2apic(host: &HostApicAccel) -> bool {
    !(host.module.as_deref() == Some("kvm_amd")
        && host.apicv == Some(true)
        && host.x2avic != Some(true))
}

/// What this VM did so that KVM has no reason of ours to inhibit APIC virtualization, for
/// the launch report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct VmApic {
    /// The host's side.
    pub host: HostApicAccel,
    /// The in-kernel PIT's reinject mode: false once KVM_REINJECT_CONTROL ended it; None
    /// where KVM lacks KVM_CAP_REINJECT_CONTROL (the PIT then stays in it).
    pub pit_reinject: Option<bool>,
    /// `KVM_CAP_X2APIC_API` enabled with 32-bit APIC IDs (and no broadcast quirk).
    pub x2apic_api: bool,
    /// `KVM_CAP_MAX_VCPU_ID` as set (one past the highest vCPU ID); None where KVM lacks it.
    pub max_vcpu_id: Option<u32>,
    /// Whether the guest is shown x2APIC ([`show_x2apic`]).
    pub x2apic_shown: bool,
    /// Whether this VM's APIC virtualization is active: KVM (6.1) reports it to userspace
    /// nowhere, so always None; `why_unknown` says where to look.
    pub active: Option<bool>,
    /// Why `active` is unknown.
    pub why_unknown: &'static str,
}

/// Why [`VmApic::active`] is unknown.
pub const ACTIVE_UNKNOWN: &str = "KVM exposes no per-VM APICv/AVIC state to userspace; its \
    kvm:kvm_apicv_inhibit_changed tracepoint shows each inhibit set or cleared";

impl VmApic {
    /// One sentence for the launch report.
    pub fn sentence(&self) -> String {
        let reinject = match self.pit_reinject {
            Some(false) => "PIT reinject off",
            Some(true) => "PIT reinject ON (inhibits AVIC)",
            None => "PIT reinject control unavailable",
        };
        format!(
            "APIC virtualization: {}; this VM: {reinject}, {}, max vCPU ID {}, x2APIC {}",
            self.host.summary,
            if self.x2apic_api {
                "32-bit x2APIC IDs"
            } else {
                "no KVM_CAP_X2APIC_API"
            },
            self.max_vcpu_id.map_or("unset".into(), |n| n.to_string()),
            if self.x2apic_shown {
                "shown"
            } else {
                "hidden (AVIC without x2AVIC)"
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A made-up /sys/module, removed when dropped.
    struct Tree(std::path::PathBuf);

    impl Tree {
        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn tree(modules: &[(&str, &[(&str, &str)])]) -> Tree {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let d = std::env::temp_dir().join(format!("apic-modules-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        for (m, params) in modules {
            let p = d.join(m).join("parameters");
            std::fs::create_dir_all(&p).unwrap();
            for (k, v) in *params {
                std::fs::write(p.join(k), format!("{v}\n")).unwrap();
            }
        }
        Tree(d)
    }

    #[test]
    fn intel_reads_apicv_and_ipiv() {
        let t = tree(&[
            ("kvm", &[("halt_poll_ns", "0")]),
            ("kvm_intel", &[("enable_apicv", "Y"), ("enable_ipiv", "N")]),
        ]);
        let h = host_accel(t.path(), None);
        assert_eq!(h.module.as_deref(), Some("kvm_intel"));
        assert_eq!((h.apicv, h.ipiv, h.x2avic), (Some(true), Some(false), None));
        assert!(
            h.summary.contains("APICv on, IPI virtualization off"),
            "{}",
            h.summary
        );
        assert!(show_x2apic(&h));
    }

    #[test]
    fn an_older_intel_module_without_ipiv_says_unknown() {
        let t = tree(&[("kvm_intel", &[("enable_apicv", "1")])]);
        let h = host_accel(t.path(), None);
        assert_eq!((h.apicv, h.ipiv), (Some(true), None));
        assert!(
            h.summary.contains("IPI virtualization unknown"),
            "{}",
            h.summary
        );
    }

    #[test]
    fn amd_x2avic_needs_avic_on_and_the_cpu_bit() {
        let t = tree(&[("kvm_amd", &[("avic", "Y")])]);
        let with = host_accel(t.path(), Some(SVM_EDX_X2AVIC | 1 << 13));
        assert_eq!((with.apicv, with.x2avic), (Some(true), Some(true)));
        assert!(show_x2apic(&with), "x2AVIC takes x2APIC mode's ICR writes");
        let without = host_accel(t.path(), Some(1 << 13));
        assert_eq!((without.apicv, without.x2avic), (Some(true), Some(false)));
        assert!(
            !show_x2apic(&without),
            "hybrid AVIC would intercept ICR writes"
        );
        let t = tree(&[("kvm_amd", &[("avic", "N")])]);
        let off = host_accel(t.path(), Some(SVM_EDX_X2AVIC));
        assert_eq!((off.apicv, off.x2avic), (Some(false), Some(false)));
        assert!(show_x2apic(&off), "nothing to keep when AVIC is off");
        assert_eq!(off.summary, "kvm_amd: AVIC off, x2AVIC off");
    }

    #[test]
    fn garbage_in_a_parameter_reads_as_unknown() {
        let t = tree(&[("kvm_amd", &[("avic", "maybe")])]);
        let h = host_accel(t.path(), Some(SVM_EDX_X2AVIC));
        assert_eq!((h.apicv, h.x2avic), (None, None));
        assert!(show_x2apic(&h));
    }

    #[test]
    fn another_kvm_module_is_named_with_nothing_to_accelerate() {
        let t = tree(&[("kvm", &[]), ("kvm_pvm", &[])]);
        let h = host_accel(t.path(), None);
        assert_eq!(h.module.as_deref(), Some("kvm_pvm"));
        assert_eq!((h.apicv, h.ipiv, h.x2avic), (None, None, None));
        assert!(h.summary.starts_with("kvm_pvm: no APIC virtualization"));
        let empty = tree(&[]);
        assert_eq!(host_accel(empty.path(), None).module, None);
    }

    #[test]
    fn the_sentence_names_each_choice() {
        let v = VmApic {
            host: HostApicAccel {
                summary: "kvm_amd: AVIC on, x2AVIC off".into(),
                ..Default::default()
            },
            pit_reinject: Some(false),
            x2apic_api: true,
            max_vcpu_id: Some(2),
            x2apic_shown: false,
            active: None,
            why_unknown: ACTIVE_UNKNOWN,
        };
        let s = v.sentence();
        for want in [
            "AVIC on",
            "PIT reinject off",
            "32-bit x2APIC IDs",
            "max vCPU ID 2",
            "x2APIC hidden",
        ] {
            assert!(s.contains(want), "{want}: {s}");
        }
    }
}
