//! Idle policies: what an idle vCPU of a partition does, and what KVM must be told for it.
//!
//! | policy | KVM | guest sees |
//! |---|---|---|
//! | `mwait` | disable MWAIT, HLT, PAUSE, CSTATE exits; halt-poll 0 | MONITOR/MWAIT, leaf 5, KVM_HINTS_REALTIME |
//! | `hlt` | disable HLT, PAUSE exits; halt-poll 0 | HLT that no longer exits, KVM_HINTS_REALTIME |
//! | `haltpoll` | HLT exits, halt-poll 0 | KVM_HINTS_REALTIME (cpuidle-haltpoll spins first) |
//! | `poll` | as haltpoll | `idle=poll` on its command line |
//! | `shared` | KVM defaults (HLT exits, host halt polling) | plain HLT |
//!
//! Capabilities are probed, never assumed; an explicit policy the host cannot give is an
//! error naming what is missing, never a silent downgrade. `auto` takes the best the host
//! offers and says why. Resolution is pure, so it is tested with synthetic capabilities.

use std::fmt;

bitflags::bitflags! {
    /// Exits KVM can be told not to take (`KVM_CAP_X86_DISABLE_EXITS`); bits from
    /// kvm-bindings.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub struct DisableExits: u32 {
        /// `KVM_X86_DISABLE_EXITS_MWAIT`.
        const MWAIT = kvm_bindings::KVM_X86_DISABLE_EXITS_MWAIT;
        /// `KVM_X86_DISABLE_EXITS_HLT`.
        const HLT = kvm_bindings::KVM_X86_DISABLE_EXITS_HLT;
        /// `KVM_X86_DISABLE_EXITS_PAUSE`.
        const PAUSE = kvm_bindings::KVM_X86_DISABLE_EXITS_PAUSE;
        /// `KVM_X86_DISABLE_EXITS_CSTATE`.
        const CSTATE = kvm_bindings::KVM_X86_DISABLE_EXITS_CSTATE;
    }
}

impl fmt::Display for DisableExits {
    /// `HLT|PAUSE`, or `none`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("none");
        }
        let names: Vec<&str> = self.iter_names().map(|(n, _)| n).collect();
        f.write_str(&names.join("|"))
    }
}

/// An idle policy as asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IdlePolicy {
    /// The best the host offers.
    #[default]
    Auto,
    /// MWAIT passthrough.
    Mwait,
    /// HLT without exits.
    Hlt,
    /// HLT exits, no host halt polling, guest haltpoll.
    Haltpoll,
    /// The guest never idles.
    Poll,
    /// KVM defaults.
    Shared,
}

impl IdlePolicy {
    /// All policies, `auto` first.
    pub const ALL: [IdlePolicy; 6] = [
        Self::Auto,
        Self::Mwait,
        Self::Hlt,
        Self::Haltpoll,
        Self::Poll,
        Self::Shared,
    ];

    /// Parses a policy name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == s)
    }

    /// The name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Mwait => "mwait",
            Self::Hlt => "hlt",
            Self::Haltpoll => "haltpoll",
            Self::Poll => "poll",
            Self::Shared => "shared",
        }
    }
}

impl fmt::Display for IdlePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the host's KVM offers for idling.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IdleCaps {
    /// `KVM_CAP_X86_DISABLE_EXITS`: the exits it will disable.
    pub disable_exits: DisableExits,
    /// `KVM_CAP_HALT_POLL`: per-VM halt polling can be set.
    pub halt_poll: bool,
    /// The host CPU has MONITOR/MWAIT (raw CPUID leaf 1 ECX bit 3).
    pub host_mwait: bool,
    /// The host's halt_poll_ns module default, if readable.
    pub host_halt_poll_ns: Option<u64>,
    /// The host accepts HLT exit-disabling and ignores it: its guests' HLTs exit anyway
    /// (the nested kvm_pvm module, as every launch's read-back there shows: docs/idle.md,
    /// "What KVM says back").
    pub hlt_exits_ignored: bool,
}

