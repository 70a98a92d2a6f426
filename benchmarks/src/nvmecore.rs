//! An NVMe controller driven through one I/O queue pair: the protocol, shared word for word
//! by the probe guest's driver (`tools/probe-guest/src/nvme.rs`, which includes this file)
//! and the bare-host twin that drives the same controller from host userspace through VFIO
//! (`crate::vfio_nvme`). Only `core`: no allocation, no OS.
//!
//! The caller gives BAR 0 ([`Bar0`]: 4-byte register accesses, doorbells included), a
//! clock, and six 4 KiB pages of memory the device can DMA to ([`Page`]: where the CPU
//! sees each one and the address the device uses). [`bring_up`] resets the controller,
//! gives it an admin queue pair, enables it (4 KiB pages, 64-byte submission and 16-byte
//! completion entries), identifies it and namespace 1, and makes I/O queue pair 1 with
//! its completions on MSI-X vector 1 (the caller programs that vector); [`Queue`] submits
//! and reaps.

use core::sync::atomic::{Ordering, fence};

/// Entries per queue (each queue one 4 KiB page or less).
pub const QSIZE: u16 = 64;
/// The controller's class code (mass storage, NVM, NVMe).
pub const CLASS_NVME: u32 = 0x01_08_02;
/// The MSI-X vector the I/O queue's completions use.
pub const IO_VECTOR: u16 = 1;

/// Register offsets in BAR 0.
pub mod reg {
    /// Capabilities (64-bit).
    pub const CAP: u64 = 0x00;
    /// Version.
    pub const VS: u64 = 0x08;
    /// Controller configuration.
    pub const CC: u64 = 0x14;
    /// Controller status.
    pub const CSTS: u64 = 0x1c;
    /// Admin queue attributes.
    pub const AQA: u64 = 0x24;
    /// Admin submission queue base (64-bit).
    pub const ASQ: u64 = 0x28;
    /// Admin completion queue base (64-bit).
    pub const ACQ: u64 = 0x30;
    /// The first doorbell.
    pub const DOORBELLS: u64 = 0x1000;
}

/// Command opcodes.
pub mod op {
    /// Admin: create an I/O submission queue.
    pub const CREATE_SQ: u8 = 0x01;
    /// Admin: create an I/O completion queue.
    pub const CREATE_CQ: u8 = 0x05;
    /// Admin: identify.
    pub const IDENTIFY: u8 = 0x06;
    /// I/O: write.
    pub const WRITE: u8 = 0x01;
    /// I/O: read.
    pub const READ: u8 = 0x02;
}

/// BAR 0 of the controller.
pub trait Bar0 {
    /// A 4-byte read at `off`.
    fn rd(&self, off: u64) -> u32;
    /// A 4-byte write at `off`.
    fn wr(&self, off: u64, v: u32);
}

/// A 4 KiB page the device reads or writes by DMA.
#[derive(Clone, Copy, Debug)]
pub struct Page {
    /// Where the CPU sees it.
    pub cpu: *mut u8,
    /// The address the device uses for it (guest physical in a guest, I/O virtual through
    /// VFIO on a host).
    pub dma: u64,
}

impl Page {
    /// The page's bytes.
    ///
    /// # Safety
    /// `cpu` must point at 4 KiB this driver owns, and no command that names the page may
    /// be outstanding while the slice lives.
    pub unsafe fn bytes<'a>(self) -> &'a mut [u8] {
        // SAFETY: as the caller guarantees.
        unsafe { core::slice::from_raw_parts_mut(self.cpu, 4096) }
    }
}

