//! What KVM's own view says about the idle plan after the guest ran: the CPUID the vCPUs
//! were left with, and each vCPU's halt statistics. Typed facts (for `launch --json`, the
//! benchmarks and the tests) with the sentences the launch prints made from them.

use std::collections::BTreeMap;

use kvm_bindings::kvm_cpuid_entry2;
use serde::Serialize;

use crate::cpu::cpuid::{KVM_HINTS_REALTIME, LEAF1_ECX_MONITOR};
use crate::cpu::guest_idle::{GuestIdle, IdleCpuidView, predict, vendor_string};
use crate::cpu::idle::{DisableExits, IdlePlan};

/// One setting: what KVM shows, and what the plan asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Fact {
    /// What KVM shows.
    pub got: bool,
    /// What the plan asked for.
    pub want: bool,
    /// `got == want`.
    pub held: bool,
}

impl Fact {
    fn new(got: bool, want: bool) -> Self {
        Self {
            got,
            want,
            held: got == want,
        }
    }

    fn verdict(self) -> &'static str {
        if self.held {
            "as set"
        } else {
            "NOT as set: the host changed it"
        }
    }
}

/// The idle-related CPUID bits as KVM_GET_CPUID2 returned them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CpuidReadback {
    /// MONITOR/MWAIT shown (leaf 1 ECX bit 3).
    pub mwait: Fact,
    /// Leaf 5 (MONITOR/MWAIT parameters) present.
    pub leaf5: Fact,
    /// The host's own leaf 5 `[eax, ebx, ecx, edx]`, which the guest's is made from.
    pub host_leaf5: Option<[u32; 4]>,
    /// The guest's leaf 5 as KVM gave it back.
    pub guest_leaf5: Option<[u32; 4]>,
    /// KVM_HINTS_REALTIME set in the KVM features leaf.
    pub hints_realtime: Fact,
    /// The loop a stock Linux guest (6.0 on) idles in with this CPUID and command line,
    /// when no cpuidle driver takes over, and why.
    pub guest_idle: GuestIdle,
}

/// The idle-related words of `cpuid` (as KVM returned it).
fn view(c: &[kvm_cpuid_entry2]) -> IdleCpuidView {
    let find = |f: u32| c.iter().find(|e| e.function == f);
    let amd = find(0).is_some_and(|e| &vendor_string([e.ebx, e.edx, e.ecx]) == b"AuthenticAMD");
    let family = find(1).map_or(0, |e| {
        let base = (e.eax >> 8) & 0xf;
        if base == 0xf {
            base + ((e.eax >> 20) & 0xff)
        } else {
            base
        }
    });
    IdleCpuidView {
        amd,
        family,
        monitor: find(1).is_some_and(|e| e.ecx & LEAF1_ECX_MONITOR != 0),
        leaf5: find(5).map(|e| [e.eax, e.ebx, e.ecx, e.edx]),
    }
}

/// What the halt statistics say about the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HaltVerdict {
    /// HLT exits were disabled and none happened.
    NoHltExits,
    /// HLT exits were disabled, yet the guest's HLTs exited: the host ignores the setting.
    HltExitsDespiteDisable,
    /// HLT exits are allowed.
    HltExitsAllowed,
}

/// What the halt-polling statistics say about the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PollVerdict {
    /// Polling was set to 0 and KVM did not poll over the halts.
    OffAsSet,
    /// Polling was set to 0, yet KVM polled.
    PolledDespiteOff,
    /// The host's own halt polling is in force (the plan did not set it).
    HostPolling,
    /// Nothing to say (no halts, or a setting that the counters cannot confirm).
    Unknown,
}

/// One vCPU's halt statistics (KVM_GET_STATS_FD) and what they say.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct HaltReadback {
    /// vCPU index.
    pub vcpu: usize,
    /// `halt_exits`.
    pub halt_exits: u64,
    /// `halt_attempted_poll`.
    pub halt_attempted_poll: u64,
    /// `halt_successful_poll`.
    pub halt_successful_poll: u64,
    /// `halt_wakeup`.
    pub halt_wakeup: u64,
    /// HLT exits.
    pub hlt: HaltVerdict,
    /// Halt polling.
    pub polling: PollVerdict,
}

