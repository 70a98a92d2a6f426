//! A small NVMe driver for a passed-through controller (`probe.nvme=N`): the submission
//! shape of a GPU (rings in guest memory the device reads by DMA, a tail doorbell in BAR 0,
//! completions by MSI-X or a polled phase bit), driven from ring 3.
//!
//! What it does, in order, each step printed:
//! 1. finds the first function of class 01:08:02 (NVMe) on bus 0 through ECAM, sizes its
//!    BARs, turns memory decoding and bus mastering on;
//! 2. resets the controller, gives it an admin queue pair, enables it (CC: 4 KiB pages,
//!    64-byte submission and 16-byte completion entries);
//! 3. Identify controller and namespace 1 (model, serial, LBA size and count);
//! 4. one I/O queue pair, its completions on MSI-X vector 1 (programmed to our vector);
//! 5. writes a 4 KiB pattern (seeded by `probe.nvme_seed`) at LBA `probe.nvme_lba` (default
//!    0), reads it back into a cleared buffer, compares and prints the FNV-1a checksum;
//! 6. times N one-block reads submit-to-completion, polling the completion's phase bit
//!    (`completion=poll`) and waiting for the MSI-X interrupt in the idle mode in force
//!    (`completion=irq`), and the doorbell store alone.
//!
//! Every doorbell and completion-queue head store is a plain store to BAR 0; where the VMM
//! maps BAR 0 into the guest (all of it but the MSI-X table and PBA pages), none of them
//! exits. The launch report's exit counts show whether that held.

use core::sync::atomic::{Ordering, fence};

use crate::bootinfo::BootInfo;
use crate::engine::{Ecam, find_cap, setup_bars};
use crate::sys::{self, peek, poke, rdtsc};

/// The vector the I/O queue's completions arrive on.
const VECTOR: usize = 0x62;
/// Entries per queue (each queue one 4 KiB page or less).
const QSIZE: u16 = 64;
const CLASS_NVME: u32 = 0x01_08_02;
const CAP_MSIX: u8 = 0x11;

mod reg {
    pub const CAP: u64 = 0x00;
    pub const VS: u64 = 0x08;
    pub const CC: u64 = 0x14;
    pub const CSTS: u64 = 0x1c;
    pub const AQA: u64 = 0x24;
    pub const ASQ: u64 = 0x28;
    pub const ACQ: u64 = 0x30;
    pub const DOORBELLS: u64 = 0x1000;
}

mod op {
    pub const CREATE_SQ: u8 = 0x01;
    pub const CREATE_CQ: u8 = 0x05;
    pub const IDENTIFY: u8 = 0x06;
    pub const WRITE: u8 = 0x01;
    pub const READ: u8 = 0x02;
}

#[repr(C, align(4096))]
struct Page([u8; 4096]);

/// Admin SQ, admin CQ, I/O SQ, I/O CQ, identify buffer, data buffer.
static mut PAGES: [Page; 6] = [const { Page([0; 4096]) }; 6];

fn page(i: usize) -> u64 {
    // SAFETY: only the address is taken.
    unsafe { (&raw mut PAGES).cast::<Page>().add(i) as u64 }
}

fn buf(i: usize) -> &'static mut [u8; 4096] {
    // SAFETY: the BSP alone runs the driver, and each caller holds one borrow at a time;
    // the device writes these pages only while a command naming them is outstanding.
    unsafe { &mut (*(&raw mut PAGES).cast::<Page>().add(i)).0 }
}

struct Ctrl {
    regs: u64,
    stride: u64,
    timeout: u64,
}

