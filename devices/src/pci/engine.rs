//! The submission engine's protocol: a device with the shape of a GPU command processor.
//! Pure: the register file and the execution of commands against guest memory, with no
//! thread, no KVM and no clock, so every hostile input is a unit test.
//!
//! The driver (the probe guest) gives the engine a ring of up to [`RING_ENTRIES`] commands
//! in guest memory: a 64-byte header whose first `u32` is the *tail* (how many commands the
//! driver has written, wrapping), then `size` commands of [`COMMAND_BYTES`] each. To submit
//! it writes commands, then the tail, then rings the doorbell (trapping register, ioeventfd
//! or a mapped doorbell page, depending on how the partition was launched). The engine
//! executes every command from its *head* to the tail: it writes the command's fence value
//! into guest memory at the command's fence address and, if the command asks, raises
//! MSI-X vector 0.
//!
//! Register file (BAR 0, 4 KiB, 4-byte accesses):
//!
//! | offset | name | access |
//! |---|---|---|
//! | 0x00 | `ID` ([`ENGINE_ID`]) | RO |
//! | 0x04 | `STATUS`: bit 0 enabled, bit 1 error | RO |
//! | 0x08 | `ERROR`: an [`EngineError`] code, 0 while none | RO |
//! | 0x0c | `HEAD`: commands executed (wrapping) | RO |
//! | 0x10 | `RING_LO`, 0x14 `RING_HI`: guest address of the ring (4 KiB aligned) | RW while disabled |
//! | 0x18 | `RING_SIZE`: commands in the ring (a power of two, 1..=4096) | RW while disabled |
//! | 0x1c | `CONTROL`: write 1 to enable (checks the ring), 0 to reset | WO |
//! | 0x20 | `DOORBELL`: any write (the trapping doorbell) | WO |
//! | 0x24 | `EXECUTED_LO`, 0x28 `EXECUTED_HI`: commands executed since enable | RO |

use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

/// Value of the `ID` register: "SE" and protocol version 1.
pub const ENGINE_ID: u32 = 0x5345_0001;
/// Bytes of the ring header (the tail is its first `u32`).
pub const RING_HEADER: u64 = 64;
/// Bytes of one command.
pub const COMMAND_BYTES: u64 = 32;
/// Most commands a ring can hold.
pub const RING_ENTRIES: u32 = 4096;
/// Register offsets.
pub mod reg {
    /// Identity.
    pub const ID: u64 = 0x00;
    /// Status.
    pub const STATUS: u64 = 0x04;
    /// Error code.
    pub const ERROR: u64 = 0x08;
    /// Head.
    pub const HEAD: u64 = 0x0c;
    /// Ring address, low half.
    pub const RING_LO: u64 = 0x10;
    /// Ring address, high half.
    pub const RING_HI: u64 = 0x14;
    /// Ring size.
    pub const RING_SIZE: u64 = 0x18;
    /// Enable / reset.
    pub const CONTROL: u64 = 0x1c;
    /// The trapping doorbell.
    pub const DOORBELL: u64 = 0x20;
    /// Commands executed since enable, low half.
    pub const EXECUTED_LO: u64 = 0x24;
    /// High half.
    pub const EXECUTED_HI: u64 = 0x28;
}
/// `STATUS`: enabled.
pub const STATUS_ENABLED: u32 = 1;
/// `STATUS`: stopped on an error (see `ERROR`); only a reset clears it.
pub const STATUS_ERROR: u32 = 2;
/// Command opcode: write the fence.
pub const OP_FENCE: u32 = 1;
/// Command flag: raise MSI-X vector 0 once the fence is written.
pub const FLAG_INTERRUPT: u32 = 1;