/// The whole read-back.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Readback {
    /// CPUID, when the vCPUs' CPUID could be read back.
    pub cpuid: Option<CpuidReadback>,
    /// Per vCPU, for the vCPUs whose statistics have the halt counters.
    pub vcpus: Vec<HaltReadback>,
}

impl Readback {
    /// Reads `cpuid` (the boot vCPU's, as KVM returned it) and each vCPU's statistics
    /// (`(index, stats by name)`) against `plan`. `host_leaf5` is the host's own leaf 5
    /// (none when it has no MONITOR); `cmdline` the guest's whole command line.
    pub fn new<'a>(
        plan: &IdlePlan,
        cpuid: Option<&[kvm_cpuid_entry2]>,
        host_leaf5: Option<[u32; 4]>,
        cmdline: &str,
        vcpus: impl IntoIterator<Item = (usize, &'a BTreeMap<String, u64>)>,
    ) -> Self {
        let cpuid = cpuid.map(|c| {
            let find = |f: u32| c.iter().find(|e| e.function == f);
            CpuidReadback {
                mwait: Fact::new(
                    find(1).is_some_and(|e| e.ecx & LEAF1_ECX_MONITOR != 0),
                    plan.expose_mwait,
                ),
                leaf5: Fact::new(find(5).is_some(), plan.expose_mwait && host_leaf5.is_some()),
                host_leaf5,
                guest_leaf5: find(5).map(|e| [e.eax, e.ebx, e.ecx, e.edx]),
                hints_realtime: Fact::new(
                    find(0x4000_0001).is_some_and(|e| e.edx & KVM_HINTS_REALTIME != 0),
                    plan.hints_realtime,
                ),
                guest_idle: predict(view(c), cmdline),
            }
        });
        let hlt_disabled = plan.disable_exits.contains(DisableExits::HLT);
        let vcpus = vcpus
            .into_iter()
            .filter_map(|(vcpu, kvm)| {
                let halt_exits = *kvm.get("halt_exits")?;
                let halt_attempted_poll = *kvm.get("halt_attempted_poll")?;
                let get = |k: &str| kvm.get(k).copied().unwrap_or(0);
                let hlt = match (hlt_disabled, halt_exits > 0) {
                    (true, true) => HaltVerdict::HltExitsDespiteDisable,
                    (true, false) => HaltVerdict::NoHltExits,
                    (false, _) => HaltVerdict::HltExitsAllowed,
                };
                let polling = match plan.halt_poll_ns {
                    Some(0) if halt_attempted_poll > 0 => PollVerdict::PolledDespiteOff,
                    Some(0) if halt_exits > 0 => PollVerdict::OffAsSet,
                    None if halt_exits > 0 => PollVerdict::HostPolling,
                    _ => PollVerdict::Unknown,
                };
                Some(HaltReadback {
                    vcpu,
                    halt_exits,
                    halt_attempted_poll,
                    halt_successful_poll: get("halt_successful_poll"),
                    halt_wakeup: get("halt_wakeup"),
                    hlt,
                    polling,
                })
            })
            .collect();
        Self { cpuid, vcpus }
    }