impl Ctrl {
    fn rd(&self, off: u64) -> u32 {
        // SAFETY: BAR 0's registers, placed by the VMM and sized by us.
        unsafe { peek(self.regs + off) }
    }
    fn wr(&self, off: u64, v: u32) {
        // SAFETY: as `rd`.
        unsafe { poke(self.regs + off, v) }
    }
    /// Two 4-byte writes, low first: some controllers take no 8-byte accesses.
    fn wr64(&self, off: u64, v: u64) {
        self.wr(off, v as u32);
        self.wr(off + 4, (v >> 32) as u32);
    }
    fn doorbell(&self, qid: u16, cq: bool) -> u64 {
        self.regs + reg::DOORBELLS + (2 * u64::from(qid) + u64::from(cq)) * self.stride
    }
    /// Waits until CSTS.RDY is `ready` (CSTS.CFS fails it).
    fn wait_ready(&self, ready: bool) -> Result<(), &'static str> {
        let t0 = rdtsc();
        loop {
            let st = self.rd(reg::CSTS);
            if st & 2 != 0 {
                return Err("the controller reports a fatal status (CSTS.CFS)");
            }
            if (st & 1 != 0) == ready {
                return Ok(());
            }
            if rdtsc().wrapping_sub(t0) > self.timeout {
                return Err("CSTS.RDY did not follow CC.EN in CAP.TO");
            }
            core::hint::spin_loop();
        }
    }
}

struct Queue {
    qid: u16,
    sq: u64,
    cq: u64,
    tail: u16,
    head: u16,
    phase: bool,
    sq_db: u64,
    cq_db: u64,
    cid: u16,
}

impl Queue {
    fn new(c: &Ctrl, qid: u16, sq: u64, cq: u64) -> Self {
        Self {
            qid,
            sq,
            cq,
            tail: 0,
            head: 0,
            phase: true,
            sq_db: c.doorbell(qid, false),
            cq_db: c.doorbell(qid, true),
            cid: 0,
        }
    }

    /// Writes `cmd` (its command identifier filled in) at the tail and publishes the tail.
    /// Returns the cycles the doorbell store took.
    fn submit(&mut self, mut cmd: [u32; 16]) -> u64 {
        self.cid = self.cid.wrapping_add(1);
        cmd[0] = (cmd[0] & 0xffff) | u32::from(self.cid) << 16;
        let slot = self.sq + u64::from(self.tail) * 64;
        for (i, w) in cmd.iter().enumerate() {
            // SAFETY: our submission queue page; the device reads it after the doorbell.
            unsafe { poke(slot + 4 * i as u64, *w) };
        }
        self.tail = (self.tail + 1) % QSIZE;
        fence(Ordering::SeqCst);
        let t0 = rdtsc();
        // SAFETY: this queue's tail doorbell in BAR 0.
        unsafe { poke::<u32>(self.sq_db, u32::from(self.tail)) };
        rdtsc().wrapping_sub(t0)
    }

    /// The completion at the head if the device has posted it: (status, dword 0); the head
    /// moves on and its doorbell is written.
    fn reap(&mut self) -> Option<(u16, u32)> {
        let e = self.cq + u64::from(self.head) * 16;
        // SAFETY: our completion queue page, written by the device.
        let dw3: u32 = unsafe { peek(e + 12) };
        if (dw3 >> 16 & 1 != 0) != self.phase {
            return None;
        }
        fence(Ordering::Acquire);
        // SAFETY: as above.
        let dw0: u32 = unsafe { peek(e) };
        let (cid, status) = (dw3 as u16, (dw3 >> 17) as u16);
        self.head = (self.head + 1) % QSIZE;
        if self.head == 0 {
            self.phase = !self.phase;
        }
        // SAFETY: this queue's head doorbell in BAR 0.
        unsafe { poke::<u32>(self.cq_db, u32::from(self.head)) };
        if cid != self.cid {
            return Some((0xffff, dw0));
        }
        Some((status, dw0))
    }

    /// Polls for the completion of the last submission, up to `limit` cycles.
    fn poll(&mut self, limit: u64) -> Option<(u16, u32)> {
        let t0 = rdtsc();
        loop {
            if let Some(r) = self.reap() {
                return Some(r);
            }
            if rdtsc().wrapping_sub(t0) > limit {
                return None;
            }
            core::hint::spin_loop();
        }
    }