/// Why the engine stopped. Each is a guest mistake; the engine stays stopped, with the code
/// in `ERROR`, until the driver resets it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// Enabled with a ring address that is not 4 KiB aligned or not in guest memory.
    #[error("the ring at {0:#x} is not 4 KiB aligned or not in guest memory")]
    BadRing(u64),
    /// Enabled with a ring size that is not a power of two in 1..=4096.
    #[error("ring size {0} is not a power of two from 1 to 4096")]
    BadRingSize(u32),
    /// The tail ran more than a ring ahead of the head.
    #[error("tail {tail} is more than a ring ({size}) ahead of head {head}")]
    BadTail {
        /// Tail the driver wrote.
        tail: u32,
        /// Engine head.
        head: u32,
        /// Ring size.
        size: u32,
    },
    /// A command with an unknown opcode.
    #[error("command {index}: unknown opcode {opcode}")]
    BadOpcode {
        /// Ring index.
        index: u32,
        /// Opcode.
        opcode: u32,
    },
    /// A fence address outside guest memory or not 8-byte aligned.
    #[error("command {index}: fence address {addr:#x} is outside guest memory or unaligned")]
    BadFence {
        /// Ring index.
        index: u32,
        /// Fence address.
        addr: u64,
    },
}

impl EngineError {
    /// The code shown in `ERROR` (never 0).
    pub fn code(&self) -> u32 {
        match self {
            Self::BadRing(_) => 1,
            Self::BadRingSize(_) => 2,
            Self::BadTail { .. } => 3,
            Self::BadOpcode { .. } => 4,
            Self::BadFence { .. } => 5,
        }
    }
}

/// One command as the driver wrote it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Command {
    /// [`OP_FENCE`].
    pub opcode: u32,
    /// [`FLAG_INTERRUPT`] or 0.
    pub flags: u32,
    /// Where the fence goes (8-byte aligned guest address).
    pub fence_addr: u64,
    /// What is written there.
    pub fence_value: u64,
    /// Busy work before the fence, in nanoseconds of the engine's time (0: none; the
    /// caller, which owns the clock, does it).
    pub work_ns: u64,
}

impl Command {
    /// Decodes the 32 bytes of a command.
    pub fn from_bytes(b: &[u8; COMMAND_BYTES as usize]) -> Self {
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(w)
        };
        Self {
            opcode: u32_at(0),
            flags: u32_at(4),
            fence_addr: u64_at(8),
            fence_value: u64_at(16),
            work_ns: u64_at(24),
        }
    }

    /// Encodes it (the driver's side, for tests and the probe).
    pub fn to_bytes(&self) -> [u8; COMMAND_BYTES as usize] {
        let mut b = [0u8; COMMAND_BYTES as usize];
        b[0..4].copy_from_slice(&self.opcode.to_le_bytes());
        b[4..8].copy_from_slice(&self.flags.to_le_bytes());
        b[8..16].copy_from_slice(&self.fence_addr.to_le_bytes());
        b[16..24].copy_from_slice(&self.fence_value.to_le_bytes());
        b[24..32].copy_from_slice(&self.work_ns.to_le_bytes());
        b
    }
}

/// What executing up to the tail came to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Commands executed now.
    pub executed: u32,
    /// Of which asked for an interrupt (raise the vector once if non-zero).
    pub interrupts: u32,
    /// Busy work the commands asked for, in total (spent through `execute`'s `work`).
    pub work_ns: u64,
}

/// The register file and ring state.
#[derive(Clone, Debug, Default)]
pub struct Engine {
    ring: u64,
    size: u32,
    enabled: bool,
    error: Option<EngineError>,
    head: u32,
    executed: u64,
    lifetime: u64,
}

/// What a register write asks of the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Nothing.
    None,
    /// The trapping doorbell rang: execute up to the tail.
    Doorbell,
    /// Enabled or reset: the engine thread should look at its state again.
    StateChanged,
}

impl Engine {
    /// A reset engine.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the engine accepts work.
    pub fn running(&self) -> bool {
        self.enabled && self.error.is_none()
    }

    /// The error that stopped it, if any.
    pub fn error(&self) -> Option<EngineError> {
        self.error
    }

    /// Commands executed since enable.
    pub fn executed(&self) -> u64 {
        self.executed
    }

    /// Commands executed since the engine was created, across resets (for the report).
    pub fn lifetime(&self) -> u64 {
        self.lifetime
    }

