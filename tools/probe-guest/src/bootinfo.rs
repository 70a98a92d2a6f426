//! What the VMM handed over: the Linux zero page or the PVH start info, copied out before
//! anything overwrites low memory.

use crate::sys::peek;

/// Most e820 entries kept.
pub const MAX_E820: usize = 128;
/// Longest command line kept.
pub const MAX_CMDLINE: usize = 2048;
const PVH_MAGIC: u32 = 0x336e_c578;

/// One memory map entry.
#[derive(Clone, Copy, Default)]
pub struct E820 {
    /// Start.
    pub addr: u64,
    /// Length.
    pub size: u64,
    /// Type (1 = usable RAM).
    pub kind: u32,
}

/// The boot information.
pub struct BootInfo {
    /// "linux64" or "pvh".
    pub protocol: &'static str,
    /// Where the structure was.
    pub info_addr: u64,
    /// Command line bytes.
    pub cmdline: [u8; MAX_CMDLINE],
    /// Length of `cmdline`.
    pub cmdline_len: usize,
    /// Memory map.
    pub e820: [E820; MAX_E820],
    /// Entries in `e820`.
    pub e820_len: usize,
    /// ACPI RSDP address, 0 if none was given.
    pub rsdp: u64,
}

impl BootInfo {
    /// The command line as text (lossy: non-UTF-8 becomes "?").
    pub fn cmdline(&self) -> &str {
        core::str::from_utf8(&self.cmdline[..self.cmdline_len]).unwrap_or("?")
    }

    /// The memory map.
    pub fn e820(&self) -> &[E820] {
        &self.e820[..self.e820_len]
    }

    /// Value of `key=value` on the command line.
    pub fn arg(&self, key: &str) -> Option<&str> {
        self.cmdline().split_ascii_whitespace().find_map(|w| {
            let (k, v) = w.split_once('=')?;
            (k == key).then_some(v)
        })
    }

    /// Parses the structure at `addr`; `kind` 0 = Linux zero page, 1 = PVH start info.
    ///
    /// # Safety
    /// `addr` must point at the structure the entry protocol promised.
    pub unsafe fn read(kind: u64, addr: u64) -> Self {
        let mut bi = BootInfo {
            protocol: if kind == 1 { "pvh" } else { "linux64" },
            info_addr: addr,
            cmdline: [0; MAX_CMDLINE],
            cmdline_len: 0,
            e820: [E820::default(); MAX_E820],
            e820_len: 0,
            rsdp: 0,
        };
        // SAFETY: the entry protocol promises the structure; the pointers inside it are
        // the VMM's and point into guest RAM.
        unsafe {
            let cmdline_ptr;
            if kind == 1 {
                if peek::<u32>(addr) != PVH_MAGIC {
                    return bi;
                }
                cmdline_ptr = peek::<u64>(addr + 24);
                bi.rsdp = peek::<u64>(addr + 32);
                let map = peek::<u64>(addr + 40);
                let n = (peek::<u32>(addr + 48) as usize).min(MAX_E820);
                for i in 0..n {
                    let e = map + 24 * i as u64;
                    bi.e820[i] = E820 {
                        addr: peek(e),
                        size: peek(e + 8),
                        kind: peek(e + 16),
                    };
                }
                bi.e820_len = n;
            } else {
                cmdline_ptr =
                    peek::<u32>(addr + 0x228) as u64 | (peek::<u32>(addr + 0xc8) as u64) << 32;
                bi.rsdp = peek::<u64>(addr + 0x70);
                let n = (peek::<u8>(addr + 0x1e8) as usize).min(MAX_E820);
                for i in 0..n {
                    let e = addr + 0x2d0 + 20 * i as u64;
                    bi.e820[i] = E820 {
                        addr: peek(e),
                        size: peek(e + 8),
                        kind: peek(e + 16),
                    };
                }
                bi.e820_len = n;
            }
            if cmdline_ptr != 0 {
                while bi.cmdline_len < MAX_CMDLINE - 1 {
                    let b: u8 = peek(cmdline_ptr + bi.cmdline_len as u64);
                    if b == 0 {
                        break;
                    }
                    bi.cmdline[bi.cmdline_len] = b;
                    bi.cmdline_len += 1;
                }
            }
        }
        bi
    }
}