/// Why a policy cannot be had.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdleError {
    /// The host lacks something the policy needs.
    #[error("--idle {policy}: this host cannot give it: {missing}")]
    Missing {
        /// The policy.
        policy: IdlePolicy,
        /// What is missing.
        missing: String,
    },
}

/// What a resolved policy asks of KVM and shows the guest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdlePlan {
    /// The policy in force (never `Auto`).
    pub policy: IdlePolicy,
    /// Why (for `auto`, why this one).
    pub reason: String,
    /// Exits to disable (empty: none).
    pub disable_exits: DisableExits,
    /// Per-VM halt polling to set (None: leave the host default).
    pub halt_poll_ns: Option<u32>,
    /// Expose MONITOR/MWAIT and leaf 5 in CPUID.
    pub expose_mwait: bool,
    /// Set KVM_HINTS_REALTIME (dedicated cores).
    pub hints_realtime: bool,
    /// Words to append to the guest's command line.
    pub cmdline: &'static str,
}

/// What the `mwait` policy adds to a guest's command line: no cpuidle driver, so a Linux
/// guest idles in the architecture's own loop (MWAIT where it prefers it, else HLT), with
/// no exit either way.
pub const MWAIT_GUEST_CMDLINE: &str = "cpuidle.off=1";

fn missing(policy: IdlePolicy, what: Vec<String>) -> Result<(), IdleError> {
    if what.is_empty() {
        Ok(())
    } else {
        Err(IdleError::Missing {
            policy,
            missing: what.join("; "),
        })
    }
}

/// Resolves `policy` against `caps`.
pub fn resolve(policy: IdlePolicy, caps: &IdleCaps) -> Result<IdlePlan, IdleError> {
    let offered = caps.disable_exits;
    let (mwait, hlt, pause, cstate) = (
        DisableExits::MWAIT,
        DisableExits::HLT,
        DisableExits::PAUSE,
        DisableExits::CSTATE,
    );
    let policy_reason = match policy {
        IdlePolicy::Auto => {
            let (p, why) = if offered.contains(mwait | hlt) && caps.halt_poll && caps.host_mwait {
                (
                    IdlePolicy::Mwait,
                    format!("the host disables {offered} exits and has MONITOR/MWAIT"),
                )
            } else if offered.contains(hlt) && caps.halt_poll {
                (
                    IdlePolicy::Hlt,
                    format!(
                        "the host disables {offered} exits{}",
                        if !offered.contains(mwait) {
                            ", not MWAIT"
                        } else {
                            "; its CPU lacks MONITOR/MWAIT"
                        }
                    ),
                )
            } else if caps.halt_poll {
                (
                    IdlePolicy::Haltpoll,
                    format!(
                        "the host disables no HLT exits (offers {offered}) but can turn halt polling off"
                    ),
                )
            } else {
                (
                    IdlePolicy::Shared,
                    "the host offers neither exit disabling nor per-VM halt polling".into(),
                )
            };
            return resolve(p, caps).map(|mut plan| {
                plan.reason = format!("auto: {why}");
                plan
            });
        }
        p => p,
    };
    let mut need = Vec::new();
    let want_exits = match policy_reason {
        IdlePolicy::Mwait => mwait | hlt | pause | cstate,
        IdlePolicy::Hlt => hlt | pause,
        _ => DisableExits::empty(),
    };
    let required = match policy_reason {
        IdlePolicy::Mwait => mwait | hlt,
        IdlePolicy::Hlt => hlt,
        _ => DisableExits::empty(),
    };
    if !offered.contains(required) {
        need.push(format!(
            "KVM_CAP_X86_DISABLE_EXITS offers {offered}, not {}",
            required - offered
        ));
    }
    if policy_reason == IdlePolicy::Mwait && !caps.host_mwait {
        need.push("the host CPU has no MONITOR/MWAIT".into());
    }
    let dedicated = policy_reason != IdlePolicy::Shared;
    if dedicated && !caps.halt_poll {
        need.push("KVM_CAP_HALT_POLL (per-VM halt polling) is not offered".into());
    }
    missing(policy_reason, need)?;
    let disable_exits = want_exits & offered;
    // Halt polling is turned off where the guest's idle never reaches KVM's halt (its HLT
    // or MWAIT stays in the guest) or where the guest polls before it halts (haltpoll,
    // poll). Under `hlt` on a host whose HLTs exit regardless, turning it off would put
    // the halted vCPU's thread to sleep and make each wake-up a host scheduler wake-up
    // (an IPI to an idle core, through the outer hypervisor on a nested host); the core
    // is the partition's alone, so its thread polls there first, as the host's default.
    let hlt_reaches_kvm = policy_reason == IdlePolicy::Hlt && caps.hlt_exits_ignored;
    let mut reason = format!("asked for; the host disables {offered} exits");
    if hlt_reaches_kvm {
        reason.push_str(
            ", but its guests' HLTs exit regardless (kvm_pvm), so a halted vCPU polls on \
             its own core as the host's default halt polling has it",
        );
    }
    Ok(IdlePlan {
        policy: policy_reason,
        reason,
        disable_exits,
        halt_poll_ns: (dedicated && !hlt_reaches_kvm).then_some(0),
        expose_mwait: policy_reason == IdlePolicy::Mwait,
        hints_realtime: dedicated,
        // `poll` makes the guest spin (without idle=poll it is haltpoll). `mwait` keeps a
        // Linux guest out of cpuidle: KVM_HINTS_REALTIME would load cpuidle-haltpoll, which
        // idles in HLT (never MWAIT) and, under the menu governor, re-arms the TSC-deadline
        // timer around every idle period, a wrmsr exit each (docs/idle.md, "The mwait
        // policy's guest idle"). The user's command line is otherwise passed as given (a
        // Linux guest that should HLT without polling first under `hlt` is given
        // `idle=halt` by its owner).
        cmdline: match policy_reason {
            IdlePolicy::Poll => "idle=poll",
            IdlePolicy::Mwait => MWAIT_GUEST_CMDLINE,
            _ => "",
        },
    })
}

