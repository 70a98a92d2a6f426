//! What a vCPU exit means, in our own terms: [`Exit`], the [`Action`] it calls for and
//! the [`StopReason`] that ends a partition.
//!
//! [`handle_exit`] is a free function over our own [`Exit`] type, so unit tests feed it
//! synthetic exits without KVM; the thread loop in [`crate::kvm::vcpu`] only converts
//! KVM's exit, counts it, and acts on the [`Action`] it gets back.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use devices::{Bus, VmEvent};
use kvm_bindings::{KVM_SYSTEM_EVENT_CRASH, KVM_SYSTEM_EVENT_RESET, KVM_SYSTEM_EVENT_SHUTDOWN};

use crate::cpu::assist;

/// A VM exit, in our own terms.
#[derive(Debug)]
pub enum Exit<'a> {
    /// `in` from a port; fill `data`.
    IoIn {
        /// Port.
        port: u16,
        /// Bytes to fill (size × count for string I/O).
        data: &'a mut [u8],
    },
    /// `out` to a port.
    IoOut {
        /// Port.
        port: u16,
        /// Bytes written (size × count for string I/O).
        data: &'a [u8],
    },
    /// MMIO read; fill `data`.
    MmioRead {
        /// Guest physical address.
        addr: u64,
        /// Bytes to fill.
        data: &'a mut [u8],
    },
    /// MMIO write.
    MmioWrite {
        /// Guest physical address.
        addr: u64,
        /// Bytes written.
        data: &'a [u8],
    },
    /// HLT reached userspace (only without an in-kernel LAPIC).
    Hlt,
    /// Triple fault.
    Shutdown,
    /// KVM could not handle something (emulation failure and friends).
    InternalError {
        /// KVM_INTERNAL_ERROR_* sub-code.
        suberror: u32,
    },
    /// KVM could not emulate an instruction and gave its bytes.
    EmulationFailure {
        /// The instruction bytes (up to 15) at RIP.
        bytes: heapless::Vec<u8, 15>,
    },
    /// The guest wrote an MSR whose writes the VMM filters (IA32_LSTAR).
    WriteMsr {
        /// MSR index.
        index: u32,
        /// Value.
        data: u64,
    },
    /// A debug exit: the SYSCALL repair's breakpoint or single step, or the guest's own.
    Debug {
        /// DR6 as KVM reported it (which breakpoint, or BS: a single step ended).
        dr6: u64,
        /// Where the vCPU stopped.
        pc: u64,
    },
    /// VM entry failed.
    FailEntry {
        /// Hardware reason.
        reason: u64,
    },
    /// A system event (PSCI-style shutdown/reset/crash).
    SystemEvent {
        /// KVM_SYSTEM_EVENT_* type.
        kind: u32,
    },
    /// KVM_RUN returned because of a signal or `immediate_exit`.
    Interrupted,
    /// Anything else.
    Other(&'static str),
}

/// Why a vCPU (and with it the partition) stops.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The guest powered off with this status.
    PowerOff(u8),
    /// The guest asked for a reset (treated as a stop: partitions do not reboot in place).
    Reset,
    /// Triple fault, with where the vCPU was (RIP and instruction bytes; empty until the vCPU
    /// loop fills it in).
    TripleFault(String),
    /// KVM internal error, with what we could find out.
    InternalError(String),
    /// VM entry failure.
    FailEntry(u64),
    /// The guest reported a crash through a system event.
    Crash,
    /// An exit we do not handle.
    Unhandled(String),
    /// The VMM asked the vCPU to stop (signal, another vCPU stopped, error elsewhere).
    Kicked,
    /// KVM_RUN failed.
    RunError(String),
}

/// What the loop should do after an exit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Re-enter the guest.
    Continue,
    /// Stop the partition.
    Stop(StopReason),
    /// Try an instruction assist (see [`crate::cpu::assist`]) on these bytes at RIP.
    Assist(heapless::Vec<u8, 15>),
    /// Complete a filtered MSR write.
    WriteMsr {
        /// MSR index.
        index: u32,
        /// Value.
        data: u64,
    },
    /// The guest marked a moment of its run ([`MARK_PORT`]): note the counters now.
    Mark(u32),
    /// Handle a debug exit (the SYSCALL repair): DR6 and RIP as KVM reported them.
    Debug {
        /// DR6 at the exit.
        dr6: u64,
        /// RIP at the exit.
        pc: u64,
    },
}