    /// Submits `cmd` and polls for its completion; Err names the command and its status.
    fn run(&mut self, what: &'static str, cmd: [u32; 16], limit: u64) -> Result<u32, Failure> {
        self.submit(cmd);
        match self.poll(limit) {
            Some((0, dw0)) => Ok(dw0),
            Some((status, _)) => Err(Failure::Status(what, status)),
            None => Err(Failure::Timeout(what, self.qid)),
        }
    }
}

enum Failure {
    Setup(&'static str),
    Status(&'static str, u16),
    Timeout(&'static str, u16),
}

fn command(opcode: u8, nsid: u32, prp1: u64, cdw10: u32, cdw11: u32, cdw12: u32) -> [u32; 16] {
    let mut c = [0u32; 16];
    c[0] = u32::from(opcode);
    c[1] = nsid;
    c[6] = prp1 as u32;
    c[7] = (prp1 >> 32) as u32;
    c[10] = cdw10;
    c[11] = cdw11;
    c[12] = cdw12;
    c
}

/// The first NVMe function on bus 0.
fn find(e: Ecam) -> Option<u64> {
    (0..32).find(|&slot| e.read(slot, 0) & 0xffff != 0xffff && e.read(slot, 8) >> 8 == CLASS_NVME)
}

fn text(b: &[u8]) -> &str {
    core::str::from_utf8(b)
        .unwrap_or("?")
        .trim_end_matches([' ', '\0'])
}

fn fnv1a(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn pattern(seed: u64, out: &mut [u8]) {
    let mut x = seed | 1;
    for chunk in out.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
}

fn hex(bi: &BootInfo, key: &str, default: u64) -> u64 {
    bi.arg(key)
        .and_then(|v| u64::from_str_radix(v.trim_start_matches("0x"), 16).ok())
        .unwrap_or(default)
}

/// Runs the driver when `probe.nvme=N` is given. Returns true on a failure.
pub fn run(bi: &BootInfo, tsc_khz: u64, apic: u32) -> bool {
    let Some(n) = bi.arg("probe.nvme") else {
        return false;
    };
    let n = n
        .parse::<usize>()
        .unwrap_or(100)
        .clamp(1, sys::SAMPLES * 9 / 10);
    let Some(e) = crate::engine::ecam(bi) else {
        say!("nvme FAILED: no MCFG table (no PCI host bridge in the ACPI tables)");
        return true;
    };
    match drive(bi, e, n, tsc_khz, apic) {
        Ok(()) => false,
        Err(Failure::Setup(why)) => {
            say!("nvme FAILED: {}", why);
            true
        }
        Err(Failure::Status(what, st)) => {
            say!("nvme FAILED: {} completed with status {:#x}", what, st);
            true
        }
        Err(Failure::Timeout(what, qid)) => {
            say!("nvme FAILED: {} did not complete on queue {}", what, qid);
            true
        }
    }
}

fn drive(bi: &BootInfo, e: Ecam, n: usize, tsc_khz: u64, apic: u32) -> Result<(), Failure> {
    let slot = find(e).ok_or(Failure::Setup(
        "no NVMe controller (class 01:08:02) on bus 0",
    ))?;
    let id = e.read(slot, 0);
    let mut next = 0xc000_0000;
    let bars = setup_bars(e, slot, "nvme", &mut next);
    let (regs, size) = bars[0];
    if size < 0x2000 {
        return Err(Failure::Setup(
            "BAR 0 is too small for NVMe registers and doorbells",
        ));
    }
    let cap_lo = {
        // SAFETY: BAR 0's CAP register.
        unsafe { peek::<u32>(regs + reg::CAP) }
    };
    // SAFETY: as above.
    let cap_hi = unsafe { peek::<u32>(regs + reg::CAP + 4) };
    let mqes = (cap_lo & 0xffff) + 1;
    let to_ms = u64::from(cap_lo >> 24 & 0xff).max(1) * 500;
    let c = Ctrl {
        regs,
        stride: 4 << (cap_hi & 0xf),
        timeout: tsc_khz.saturating_mul(to_ms),
    };
    let vs = c.rd(reg::VS);
    say!(
        "nvme found slot={} id={:#010x} bar0={:#x} size={:#x} mqes={} dstrd={} version={}.{}",
        slot,
        id,
        regs,
        size,
        mqes,
        cap_hi & 0xf,
        vs >> 16,
        vs >> 8 & 0xff
    );
    if mqes < u32::from(QSIZE) {
        return Err(Failure::Setup(
            "the controller's queues are shorter than ours",
        ));
    }
    // MSI-X: vector 1 (the I/O queue's) to us, unmasked; vector 0 (admin) stays masked.
    let msix = find_cap(e, slot, CAP_MSIX).ok_or(Failure::Setup("no MSI-X capability"))?;
    let control = e.read(slot, msix) >> 16;
    let table = e.read(slot, msix + 4);
    let (tbir, toff) = ((table & 7) as usize, u64::from(table & !7));
    if tbir >= 6 || bars[tbir].1 == 0 || control & 0x7ff < 1 {
        return Err(Failure::Setup(
            "the MSI-X table is not in a BAR, or has one vector",
        ));
    }
    let entry = bars[tbir].0 + toff + 16;
    // SAFETY: entry 1 of the MSI-X table the capability names.
    unsafe {
        poke::<u32>(entry, 0xfee0_0000 | (apic & 0xff) << 12);
        poke::<u32>(entry + 4, 0);
        poke::<u32>(entry + 8, VECTOR as u32);
        poke::<u32>(entry + 12, 0);
    }
    e.write(
        slot,
        msix,
        (e.read(slot, msix) & 0xffff) | (control | 0x8000) << 16,
    );
    say!(
        "nvme msix vectors={} table=bar{}+{:#x}",
        (control & 0x7ff) + 1,
        tbir,
        toff
    );
    // Reset, admin queues, enable.
    c.wr(reg::CC, 0);
    c.wait_ready(false).map_err(Failure::Setup)?;
    for i in 0..6 {
        buf(i).fill(0);
    }
    let q = u32::from(QSIZE - 1);
    c.wr(reg::AQA, q << 16 | q);
    c.wr64(reg::ASQ, page(0));
    c.wr64(reg::ACQ, page(1));
    c.wr(reg::CC, 1 | 6 << 16 | 4 << 20);
    c.wait_ready(true).map_err(Failure::Setup)?;
    let limit = tsc_khz.saturating_mul(2000);
    let mut admin = Queue::new(&c, 0, page(0), page(1));
    // Identify.
    admin.run(
        "identify controller",
        command(op::IDENTIFY, 0, page(4), 1, 0, 0),
        limit,
    )?;
    let b = buf(4);
    say!(
        "nvme identify model=\"{}\" serial=\"{}\" namespaces={}",
        text(&b[24..64]),
        text(&b[4..24]),
        u32::from_le_bytes([b[516], b[517], b[518], b[519]])
    );
    admin.run(
        "identify namespace 1",
        command(op::IDENTIFY, 1, page(4), 0, 0, 0),
        limit,
    )?;
    let b = buf(4);
    let blocks = u64::from_le_bytes(b[0..8].try_into().unwrap_or([0; 8]));
    let lbaf = usize::from(b[26] & 0xf);
    let lbads = b[128 + 4 * lbaf + 2];
    if !(9..=12).contains(&lbads) || blocks == 0 {
        return Err(Failure::Setup(
            "namespace 1 has no blocks or an LBA size outside 512..4096",
        ));
    }
    let lba_bytes = 1u64 << lbads;
    say!("nvme namespace 1 blocks={} lba_bytes={}", blocks, lba_bytes);
    // One I/O queue pair: CQ 1 on MSI-X vector 1, SQ 1 on it.
    let size = u32::from(QSIZE - 1) << 16;
    admin.run(
        "create I/O completion queue",
        command(op::CREATE_CQ, 0, page(3), size | 1, 1 << 16 | 0b11, 0),
        limit,
    )?;
    admin.run(
        "create I/O submission queue",
        command(op::CREATE_SQ, 0, page(2), size | 1, 1 << 16 | 1, 0),
        limit,
    )?;
    let mut io = Queue::new(&c, 1, page(2), page(3));
    // Write, read back, compare.
    let per_page = (4096 / lba_bytes) as u32;
    let lba = hex(bi, "probe.nvme_lba", 0).min(blocks.saturating_sub(u64::from(per_page)));
    let seed = hex(bi, "probe.nvme_seed", 0x4e56_4d65);
    pattern(seed, buf(5));
    let sum = fnv1a(buf(5));
    io.run(
        "write",
        command(
            op::WRITE,
            1,
            page(5),
            lba as u32,
            (lba >> 32) as u32,
            per_page - 1,
        ),
        limit,
    )?;
    buf(5).fill(0);
    io.run(
        "read",
        command(
            op::READ,
            1,
            page(5),
            lba as u32,
            (lba >> 32) as u32,
            per_page - 1,
        ),
        limit,
    )?;
    let back = fnv1a(buf(5));
    say!(
        "nvme rw lba={} bytes=4096 written_fnv={:#018x} read_fnv={:#018x} ok={}",
        lba,
        sum,
        back,
        (sum == back) as u8
    );
    if sum != back {
        return Err(Failure::Setup(
            "the bytes read back are not the bytes written",
        ));
    }
    // Timed one-block reads.
    let read1 = command(op::READ, 1, page(5), lba as u32, (lba >> 32) as u32, 0);
    let warm = n / 10;
    // SAFETY: the BSP runs this; these are the only borrows of the two sample buffers.
    let (s, db) = unsafe { (sys::scratch(0), sys::scratch(1)) };
    let mut irqs = 0;
    for irq in [false, true] {
        if irq {
            sys::set_interrupts(matches!(
                crate::wake::mode(),
                crate::wake::Mode::Spin | crate::wake::Mode::HaltPoll(_)
            ));
        }
        let before_all = crate::wake::irq_count(VECTOR);
        for i in 0..n + warm {
            let before = crate::wake::irq_count(VECTOR);
            let t0 = rdtsc();
            let d = io.submit(read1);
            let done = if irq {
                while crate::wake::irq_count(VECTOR) == before {
                    crate::wake::wait_word(
                        crate::wake::irq_count_addr(VECTOR),
                        before,
                        crate::wake::mode(),
                    );
                    if rdtsc().wrapping_sub(t0) > limit {
                        break;
                    }
                }
                let t = rdtsc();
                let r = if crate::wake::irq_count(VECTOR) != before {
                    io.poll(limit)
                } else {
                    None
                };
                r.map(|r| (r, t))
            } else {
                io.poll(limit).map(|r| (r, rdtsc()))
            };
            match done {
                Some(((0, _), t)) => {
                    if i >= warm {
                        s[i - warm] = t.wrapping_sub(t0);
                        db[i - warm] = d;
                    }
                }
                Some(((st, _), _)) => {
                    sys::set_interrupts(false);
                    return Err(Failure::Status("a timed read", st));
                }
                None => {
                    sys::set_interrupts(false);
                    return Err(Failure::Timeout(
                        if irq {
                            "a read waited for by MSI-X"
                        } else {
                            "a polled read"
                        },
                        1,
                    ));
                }
            }
        }
        sys::set_interrupts(false);
        let mode = if irq { "irq" } else { "poll" };
        crate::stats::summarise("nvme", "submit", "completion", mode, &mut s[..n], tsc_khz);
        if !irq {
            crate::stats::summarise(
                "nvme",
                "doorbell",
                "completion",
                "none",
                &mut db[..n],
                tsc_khz,
            );
        } else {
            irqs = crate::wake::irq_count(VECTOR) - before_all;
        }
    }
    say!(
        "nvme submitted={} irqs={} sq_tail={} cq_head={}",
        2 * (n + warm) + 2,
        irqs,
        io.tail,
        io.head
    );
    if irqs < (n + warm) as u64 {
        return Err(Failure::Setup(
            "fewer MSI-X interrupts than reads waited for",
        ));
    }
    // Give the controller back disabled (the VMM resets it too).
    c.wr(reg::CC, 0);
    c.wait_ready(false).map_err(Failure::Setup)?;
    Ok(())
}