impl IdlePlan {
    /// One line for people: what is in force.
    pub fn describe(&self) -> String {
        format!(
            "idle policy {} ({}): {} disabled, halt polling {}, {}{}",
            self.policy,
            self.reason,
            if self.disable_exits.is_empty() {
                "no exits".to_string()
            } else {
                format!("{} exits", self.disable_exits)
            },
            match self.halt_poll_ns {
                Some(n) => format!("{n} ns"),
                None => "host default".into(),
            },
            if self.expose_mwait {
                "MONITOR/MWAIT and leaf 5 shown"
            } else {
                "MONITOR/MWAIT hidden"
            },
            match (self.hints_realtime, self.cmdline) {
                (true, "") => ", KVM_HINTS_REALTIME".to_string(),
                (true, c) => format!(", KVM_HINTS_REALTIME, guest cmdline +\"{c}\""),
                (false, _) => String::new(),
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NESTED: IdleCaps = IdleCaps {
        disable_exits: DisableExits::HLT
            .union(DisableExits::PAUSE)
            .union(DisableExits::CSTATE),
        halt_poll: true,
        host_mwait: false,
        host_halt_poll_ns: Some(200_000),
        hlt_exits_ignored: true,
    };
    const METAL: IdleCaps = IdleCaps {
        disable_exits: DisableExits::all(),
        halt_poll: true,
        host_mwait: true,
        host_halt_poll_ns: Some(200_000),
        hlt_exits_ignored: false,
    };

    #[test]
    fn a_halted_vcpu_polls_where_its_hlt_exits_regardless() {
        let h = resolve(IdlePolicy::Hlt, &NESTED).unwrap();
        assert_eq!(h.halt_poll_ns, None, "{}", h.describe());
        assert!(h.reason.contains("HLTs exit regardless"), "{}", h.reason);
        // Where HLT stays in the guest, or the guest polls itself, polling stays off.
        assert_eq!(
            resolve(IdlePolicy::Hlt, &METAL).unwrap().halt_poll_ns,
            Some(0)
        );
        for p in [IdlePolicy::Haltpoll, IdlePolicy::Poll] {
            assert_eq!(resolve(p, &NESTED).unwrap().halt_poll_ns, Some(0), "{p}");
        }
    }

    #[test]
    fn auto_picks_the_best_offered() {
        let p = resolve(IdlePolicy::Auto, &METAL).unwrap();
        assert_eq!(p.policy, IdlePolicy::Mwait);
        assert_eq!(p.disable_exits.bits(), 15);
        assert!(p.expose_mwait && p.hints_realtime);
        let p = resolve(IdlePolicy::Auto, &NESTED).unwrap();
        assert_eq!(p.policy, IdlePolicy::Hlt);
        assert!(p.reason.contains("not MWAIT"), "{}", p.reason);
        assert_eq!(p.disable_exits, DisableExits::HLT | DisableExits::PAUSE);
        let p = resolve(
            IdlePolicy::Auto,
            &IdleCaps {
                halt_poll: true,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(p.policy, IdlePolicy::Haltpoll);
        let p = resolve(IdlePolicy::Auto, &IdleCaps::default()).unwrap();
        assert_eq!(p.policy, IdlePolicy::Shared);
        assert_eq!(p.halt_poll_ns, None);
    }

    #[test]
    fn explicit_policies_never_downgrade() {
        let e = resolve(IdlePolicy::Mwait, &NESTED).unwrap_err();
        assert!(e.to_string().contains("not MWAIT"), "{e}");
        assert!(e.to_string().contains("no MONITOR/MWAIT"), "{e}");
        let e = resolve(
            IdlePolicy::Hlt,
            &IdleCaps {
                halt_poll: true,
                ..Default::default()
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("not HLT"), "{e}");
        let e = resolve(IdlePolicy::Haltpoll, &IdleCaps::default()).unwrap_err();
        assert!(e.to_string().contains("KVM_CAP_HALT_POLL"), "{e}");
        assert!(resolve(IdlePolicy::Shared, &IdleCaps::default()).is_ok());
    }

    #[test]
    fn plans_match_the_table() {
        let h = resolve(IdlePolicy::Hlt, &METAL).unwrap();
        assert_eq!(
            (h.disable_exits, h.halt_poll_ns, h.expose_mwait),
            (DisableExits::HLT | DisableExits::PAUSE, Some(0), false)
        );
        let hp = resolve(IdlePolicy::Haltpoll, &METAL).unwrap();
        assert_eq!(
            (hp.disable_exits, hp.halt_poll_ns, hp.hints_realtime),
            (DisableExits::empty(), Some(0), true)
        );
        let p = resolve(IdlePolicy::Poll, &METAL).unwrap();
        assert_eq!(p.cmdline, "idle=poll");
        // Only mwait and poll add words; mwait keeps a Linux guest out of cpuidle.
        let m = resolve(IdlePolicy::Mwait, &METAL).unwrap();
        assert_eq!(m.cmdline, "cpuidle.off=1");
        assert_eq!(hp.cmdline, "");
        let s = resolve(IdlePolicy::Shared, &METAL).unwrap();
        assert_eq!(
            (s.disable_exits, s.halt_poll_ns, s.hints_realtime),
            (DisableExits::empty(), None, false)
        );
        assert!(
            h.describe()
                .contains("HLT|PAUSE exits disabled, halt polling 0 ns")
        );
        assert_eq!(h.cmdline, "");
        for p in IdlePolicy::ALL {
            assert_eq!(IdlePolicy::parse(p.name()), Some(p));
        }
        assert_eq!(IdlePolicy::parse("idle"), None);
        assert_eq!(
            DisableExits::from_bits_truncate(14).to_string(),
            "HLT|PAUSE|CSTATE"
        );
        assert_eq!(DisableExits::empty().to_string(), "none");
        // Bits the host offers beyond the four we know are dropped, not passed to KVM.
        assert_eq!(DisableExits::from_bits_truncate(0x10f), DisableExits::all());
    }
}