    /// A 4-byte register read; anything else reads zero.
    pub fn read(&self, offset: u64, data: &mut [u8]) {
        if data.len() != 4 || offset % 4 != 0 {
            data.fill(0);
            return;
        }
        let v = match offset {
            reg::ID => ENGINE_ID,
            reg::STATUS => {
                (u32::from(self.enabled) * STATUS_ENABLED)
                    | (u32::from(self.error.is_some()) * STATUS_ERROR)
            }
            reg::ERROR => self.error.map_or(0, |e| e.code()),
            reg::HEAD => self.head,
            reg::RING_LO => self.ring as u32,
            reg::RING_HI => (self.ring >> 32) as u32,
            reg::RING_SIZE => self.size,
            reg::EXECUTED_LO => self.executed as u32,
            reg::EXECUTED_HI => (self.executed >> 32) as u32,
            _ => 0,
        };
        data.copy_from_slice(&v.to_le_bytes());
    }

    /// A 4-byte register write. `mem` is checked when the ring is enabled.
    pub fn write<M: GuestMemoryBackend + Bytes<GuestAddress>>(
        &mut self,
        mem: &M,
        offset: u64,
        data: &[u8],
    ) -> Effect {
        if data.len() != 4 || offset % 4 != 0 {
            return Effect::None;
        }
        let v = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
        match offset {
            reg::RING_LO if !self.enabled => self.ring = (self.ring & !0xffff_ffff) | u64::from(v),
            reg::RING_HI if !self.enabled => {
                self.ring = (self.ring & 0xffff_ffff) | u64::from(v) << 32
            }
            reg::RING_SIZE if !self.enabled => self.size = v,
            reg::CONTROL if v == 0 => {
                *self = Self {
                    ring: self.ring,
                    size: self.size,
                    lifetime: self.lifetime,
                    ..Self::default()
                };
                return Effect::StateChanged;
            }
            reg::CONTROL if v == 1 && !self.enabled => {
                self.enabled = true;
                self.error = self.check_ring(mem).err();
                return Effect::StateChanged;
            }
            reg::DOORBELL => return Effect::Doorbell,
            _ => {}
        }
        Effect::None
    }

    fn check_ring<M: GuestMemoryBackend + Bytes<GuestAddress>>(
        &self,
        mem: &M,
    ) -> Result<(), EngineError> {
        if self.size == 0 || self.size > RING_ENTRIES || !self.size.is_power_of_two() {
            return Err(EngineError::BadRingSize(self.size));
        }
        let len = RING_HEADER + u64::from(self.size) * COMMAND_BYTES;
        let in_memory = self.ring.checked_add(len).is_some()
            && mem.check_range(GuestAddress(self.ring), len as usize);
        if self.ring % 4096 != 0 || !in_memory {
            return Err(EngineError::BadRing(self.ring));
        }
        Ok(())
    }