/// The port a guest writes a 32-bit mark to (the probe, around a loop it measures): the
/// vCPU thread that takes the exit notes the VMM's exit counts and KVM's own statistics at
/// that moment ([`ExitCounters::mark`]), so what a loop cost is the difference between two
/// marks, counted by KVM itself. No device answers there.
pub const MARK_PORT: u16 = 0x520;

/// Most marks kept per vCPU (a guest that writes more only makes `marks_dropped` grow).
pub const MAX_MARKS: usize = 64;

/// The counters at one mark.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mark {
    /// What the guest wrote.
    pub id: u32,
    /// The exits that reached the VMM so far, by reason (the mark's own included).
    pub exits: [(&'static str, u64); 7],
    /// KVM's statistics for the vCPU then (`exits`, `io_exits`, `mmio_exits`, `irq_exits`,
    /// ...; the mark's own exit included), where the host offers them.
    pub kvm: std::collections::BTreeMap<String, u64>,
}

/// Exit counts by reason, cheap enough for every exit.
#[derive(Debug, Default)]
pub struct ExitCounters {
    /// Port reads.
    pub io_in: AtomicU64,
    /// Port writes.
    pub io_out: AtomicU64,
    /// MMIO reads.
    pub mmio_read: AtomicU64,
    /// MMIO writes.
    pub mmio_write: AtomicU64,
    /// HLT exits.
    pub hlt: AtomicU64,
    /// Returns from KVM_RUN because of a signal.
    pub interrupted: AtomicU64,
    /// Everything else.
    pub other: AtomicU64,
    /// Instructions the VMM assisted, by [`assist::Kind`] (in `Kind::ALL` order).
    pub assists: [AtomicU64; assist::Kind::ALL.len()],
    /// User-mode faults at LSTAR the SYSCALL repair did not match (each a SIGSEGV for a
    /// Linux guest's process): reported as `syscall_unmatched` beside the assists.
    pub syscall_unmatched: AtomicU64,
    /// The guest's marks ([`MARK_PORT`]), at most [`MAX_MARKS`]; only its vCPU thread
    /// writes them, and only at a mark.
    pub marks: std::sync::Mutex<Vec<Mark>>,
    /// Marks beyond [`MAX_MARKS`], not kept.
    pub marks_dropped: AtomicU64,
}

impl ExitCounters {
    /// Whether the vCPU has come back from KVM_RUN at least once (any exit to the VMM).
    pub fn any(&self) -> bool {
        [
            &self.io_in,
            &self.io_out,
            &self.mmio_read,
            &self.mmio_write,
            &self.hlt,
            &self.interrupted,
            &self.other,
        ]
        .iter()
        .any(|c| c.load(std::sync::atomic::Ordering::Relaxed) > 0)
    }

    pub(crate) fn assisted(&self, kind: assist::Kind) {
        let i = assist::Kind::ALL
            .iter()
            .position(|k| *k == kind)
            .unwrap_or(0);
        self.assists[i].fetch_add(1, Ordering::Relaxed);
    }

    /// (instruction, times assisted) pairs, in report order, then `syscall_unmatched`.
    pub fn assist_snapshot(&self) -> Vec<(&'static str, u64)> {
        assist::Kind::ALL
            .iter()
            .zip(&self.assists)
            .map(|(k, n)| (k.name(), n.load(Ordering::Relaxed)))
            .chain([(
                "syscall_unmatched",
                self.syscall_unmatched.load(Ordering::Relaxed),
            )])
            .collect()
    }

    pub(crate) fn count(&self, e: &Exit<'_>) {
        let c = match e {
            Exit::IoIn { .. } => &self.io_in,
            Exit::IoOut { .. } => &self.io_out,
            Exit::MmioRead { .. } => &self.mmio_read,
            Exit::MmioWrite { .. } => &self.mmio_write,
            Exit::Hlt => &self.hlt,
            Exit::Interrupted => &self.interrupted,
            _ => &self.other,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Notes mark `id` with `kvm`, KVM's statistics read at it.
    pub fn mark(&self, id: u32, kvm: std::collections::BTreeMap<String, u64>) {
        let mut m = self.marks.lock().unwrap_or_else(|e| e.into_inner());
        if m.len() >= MAX_MARKS {
            self.marks_dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        m.push(Mark {
            id,
            exits: self.snapshot(),
            kvm,
        });
    }

    /// The marks so far.
    pub fn marks(&self) -> Vec<Mark> {
        self.marks.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// (name, count) pairs.
    pub fn snapshot(&self) -> [(&'static str, u64); 7] {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        [
            ("io_in", l(&self.io_in)),
            ("io_out", l(&self.io_out)),
            ("mmio_read", l(&self.mmio_read)),
            ("mmio_write", l(&self.mmio_write)),
            ("hlt", l(&self.hlt)),
            ("interrupted", l(&self.interrupted)),
            ("other", l(&self.other)),
        ]
    }
}

/// One vCPU's counters as every reader gets them: the launch report (`vcpus[]`), the API's
/// `GET /counters`, the ledger's statistics behind `partition status` and the benchmarks all
/// serialize and read this one record.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VcpuCounters {
    /// vCPU index (= APIC ID). Read as `index` too: the launch report's key before this
    /// record was shared (so the benchmarks' `builds` section can read an older build's).
    #[serde(alias = "index")]
    pub vcpu: usize,
    /// Host core it is pinned to.
    pub core: usize,
    /// Exits that reached the VMM, by reason (every reason, zeros included).
    pub exits: BTreeMap<String, u64>,
    /// Instructions the VMM carried out for the guest, by kind (zeros included).
    #[serde(default)]
    pub assists: BTreeMap<String, u64>,
    /// KVM's own statistics for the vCPU (`exits`, `halt_exits`, `halt_attempted_poll`,
    /// ...), where the host offers them.
    #[serde(default)]
    pub kvm: BTreeMap<String, u64>,
}

/// Every vCPU's counters at one moment: what `GET /counters` answers and what the ledger
/// keeps for `partition status` (written by the launcher as it runs).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PartitionCounters {
    /// When they were read (seconds since the epoch).
    pub updated_at: u64,
    /// Per vCPU, in index order.
    pub vcpus: Vec<VcpuCounters>,
}

impl VcpuCounters {
    /// What `counters` hold now for vCPU `vcpu` on `core`, with `kvm` (KVM's statistics,
    /// read by the caller: this room does not open them).
    pub fn read(
        vcpu: usize,
        core: usize,
        counters: &ExitCounters,
        kvm: BTreeMap<String, u64>,
    ) -> Self {
        let map = |p: &[(&'static str, u64)]| p.iter().map(|(k, n)| (k.to_string(), *n)).collect();
        Self {
            vcpu,
            core,
            exits: map(&counters.snapshot()),
            assists: map(&counters.assist_snapshot()),
            kvm,
        }
    }
}

fn event_action(ev: Option<VmEvent>) -> Action {
    match ev {
        None => Action::Continue,
        Some(VmEvent::PowerOff { status }) => Action::Stop(StopReason::PowerOff(status)),
        Some(VmEvent::Reset) => Action::Stop(StopReason::Reset),
    }
}

/// Decides what an exit means. Device accesses go to the buses; nothing a guest does here
/// can panic the VMM.
pub fn handle_exit(exit: Exit<'_>, pio: &Bus, mmio: &Bus) -> Action {
    match exit {
        Exit::IoIn { port, data } => {
            pio.read(port as u64, data);
            Action::Continue
        }
        Exit::IoOut { port, data } if port == MARK_PORT => {
            let mut v = [0u8; 4];
            let n = data.len().min(4);
            v[..n].copy_from_slice(&data[..n]);
            Action::Mark(u32::from_le_bytes(v))
        }
        Exit::IoOut { port, data } => event_action(pio.write(port as u64, data)),
        Exit::MmioRead { addr, data } => {
            mmio.read(addr, data);
            Action::Continue
        }
        Exit::MmioWrite { addr, data } => event_action(mmio.write(addr, data)),
        Exit::Hlt | Exit::Interrupted => Action::Continue,
        Exit::Shutdown => Action::Stop(StopReason::TripleFault(String::new())),
        Exit::InternalError { suberror } => Action::Stop(StopReason::InternalError(format!(
            "suberror {suberror} ({})",
            internal_error_name(suberror)
        ))),
        Exit::EmulationFailure { bytes } => Action::Assist(bytes),
        Exit::WriteMsr { index, data } => Action::WriteMsr { index, data },
        Exit::Debug { dr6, pc } => Action::Debug { dr6, pc },
        Exit::FailEntry { reason } => Action::Stop(StopReason::FailEntry(reason)),
        Exit::SystemEvent { kind } => match kind {
            KVM_SYSTEM_EVENT_SHUTDOWN => Action::Stop(StopReason::PowerOff(0)),
            KVM_SYSTEM_EVENT_RESET => Action::Stop(StopReason::Reset),
            KVM_SYSTEM_EVENT_CRASH => Action::Stop(StopReason::Crash),
            k => Action::Stop(StopReason::Unhandled(format!("system event {k}"))),
        },
        Exit::Other(what) => Action::Stop(StopReason::Unhandled(what.to_string())),
    }
}

fn internal_error_name(sub: u32) -> &'static str {
    match sub {
        1 => "emulation failure",
        2 => "simultaneous exceptions",
        3 => "unexpected delivery event",
        4 => "unexpected exit reason",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An older build's report names the vCPU `index`: read the same.
    #[test]
    fn a_vcpu_record_reads_its_older_key_too() {
        let now: VcpuCounters =
            serde_json::from_str(r#"{"vcpu": 1, "core": 3, "exits": {"io_out": 2}}"#).unwrap();
        let old: VcpuCounters =
            serde_json::from_str(r#"{"index": 1, "core": 3, "exits": {"io_out": 2}}"#).unwrap();
        assert_eq!(now, old);
        assert_eq!(now.vcpu, 1);
        // Written with the one key.
        assert!(serde_json::to_string(&old).unwrap().contains("\"vcpu\":1"));
    }
    use devices::BusDevice;
    use std::sync::Arc;
    use std::sync::Mutex as StdMutex;

    struct Echo;
    impl BusDevice for Echo {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(0x40 + offset as u8);
        }
        fn write(&mut self, _offset: u64, data: &[u8]) -> Option<VmEvent> {
            match data.first() {
                Some(0xfe) => Some(VmEvent::Reset),
                Some(&s) if s >= 0x80 => Some(VmEvent::PowerOff { status: s - 0x80 }),
                _ => None,
            }
        }
    }

    fn buses() -> (Bus, Bus) {
        let mut pio = Bus::new("pio");
        pio.insert("echo", 0x10, 4, Arc::new(StdMutex::new(Echo)))
            .unwrap();
        let mut mmio = Bus::new("mmio");
        mmio.insert("echo", 0xd000_0000, 0x1000, Arc::new(StdMutex::new(Echo)))
            .unwrap();
        (pio, mmio)
    }

    #[test]
    fn device_exits() {
        let (pio, mmio) = buses();
        let mut d = [0u8; 1];
        assert_eq!(
            handle_exit(
                Exit::IoIn {
                    port: 0x11,
                    data: &mut d
                },
                &pio,
                &mmio
            ),
            Action::Continue
        );
        assert_eq!(d, [0x41]);
        let mut d = [0u8; 4];
        handle_exit(
            Exit::MmioRead {
                addr: 0xd000_0002,
                data: &mut d,
            },
            &pio,
            &mmio,
        );
        assert_eq!(d, [0x42; 4]);
        assert_eq!(
            handle_exit(
                Exit::IoOut {
                    port: 0x10,
                    data: &[0x83]
                },
                &pio,
                &mmio
            ),
            Action::Stop(StopReason::PowerOff(3))
        );
        assert_eq!(
            handle_exit(
                Exit::MmioWrite {
                    addr: 0xd000_0000,
                    data: &[0xfe]
                },
                &pio,
                &mmio
            ),
            Action::Stop(StopReason::Reset)
        );
    }

    #[test]
    fn hostile_accesses_do_not_stop_the_vm() {
        let (pio, mmio) = buses();
        let mut d = [0u8; 8];
        for port in [0u16, 0x13, 0xffff] {
            assert_eq!(
                handle_exit(Exit::IoIn { port, data: &mut d }, &pio, &mmio),
                Action::Continue
            );
        }
        // 0x13 + 8 bytes runs past the device: all ones, not the device.
        assert_eq!(d, [0xff; 8]);
        assert_eq!(
            handle_exit(
                Exit::MmioWrite {
                    addr: u64::MAX,
                    data: &[1, 2, 3, 4, 5, 6, 7, 8]
                },
                &pio,
                &mmio
            ),
            Action::Continue
        );
        assert_eq!(
            handle_exit(
                Exit::IoOut {
                    port: 0x10,
                    data: &[]
                },
                &pio,
                &mmio
            ),
            Action::Continue
        );
    }

    #[test]
    fn fatal_exits() {
        let (pio, mmio) = buses();
        assert_eq!(
            handle_exit(Exit::Shutdown, &pio, &mmio),
            Action::Stop(StopReason::TripleFault(String::new()))
        );
        assert!(matches!(
            handle_exit(Exit::InternalError { suberror: 1 }, &pio, &mmio),
            Action::Stop(StopReason::InternalError(s)) if s.contains("emulation failure")
        ));
        assert_eq!(
            handle_exit(Exit::FailEntry { reason: 7 }, &pio, &mmio),
            Action::Stop(StopReason::FailEntry(7))
        );
        assert_eq!(
            handle_exit(Exit::SystemEvent { kind: 1 }, &pio, &mmio),
            Action::Stop(StopReason::PowerOff(0))
        );
        assert_eq!(
            handle_exit(Exit::SystemEvent { kind: 2 }, &pio, &mmio),
            Action::Stop(StopReason::Reset)
        );
        assert_eq!(
            handle_exit(Exit::Interrupted, &pio, &mmio),
            Action::Continue
        );
        assert!(matches!(
            handle_exit(Exit::Other("x"), &pio, &mmio),
            Action::Stop(StopReason::Unhandled(_))
        ));
    }

    #[test]
    fn assists_msr_writes_and_debug_exits_go_back_to_the_loop() {
        let (pio, mmio) = buses();
        let bytes = heapless::Vec::from_slice(&[0xcc, 0x90]).unwrap();
        assert_eq!(
            handle_exit(
                Exit::EmulationFailure {
                    bytes: bytes.clone()
                },
                &pio,
                &mmio
            ),
            Action::Assist(bytes)
        );
        assert_eq!(
            handle_exit(
                Exit::WriteMsr {
                    index: 0xc000_0082, /* IA32_LSTAR */
                    data: 0xffff_ffff_81c0_0080
                },
                &pio,
                &mmio
            ),
            Action::WriteMsr {
                index: 0xc000_0082, /* IA32_LSTAR */
                data: 0xffff_ffff_81c0_0080
            }
        );
        assert_eq!(
            handle_exit(
                Exit::Debug {
                    dr6: 0x4ff0,
                    pc: 0x1000
                },
                &pio,
                &mmio
            ),
            Action::Debug {
                dr6: 0x4ff0,
                pc: 0x1000
            }
        );
        // Without instruction bytes an internal error still stops the guest.
        assert!(matches!(
            handle_exit(Exit::InternalError { suberror: 1 }, &pio, &mmio),
            Action::Stop(StopReason::InternalError(_))
        ));
    }

    #[test]
    fn a_mark_is_noted_with_its_counters_and_kept_within_bounds() {
        let (pio, mmio) = (Bus::new("pio"), Bus::new("mmio"));
        // A port write to the mark port is a mark, whatever its width; nothing on the bus.
        assert_eq!(
            handle_exit(
                Exit::IoOut {
                    port: MARK_PORT,
                    data: &0x1234_5678u32.to_le_bytes()
                },
                &pio,
                &mmio
            ),
            Action::Mark(0x1234_5678)
        );
        assert_eq!(
            handle_exit(
                Exit::IoOut {
                    port: MARK_PORT,
                    data: &[7]
                },
                &pio,
                &mmio
            ),
            Action::Mark(7)
        );
        let c = ExitCounters::default();
        c.count(&Exit::IoOut {
            port: MARK_PORT,
            data: &[1],
        });
        let kvm: std::collections::BTreeMap<String, u64> = [("exits".to_string(), 9)].into();
        c.mark(1, kvm.clone());
        let m = c.marks();
        assert_eq!(m.len(), 1);
        assert_eq!(
            (m[0].id, m[0].exits[1], m[0].kvm["exits"]),
            (1, ("io_out", 1), 9)
        );
        // A guest that marks for ever keeps MAX_MARKS and a count of the rest.
        for i in 0..MAX_MARKS as u32 + 5 {
            c.mark(i, Default::default());
        }
        assert_eq!(c.marks().len(), MAX_MARKS);
        assert_eq!(c.marks_dropped.load(Ordering::Relaxed), 6);
    }

    #[test]
    fn assists_are_counted_by_kind() {
        let c = ExitCounters::default();
        c.assisted(assist::Kind::Int3);
        c.assisted(assist::Kind::Syscall);
        c.assisted(assist::Kind::Syscall);
        c.syscall_unmatched.fetch_add(1, Ordering::Relaxed);
        let s = c.assist_snapshot();
        assert_eq!(s.len(), assist::Kind::ALL.len() + 1);
        assert!(s.contains(&("syscall_unmatched", 1)));
        assert!(s.contains(&("int3", 1)));
        assert!(s.contains(&("syscall", 2)));
        assert!(s.contains(&("fwait", 0)));
    }

    #[test]
    fn counters_count_by_reason() {
        let c = ExitCounters::default();
        c.count(&Exit::IoOut { port: 1, data: &[] });
        c.count(&Exit::IoOut { port: 1, data: &[] });
        c.count(&Exit::Shutdown);
        let s = c.snapshot();
        assert_eq!(s[1], ("io_out", 2));
        assert_eq!(s[6], ("other", 1));
    }
}