    /// The read-back as sentences, each a fact and whether it held.
    pub fn lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(c) = &self.cpuid {
            out.push(format!(
                "KVM_GET_CPUID2: MONITOR/MWAIT {} ({}), leaf 5 {} ({}), KVM_HINTS_REALTIME {} ({})",
                if c.mwait.got { "shown" } else { "hidden" },
                c.mwait.verdict(),
                if c.leaf5.got { "present" } else { "absent" },
                c.leaf5.verdict(),
                if c.hints_realtime.got { "set" } else { "clear" },
                c.hints_realtime.verdict(),
            ));
            let leaf = |l: Option<[u32; 4]>| {
                l.map_or("none".to_string(), |[_, _, c, d]| {
                    format!("ECX={c:#x} EDX={d:#x}")
                })
            };
            out.push(format!(
                "leaf 5: the host's {}, the guest's {}",
                leaf(c.host_leaf5),
                leaf(c.guest_leaf5),
            ));
            out.push(format!(
                "a Linux guest (6.0 on) idles in {} without a cpuidle driver: {}",
                match c.guest_idle.routine {
                    crate::cpu::guest_idle::IdleRoutine::Mwait => "MWAIT",
                    crate::cpu::guest_idle::IdleRoutine::Hlt => "HLT",
                    crate::cpu::guest_idle::IdleRoutine::Poll => "a polling loop",
                },
                c.guest_idle.why
            ));
        }
        for v in &self.vcpus {
            let mut line = format!(
                "vcpu{} stats: halt_exits={} halt_attempted_poll={} halt_successful_poll={} halt_wakeup={}",
                v.vcpu, v.halt_exits, v.halt_attempted_poll, v.halt_successful_poll, v.halt_wakeup,
            );
            match v.hlt {
                HaltVerdict::HltExitsDespiteDisable => line.push_str(
                    "; HLT exits were disabled, yet the guest's HLTs exited: this host accepts the setting and ignores it",
                ),
                HaltVerdict::NoHltExits => line.push_str("; no HLT exits, as set"),
                HaltVerdict::HltExitsAllowed => {}
            }
            match v.polling {
                PollVerdict::OffAsSet => {
                    line.push_str("; halt polling off: no polls over those halts, as set")
                }
                PollVerdict::PolledDespiteOff => {
                    line.push_str("; halt polling was set to 0, yet KVM polled")
                }
                PollVerdict::HostPolling => line.push_str("; host halt polling in force (shared)"),
                PollVerdict::Unknown => {}
            }
            out.push(line);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::idle::IdlePolicy;

    fn plan() -> IdlePlan {
        IdlePlan {
            policy: IdlePolicy::Hlt,
            reason: String::new(),
            disable_exits: DisableExits::HLT,
            halt_poll_ns: Some(0),
            expose_mwait: false,
            hints_realtime: true,
            cmdline: "",
        }
    }

    fn stats(halts: u64, polls: u64) -> BTreeMap<String, u64> {
        [
            ("halt_exits".to_string(), halts),
            ("halt_attempted_poll".to_string(), polls),
            ("halt_wakeup".to_string(), 3),
        ]
        .into_iter()
        .collect()
    }

    fn entry(function: u32, ecx: u32, edx: u32) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 {
            function,
            ecx,
            edx,
            ..Default::default()
        }
    }

    #[test]
    fn each_fact_says_whether_it_held() {
        let quiet = Readback::new(&plan(), None, None, "", [(0, &stats(0, 0))]);
        assert_eq!(quiet.vcpus[0].hlt, HaltVerdict::NoHltExits);
        assert_eq!(quiet.vcpus[0].halt_wakeup, 3);
        assert!(
            quiet.lines()[0].ends_with("; no HLT exits, as set"),
            "{:?}",
            quiet.lines()
        );
        let ignored = Readback::new(&plan(), None, None, "", [(0, &stats(5, 0))]);
        assert_eq!(
            (ignored.vcpus[0].hlt, ignored.vcpus[0].polling),
            (HaltVerdict::HltExitsDespiteDisable, PollVerdict::OffAsSet)
        );
        let l = &ignored.lines()[0];
        assert!(
            l.contains("yet the guest's HLTs exited")
                && l.contains("no polls over those halts, as set"),
            "{l}"
        );
        let polled = Readback::new(&plan(), None, None, "", [(1, &stats(5, 2))]);
        assert_eq!(polled.vcpus[0].polling, PollVerdict::PolledDespiteOff);
        assert!(polled.lines()[0].starts_with("vcpu1 stats: halt_exits=5"));
        // A vCPU without the halt counters says nothing.
        let none = Readback::new(&plan(), None, None, "", [(0, &BTreeMap::new())]);
        assert!(none.vcpus.is_empty() && none.lines().is_empty());
    }