    /// Executes every command from the head to the tail the driver wrote in the ring
    /// header: each fence written (volatile, 8 bytes) in ring order. `work` is called with
    /// each command's `work_ns` before its fence is written (the caller owns the clock).
    /// On a bad tail, opcode or fence the engine stops with that error; what ran before it
    /// stays done.
    pub fn execute<M: GuestMemoryBackend + Bytes<GuestAddress>>(
        &mut self,
        mem: &M,
        mut work: impl FnMut(u64),
    ) -> Progress {
        let mut p = Progress::default();
        if !self.running() {
            return p;
        }
        let tail = match mem.read_obj::<u32>(GuestAddress(self.ring)) {
            Ok(t) => t,
            Err(_) => {
                self.error = Some(EngineError::BadRing(self.ring));
                return p;
            }
        };
        let pending = tail.wrapping_sub(self.head);
        if pending > self.size {
            self.error = Some(EngineError::BadTail {
                tail,
                head: self.head,
                size: self.size,
            });
            return p;
        }
        for _ in 0..pending {
            let index = self.head & (self.size - 1);
            let at = self.ring + RING_HEADER + u64::from(index) * COMMAND_BYTES;
            let mut bytes = [0u8; COMMAND_BYTES as usize];
            if mem.read_slice(&mut bytes, GuestAddress(at)).is_err() {
                self.error = Some(EngineError::BadRing(self.ring));
                break;
            }
            let c = Command::from_bytes(&bytes);
            if c.opcode != OP_FENCE {
                self.error = Some(EngineError::BadOpcode {
                    index,
                    opcode: c.opcode,
                });
                break;
            }
            let fence_ok = c.fence_addr % 8 == 0 && mem.check_range(GuestAddress(c.fence_addr), 8);
            if !fence_ok {
                self.error = Some(EngineError::BadFence {
                    index,
                    addr: c.fence_addr,
                });
                break;
            }
            if c.work_ns > 0 {
                work(c.work_ns);
                p.work_ns = p.work_ns.saturating_add(c.work_ns);
            }
            // Checked above: in memory and aligned.
            let _ = mem.write_obj(c.fence_value, GuestAddress(c.fence_addr));
            self.head = self.head.wrapping_add(1);
            self.executed += 1;
            self.lifetime += 1;
            p.executed += 1;
            if c.flags & FLAG_INTERRUPT != 0 {
                p.interrupts += 1;
            }
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestMemoryMmap;

    const RING: u64 = 0x1000;
    const FENCES: u64 = 0x8000;

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap()
    }

    fn w(e: &mut Engine, m: &GuestMemoryMmap, off: u64, v: u32) -> Effect {
        e.write(m, off, &v.to_le_bytes())
    }

    fn r(e: &Engine, off: u64) -> u32 {
        let mut b = [0u8; 4];
        e.read(off, &mut b);
        u32::from_le_bytes(b)
    }

    fn enabled(m: &GuestMemoryMmap, size: u32) -> Engine {
        let mut e = Engine::new();
        w(&mut e, m, reg::RING_LO, RING as u32);
        w(&mut e, m, reg::RING_SIZE, size);
        assert_eq!(w(&mut e, m, reg::CONTROL, 1), Effect::StateChanged);
        e
    }

    fn submit(m: &GuestMemoryMmap, size: u32, tail: &mut u32, c: Command) {
        let at = RING + RING_HEADER + u64::from(*tail & (size - 1)) * COMMAND_BYTES;
        m.write_slice(&c.to_bytes(), GuestAddress(at)).unwrap();
        *tail = tail.wrapping_add(1);
        m.write_obj(*tail, GuestAddress(RING)).unwrap();
    }

    fn fence(i: u64, flags: u32) -> Command {
        Command {
            opcode: OP_FENCE,
            flags,
            fence_addr: FENCES + 8 * (i % 16),
            fence_value: 0x1000 + i,
            work_ns: 0,
        }
    }

    #[test]
    fn commands_run_in_order_and_wrap_the_ring() {
        let m = mem();
        let mut e = enabled(&m, 4);
        assert_eq!(r(&e, reg::ID), ENGINE_ID);
        assert_eq!(r(&e, reg::STATUS), STATUS_ENABLED);
        let mut tail = 0u32;
        let mut work = Vec::new();
        for round in 0..5u64 {
            for i in 0..3 {
                let mut c = fence(round * 3 + i, u32::from(i == 2));
                c.work_ns = i;
                submit(&m, 4, &mut tail, c);
            }
            let p = e.execute(&m, |ns| work.push(ns));
            assert_eq!((p.executed, p.interrupts, p.work_ns), (3, 1, 3));
            for i in 0..3 {
                let n = round * 3 + i;
                let v: u64 = m.read_obj(GuestAddress(FENCES + 8 * (n % 16))).unwrap();
                assert_eq!(v, 0x1000 + n);
            }
        }
        assert_eq!(work, [1, 2].repeat(5));
        assert_eq!(r(&e, reg::HEAD), 15);
        assert_eq!(e.executed(), 15);
        // Nothing new: nothing runs.
        assert_eq!(e.execute(&m, |_| {}), Progress::default());
    }

    #[test]
    fn a_bad_ring_is_refused_at_enable() {
        let m = mem();
        for (ring, size, err) in [
            (RING, 3, EngineError::BadRingSize(3)),
            (RING, 0, EngineError::BadRingSize(0)),
            (RING, 8192, EngineError::BadRingSize(8192)),
            (RING + 8, 4, EngineError::BadRing(RING + 8)),
            (0xf000, 256, EngineError::BadRing(0xf000)),
            (!0xfffu64, 4, EngineError::BadRing(!0xfffu64)),
        ] {
            let mut e = Engine::new();
            w(&mut e, &m, reg::RING_LO, ring as u32);
            w(&mut e, &m, reg::RING_HI, (ring >> 32) as u32);
            w(&mut e, &m, reg::RING_SIZE, size);
            w(&mut e, &m, reg::CONTROL, 1);
            assert_eq!(e.error(), Some(err));
            assert_eq!(r(&e, reg::STATUS), STATUS_ENABLED | STATUS_ERROR);
            assert_eq!(r(&e, reg::ERROR), err.code());
            assert_eq!(e.execute(&m, |_| {}), Progress::default());
            // A reset clears it; the ring registers keep what was written.
            w(&mut e, &m, reg::CONTROL, 0);
            assert_eq!((r(&e, reg::STATUS), r(&e, reg::ERROR)), (0, 0));
            assert_eq!(r(&e, reg::RING_SIZE), size);
        }
    }

    #[test]
    fn hostile_commands_stop_the_engine_with_a_reason() {
        let m = mem();
        // A tail more than a ring ahead.
        let mut e = enabled(&m, 4);
        m.write_obj(5u32, GuestAddress(RING)).unwrap();
        assert_eq!(e.execute(&m, |_| {}).executed, 0);
        assert_eq!(
            e.error(),
            Some(EngineError::BadTail {
                tail: 5,
                head: 0,
                size: 4
            })
        );
        // A fence outside memory, after one good command: the good one stays done.
        let mut e = enabled(&m, 4);
        let mut tail = 0;
        submit(&m, 4, &mut tail, fence(0, 0));
        let mut bad = fence(1, 0);
        bad.fence_addr = 0x10000;
        submit(&m, 4, &mut tail, bad);
        submit(&m, 4, &mut tail, fence(2, 0));
        assert_eq!(e.execute(&m, |_| {}).executed, 1);
        assert_eq!(
            e.error(),
            Some(EngineError::BadFence {
                index: 1,
                addr: 0x10000
            })
        );
        assert_eq!(r(&e, reg::HEAD), 1);
        // A reset starts the count since enable again; the lifetime count keeps it.
        w(&mut e, &m, reg::CONTROL, 0);
        assert_eq!((e.executed(), e.lifetime(), e.error()), (0, 1, None));
        // Unaligned, and an address that wraps.
        for addr in [FENCES + 4, u64::MAX - 3] {
            let mut e = enabled(&m, 4);
            let mut tail = 0;
            let mut c = fence(0, 0);
            c.fence_addr = addr;
            submit(&m, 4, &mut tail, c);
            e.execute(&m, |_| {});
            assert!(matches!(e.error(), Some(EngineError::BadFence { .. })));
        }
        // An unknown opcode.
        let mut e = enabled(&m, 4);
        let mut tail = 0;
        let mut c = fence(0, 0);
        c.opcode = 7;
        submit(&m, 4, &mut tail, c);
        e.execute(&m, |_| {});
        assert_eq!(
            e.error(),
            Some(EngineError::BadOpcode {
                index: 0,
                opcode: 7
            })
        );
        // Once stopped, the doorbell still answers and nothing runs until a reset.
        assert_eq!(w(&mut e, &m, reg::DOORBELL, 1), Effect::Doorbell);
        assert_eq!(e.execute(&m, |_| {}).executed, 0);
        w(&mut e, &m, reg::CONTROL, 0);
        w(&mut e, &m, reg::CONTROL, 1);
        assert!(e.running());
    }

    #[test]
    fn ring_registers_are_fixed_while_enabled_and_odd_accesses_do_nothing() {
        let m = mem();
        let mut e = enabled(&m, 4);
        w(&mut e, &m, reg::RING_LO, 0x2000);
        w(&mut e, &m, reg::RING_SIZE, 8);
        assert_eq!(
            (r(&e, reg::RING_LO), r(&e, reg::RING_SIZE)),
            (RING as u32, 4)
        );
        assert_eq!(e.write(&m, reg::CONTROL, &[0, 0]), Effect::None);
        assert_eq!(e.write(&m, reg::DOORBELL + 1, &[0; 4]), Effect::None);
        let mut b = [0xffu8; 2];
        e.read(reg::ID, &mut b);
        assert_eq!(b, [0, 0]);
        assert_eq!(r(&e, 0xffc), 0);
        assert!(e.running());
    }
}