/// What went wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// The controller or its namespace is not what this driver can use.
    Setup(&'static str),
    /// A command completed with a non-zero status.
    Status(&'static str, u16),
    /// A command did not complete in time on the queue.
    Timeout(&'static str, u16),
}

/// The controller's registers and limits.
pub struct Controller<B: Bar0> {
    /// BAR 0.
    pub bar: B,
    stride: u64,
    /// CAP.TO in clock ticks.
    timeout: u64,
    now: fn() -> u64,
    /// CAP.MQES + 1.
    pub max_entries: u32,
    /// CAP.DSTRD.
    pub doorbell_stride: u32,
}

impl<B: Bar0> Controller<B> {
    /// Reads CAP through `bar`; `now` is the clock and `ticks_per_ms` its rate.
    pub fn new(bar: B, now: fn() -> u64, ticks_per_ms: u64) -> Self {
        let lo = bar.rd(reg::CAP);
        let hi = bar.rd(reg::CAP + 4);
        let to_ms = u64::from(lo >> 24 & 0xff).max(1) * 500;
        Self {
            bar,
            stride: 4 << (hi & 0xf),
            timeout: ticks_per_ms.saturating_mul(to_ms),
            now,
            max_entries: (lo & 0xffff) + 1,
            doorbell_stride: hi & 0xf,
        }
    }

    /// The version register.
    pub fn version(&self) -> u32 {
        self.bar.rd(reg::VS)
    }

    fn wr64(&self, off: u64, v: u64) {
        // Two 4-byte writes, low first: some controllers take no 8-byte accesses.
        self.bar.wr(off, v as u32);
        self.bar.wr(off + 4, (v >> 32) as u32);
    }

    /// Waits until CSTS.RDY is `ready`; CSTS.CFS or CAP.TO fail it.
    pub fn wait_ready(&self, ready: bool) -> Result<(), Error> {
        let t0 = (self.now)();
        loop {
            let st = self.bar.rd(reg::CSTS);
            if st & 2 != 0 {
                return Err(Error::Setup(
                    "the controller reports a fatal status (CSTS.CFS)",
                ));
            }
            if (st & 1 != 0) == ready {
                return Ok(());
            }
            if (self.now)().wrapping_sub(t0) > self.timeout {
                return Err(Error::Setup("CSTS.RDY did not follow CC.EN within CAP.TO"));
            }
            core::hint::spin_loop();
        }
    }

    /// Disables the controller (CC.EN = 0) and waits for it.
    pub fn disable(&self) -> Result<(), Error> {
        self.bar.wr(reg::CC, 0);
        self.wait_ready(false)
    }

    /// Queue `qid` over the pages `sq` and `cq`, at its start.
    pub fn queue(&self, qid: u16, sq: Page, cq: Page) -> Queue {
        let db = |cq: u64| reg::DOORBELLS + (2 * u64::from(qid) + cq) * self.stride;
        Queue {
            qid,
            sq,
            cq,
            tail: 0,
            head: 0,
            phase: true,
            sq_db: db(0),
            cq_db: db(1),
            cid: 0,
            now: self.now,
            submitted: 0,
        }
    }
}

/// One submission/completion queue pair.
pub struct Queue {
    qid: u16,
    sq: Page,
    cq: Page,
    /// The submission queue's tail (ours to move).
    pub tail: u16,
    /// The completion queue's head (ours to move).
    pub head: u16,
    phase: bool,
    sq_db: u64,
    cq_db: u64,
    cid: u16,
    now: fn() -> u64,
    /// Commands submitted on it so far (counted, for the reports).
    pub submitted: u64,
}

impl Queue {
    /// Writes `cmd` (its command identifier filled in) at the tail and rings the tail
    /// doorbell. Returns the clock ticks the doorbell store took.
    pub fn submit(&mut self, bar: &impl Bar0, mut cmd: [u32; 16]) -> u64 {
        self.cid = self.cid.wrapping_add(1);
        cmd[0] = (cmd[0] & 0xffff) | u32::from(self.cid) << 16;
        let slot = self.sq.cpu.wrapping_add(usize::from(self.tail) * 64) as *mut u32;
        for (i, w) in cmd.iter().enumerate() {
            // SAFETY: entry `tail` of our submission queue page; the device reads it only
            // after the doorbell below.
            unsafe { slot.wrapping_add(i).write_volatile(*w) };
        }
        self.tail = (self.tail + 1) % QSIZE;
        self.submitted += 1;
        fence(Ordering::SeqCst);
        let t0 = (self.now)();
        bar.wr(self.sq_db, u32::from(self.tail));
        (self.now)().wrapping_sub(t0)
    }

    /// The completion at the head if the device has posted it: (status, dword 0), status
    /// 0xffff when it is not the last command's. The head moves on and its doorbell is
    /// written.
    pub fn reap(&mut self, bar: &impl Bar0) -> Option<(u16, u32)> {
        let e = self.cq.cpu.wrapping_add(usize::from(self.head) * 16) as *const u32;
        // SAFETY: entry `head` of our completion queue page, written by the device.
        let dw3 = unsafe { e.wrapping_add(3).read_volatile() };
        if (dw3 >> 16 & 1 != 0) != self.phase {
            return None;
        }
        fence(Ordering::Acquire);
        // SAFETY: as above.
        let dw0 = unsafe { e.read_volatile() };
        let (cid, status) = (dw3 as u16, (dw3 >> 17) as u16);
        self.head = (self.head + 1) % QSIZE;
        if self.head == 0 {
            self.phase = !self.phase;
        }
        bar.wr(self.cq_db, u32::from(self.head));
        Some((if cid == self.cid { status } else { 0xffff }, dw0))
    }

    /// Polls for the last submission's completion for up to `limit` ticks.
    pub fn poll(&mut self, bar: &impl Bar0, limit: u64) -> Option<(u16, u32)> {
        let t0 = (self.now)();
        loop {
            if let Some(r) = self.reap(bar) {
                return Some(r);
            }
            if (self.now)().wrapping_sub(t0) > limit {
                return None;
            }
            core::hint::spin_loop();
        }
    }

    /// Submits `cmd` and polls for it; its dword 0, or what went wrong.
    pub fn run(
        &mut self,
        bar: &impl Bar0,
        what: &'static str,
        cmd: [u32; 16],
        limit: u64,
    ) -> Result<u32, Error> {
        self.submit(bar, cmd);
        match self.poll(bar, limit) {
            Some((0, dw0)) => Ok(dw0),
            Some((status, _)) => Err(Error::Status(what, status)),
            None => Err(Error::Timeout(what, self.qid)),
        }
    }
}

/// A command: opcode, namespace, data page, dwords 10 to 12.
pub fn command(opcode: u8, nsid: u32, prp1: u64, cdw10: u32, cdw11: u32, cdw12: u32) -> [u32; 16] {
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

/// A read (`write` false) or write of `blocks` blocks at `lba` into or from `page`.
pub fn io(write: bool, page: &Page, lba: u64, blocks: u32) -> [u32; 16] {
    let opcode = if write { op::WRITE } else { op::READ };
    command(
        opcode,
        1,
        page.dma,
        lba as u32,
        (lba >> 32) as u32,
        blocks - 1,
    )
}

/// What Identify said.
pub struct Identity {
    /// Model number (ASCII, space padded).
    pub model: [u8; 40],
    /// Serial number (ASCII, space padded).
    pub serial: [u8; 20],
    /// Namespace 1's size in blocks.
    pub blocks: u64,
    /// Namespace 1's block size.
    pub lba_bytes: u64,
}

/// A brought-up controller: its admin queue and I/O queue pair 1.
pub struct Up {
    /// Identify's answers.
    pub id: Identity,
    /// The admin queue pair.
    pub admin: Queue,
    /// I/O queue pair 1 (completions on MSI-X vector [`IO_VECTOR`]).
    pub io: Queue,
}

/// Pages: admin SQ, admin CQ, I/O SQ, I/O CQ, identify buffer (the caller's sixth page is
/// its data buffer). Brings the controller up as the module says; `limit` bounds each
/// admin command, in clock ticks.
pub fn bring_up<B: Bar0>(c: &Controller<B>, pages: [Page; 5], limit: u64) -> Result<Up, Error> {
    if c.max_entries < u32::from(QSIZE) {
        return Err(Error::Setup(
            "the controller's queues are shorter than ours",
        ));
    }
    c.disable()?;
    for p in &pages {
        // SAFETY: the caller's pages, none named by a command yet.
        unsafe { p.bytes() }.fill(0);
    }
    let q = u32::from(QSIZE - 1);
    c.bar.wr(reg::AQA, q << 16 | q);
    c.wr64(reg::ASQ, pages[0].dma);
    c.wr64(reg::ACQ, pages[1].dma);
    c.bar.wr(reg::CC, 1 | 6 << 16 | 4 << 20);
    c.wait_ready(true)?;
    let mut admin = c.queue(0, pages[0], pages[1]);
    let idp = pages[4];
    admin.run(
        &c.bar,
        "identify controller",
        command(op::IDENTIFY, 0, idp.dma, 1, 0, 0),
        limit,
    )?;
    let mut model = [0u8; 40];
    let mut serial = [0u8; 20];
    {
        // SAFETY: the identify page, written by the command that completed.
        let b = unsafe { idp.bytes() };
        model.copy_from_slice(&b[24..64]);
        serial.copy_from_slice(&b[4..24]);
    }
    admin.run(
        &c.bar,
        "identify namespace 1",
        command(op::IDENTIFY, 1, idp.dma, 0, 0, 0),
        limit,
    )?;
    // SAFETY: as above.
    let b = unsafe { idp.bytes() };
    let mut size = [0u8; 8];
    size.copy_from_slice(&b[0..8]);
    let blocks = u64::from_le_bytes(size);
    let lbads = b[128 + 4 * usize::from(b[26] & 0xf) + 2];
    if !(9..=12).contains(&lbads) || blocks == 0 {
        return Err(Error::Setup(
            "namespace 1 has no blocks or a block size outside 512..4096",
        ));
    }
    let entries = u32::from(QSIZE - 1) << 16;
    admin.run(
        &c.bar,
        "create I/O completion queue",
        command(
            op::CREATE_CQ,
            0,
            pages[3].dma,
            entries | 1,
            u32::from(IO_VECTOR) << 16 | 0b11,
            0,
        ),
        limit,
    )?;
    admin.run(
        &c.bar,
        "create I/O submission queue",
        command(op::CREATE_SQ, 0, pages[2].dma, entries | 1, 1 << 16 | 1, 0),
        limit,
    )?;
    let io = c.queue(1, pages[2], pages[3]);
    Ok(Up {
        id: Identity {
            model,
            serial,
            blocks,
            lba_bytes: 1 << lbads,
        },
        admin,
        io,
    })
}

/// The text of an Identify string, padding trimmed.
pub fn text(b: &[u8]) -> &str {
    core::str::from_utf8(b)
        .unwrap_or("?")
        .trim_end_matches([' ', '\0'])
}

/// FNV-1a over `b`.
pub fn fnv1a(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Fills `out` with the xorshift pattern of `seed`.
pub fn pattern(seed: u64, out: &mut [u8]) {
    let mut x = seed | 1;
    for chunk in out.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
}