    #[test]
    fn cpuid_facts_compare_with_the_plan() {
        // MWAIT shown although the plan hid it; hints set as asked.
        let c = [
            entry(1, LEAF1_ECX_MONITOR, 0),
            entry(0x4000_0001, 0, KVM_HINTS_REALTIME),
        ];
        let r = Readback::new(&plan(), Some(&c), Some([0; 4]), "", []);
        let cp = r.cpuid.clone().unwrap();
        assert_eq!(cp.mwait, Fact::new(true, false));
        assert!(!cp.mwait.held && cp.hints_realtime.held && cp.leaf5.held);
        let l = &r.lines()[0];
        assert!(
            l.contains("MONITOR/MWAIT shown (NOT as set: the host changed it)")
                && l.contains("KVM_HINTS_REALTIME set (as set)"),
            "{l}"
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["cpuid"]["mwait"]["held"], false);
        // No leaf 5 entry reads as zeros: MWAIT; the sentence and --json say so.
        assert_eq!(json["cpuid"]["guest_idle"]["routine"], "mwait");
        assert_eq!(
            r.lines()[1],
            "leaf 5: the host's ECX=0x0 EDX=0x0, the guest's none"
        );
        assert!(r.lines()[2].starts_with("a Linux guest (6.0 on) idles in MWAIT"));
    }

    #[test]
    fn the_guest_idle_is_read_from_the_cpuid_kvm_gave_back() {
        let vendor = kvm_cpuid_entry2 {
            function: 0,
            ebx: u32::from_le_bytes(*b"Auth"),
            edx: u32::from_le_bytes(*b"enti"),
            ecx: u32::from_le_bytes(*b"cAMD"),
            ..Default::default()
        };
        // Family 0x17 (base 0xf + extended 0x8), MONITOR, AMD's raw leaf 5.
        let mut l1 = entry(1, LEAF1_ECX_MONITOR, 0);
        l1.eax = (0x8 << 20) | (0xf << 8);
        let mut l5 = entry(5, 3, 0);
        l5.eax = 64;
        let raw = [vendor, l1, l5];
        let r = Readback::new(
            &plan(),
            Some(&raw),
            Some([64, 0, 3, 0]),
            "console=ttyS0",
            [],
        );
        let g = r.cpuid.unwrap().guest_idle;
        assert_eq!(g.routine, crate::cpu::guest_idle::IdleRoutine::Hlt);
        assert!(g.why.contains("no C1 sub-state"), "{}", g.why);
        // The leaf we show (one C1 sub-state): MWAIT, unless the command line says no.
        let shown = [vendor, l1, entry(5, 3, 0x10)];
        let r = Readback::new(&plan(), Some(&shown), Some([64, 0, 3, 0]), "", []);
        assert_eq!(
            r.cpuid.unwrap().guest_idle.routine,
            crate::cpu::guest_idle::IdleRoutine::Mwait
        );
        let r = Readback::new(
            &plan(),
            Some(&shown),
            Some([64, 0, 3, 0]),
            "idle=nomwait",
            [],
        );
        assert_eq!(
            r.cpuid.unwrap().guest_idle.routine,
            crate::cpu::guest_idle::IdleRoutine::Hlt
        );
        // AMD family 0x10 (base 0xf + extended 1): erratum 400.
        l1.eax = (0x1 << 20) | (0xf << 8);
        let r = Readback::new(
            &plan(),
            Some(&[vendor, l1, entry(5, 3, 0x10)]),
            Some([64, 0, 3, 0]),
            "",
            [],
        );
        assert!(r.cpuid.unwrap().guest_idle.why.contains("erratum 400"));
    }
}
