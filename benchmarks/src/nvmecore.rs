//! An NVMe controller driven through two I/O queue pairs: the protocol, shared word for word
//! by the probe guest's driver (`tools/probe-guest/src/nvme.rs`, which includes this file)
//! and the bare-host twin that drives the same controller from host userspace through VFIO
//! (`crate::vfio_nvme`). Only `core`: no allocation, no OS.
//!
//! The caller gives BAR 0 ([`Bar0`]: 4-byte register accesses, doorbells included), a
//! clock, and eight 4 KiB pages of memory the device can DMA to ([`Page`]: where the CPU
//! sees each one and the address the device uses). [`bring_up`] resets the controller,
//! gives it an admin queue pair, enables it (4 KiB pages, 64-byte submission and 16-byte
//! completion entries), identifies it and namespace 1, asks for two I/O queue pairs (Set
//! Features, Number of Queues) and makes them: pair 1 with its completions on MSI-X
//! vector 1 (the caller programs that vector), pair 2 with its completion interrupt off, for
//! reads that poll (a completion there raises no interrupt, so nothing reaches the host or a
//! guest's vCPU); [`Queue`] submits and reaps.

use core::sync::atomic::{Ordering, fence};

/// Entries per queue (each queue one 4 KiB page or less).
pub const QSIZE: u16 = 64;
/// The controller's class code (mass storage, NVM, NVMe).
pub const CLASS_NVME: u32 = 0x01_08_02;
/// The MSI-X vector I/O queue pair 1's completions use.
pub const IO_VECTOR: u16 = 1;
/// The I/O queue pairs [`bring_up`] makes: 1 interrupts, 2 is polled.
pub const IO_QUEUES: u16 = 2;

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
    /// Admin: set features.
    pub const SET_FEATURES: u8 = 0x09;
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

/// A brought-up controller: its admin queue and its two I/O queue pairs.
pub struct Up {
    /// Identify's answers.
    pub id: Identity,
    /// The admin queue pair.
    pub admin: Queue,
    /// I/O queue pair 1 (completions on MSI-X vector [`IO_VECTOR`]).
    pub io: Queue,
    /// I/O queue pair 2 (no completion interrupt: polled only).
    pub polled: Queue,
}

/// Pages: admin SQ, admin CQ, I/O SQ 1, I/O CQ 1, identify buffer, I/O SQ 2, I/O CQ 2
/// (the caller's eighth page is its data buffer). Brings the controller up as the module
/// says; `limit` bounds each admin command, in clock ticks.
pub fn bring_up<B: Bar0>(c: &Controller<B>, pages: [Page; 7], limit: u64) -> Result<Up, Error> {
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
    // Number of Queues (feature 7), both counts 0-based; the controller answers with what
    // it allocated, which may be fewer.
    let want = u32::from(IO_QUEUES - 1);
    let got = admin.run(
        &c.bar,
        "set features (number of queues)",
        command(op::SET_FEATURES, 0, 0, 0x07, want << 16 | want, 0),
        limit,
    )?;
    if got & 0xffff < want || got >> 16 < want {
        return Err(Error::Setup(
            "the controller allocates fewer than two I/O queue pairs",
        ));
    }
    io_pair(
        c,
        &mut admin,
        1,
        (pages[2], pages[3]),
        Some(IO_VECTOR),
        limit,
    )?;
    io_pair(c, &mut admin, 2, (pages[5], pages[6]), None, limit)?;
    let io = c.queue(1, pages[2], pages[3]);
    let polled = c.queue(2, pages[5], pages[6]);
    Ok(Up {
        id: Identity {
            model,
            serial,
            blocks,
            lba_bytes: 1 << lbads,
        },
        admin,
        io,
        polled,
    })
}

/// Makes I/O queue pair `qid` over `sq` and `cq` (one page each, [`QSIZE`] entries) with
/// the admin queue: its completions raise MSI-X vector `vector`, or no interrupt at all.
fn io_pair<B: Bar0>(
    c: &Controller<B>,
    admin: &mut Queue,
    qid: u16,
    (sq, cq): (Page, Page),
    vector: Option<u16>,
    limit: u64,
) -> Result<(), Error> {
    let entries = u32::from(QSIZE - 1) << 16 | u32::from(qid);
    // CDW11: physically contiguous (bit 0), interrupts enabled (bit 1) on vector IV (31:16).
    let cq_flags = match vector {
        Some(v) => u32::from(v) << 16 | 0b11,
        None => 0b01,
    };
    admin.run(
        &c.bar,
        "create I/O completion queue",
        command(op::CREATE_CQ, 0, cq.dma, entries, cq_flags, 0),
        limit,
    )?;
    // CDW11: its completion queue (31:16), physically contiguous.
    admin.run(
        &c.bar,
        "create I/O submission queue",
        command(
            op::CREATE_SQ,
            0,
            sq.dma,
            entries,
            u32::from(qid) << 16 | 1,
            0,
        ),
        limit,
    )?;
    Ok(())
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

#[cfg(test)]
mod tests {
    //! `bring_up` against a controller modelled in memory: it runs the admin commands it
    //! is sent (Identify, Set Features, Create I/O CQ/SQ) and I/O reads, posts completions
    //! with their phase, and records the MSI-X vector each completion raises.

    use super::*;
    use std::cell::RefCell;
    use std::collections::BTreeMap;
    use std::rc::Rc;
    use std::sync::atomic::AtomicU64;

    #[derive(Default)]
    struct Cq {
        base: u64,
        tail: u16,
        phase: bool,
        vector: Option<u16>,
    }

    #[derive(Default)]
    struct State {
        cc: u32,
        aqa: u32,
        asq: u64,
        acq: u64,
        /// Submission queues: base, head, completion queue.
        sqs: BTreeMap<u16, (u64, u16, u16)>,
        cqs: BTreeMap<u16, Cq>,
        /// What Set Features Number of Queues answers (0-based counts).
        allocated: u32,
        /// (feature, cdw11) per Set Features.
        features: Vec<(u32, u32)>,
        /// The vector of every interrupt raised.
        raised: Vec<u16>,
    }

    #[derive(Clone)]
    struct Fake(Rc<RefCell<State>>);

    fn set64(v: &mut u64, off: u64, x: u32) {
        let shift = if off % 8 == 0 { 0 } else { 32 };
        *v = *v & !(0xffff_ffff << shift) | u64::from(x) << shift;
    }

    impl State {
        fn complete(&mut self, sqid: u16, cid: u16, status: u16, dw0: u32) {
            let cqid = self.sqs[&sqid].2;
            let cq = self.cqs.get_mut(&cqid).expect("the SQ's CQ exists");
            let e = (cq.base as *mut u32).wrapping_add(usize::from(cq.tail) * 4);
            let dw3 = u32::from(cid) | u32::from(!cq.phase) << 16 | u32::from(status) << 17;
            // SAFETY: a test page the driver gave as this CQ (dma is the CPU address here).
            unsafe { e.write_volatile(dw0) };
            // SAFETY: as above, the same entry's fourth dword.
            unsafe { e.wrapping_add(3).write_volatile(dw3) };
            cq.tail = (cq.tail + 1) % QSIZE;
            if cq.tail == 0 {
                cq.phase = !cq.phase;
            }
            if let Some(v) = cq.vector {
                self.raised.push(v);
            }
        }

        fn run(&mut self, qid: u16, c: [u32; 16]) {
            let (cid, opcode) = ((c[0] >> 16) as u16, c[0] as u8);
            let prp = u64::from(c[6]) | u64::from(c[7]) << 32;
            let (status, dw0) = match (qid, opcode) {
                (0, op::IDENTIFY) => {
                    // SAFETY: the page the command names, a test page.
                    let b = unsafe { core::slice::from_raw_parts_mut(prp as *mut u8, 4096) };
                    // The device writes the whole data structure.
                    b.fill(0);
                    if c[10] == 1 {
                        b[24..28].copy_from_slice(b"FAKE");
                    } else {
                        b[0..8].copy_from_slice(&1024u64.to_le_bytes());
                        b[130] = 12;
                    }
                    (0, 0)
                }
                (0, op::SET_FEATURES) => {
                    self.features.push((c[10], c[11]));
                    (0, self.allocated)
                }
                (0, op::CREATE_CQ) => {
                    let vector = (c[11] & 2 != 0).then_some((c[11] >> 16) as u16);
                    let cq = Cq {
                        base: prp,
                        vector,
                        ..Cq::default()
                    };
                    self.cqs.insert(c[10] as u16, cq);
                    (0, 0)
                }
                (0, op::CREATE_SQ) => {
                    let cqid = (c[11] >> 16) as u16;
                    if self.cqs.contains_key(&cqid) {
                        self.sqs.insert(c[10] as u16, (prp, 0, cqid));
                        (0, 0)
                    } else {
                        (0x100, 0)
                    }
                }
                (q, op::READ | op::WRITE) if q > 0 => (0, 0),
                _ => (1, 0),
            };
            self.complete(qid, cid, status, dw0);
        }
    }

    impl Bar0 for Fake {
        fn rd(&self, off: u64) -> u32 {
            let s = self.0.borrow();
            match off {
                // MQES 255 (0-based), CAP.TO one unit; DSTRD 0 above.
                reg::CAP => 255 | 1 << 24,
                reg::VS => 0x0001_0400,
                reg::CC => s.cc,
                reg::CSTS => s.cc & 1,
                _ => 0,
            }
        }

        fn wr(&self, off: u64, v: u32) {
            let mut s = self.0.borrow_mut();
            match off {
                reg::CC => {
                    s.cc = v;
                    s.sqs.clear();
                    s.cqs.clear();
                    if v & 1 != 0 {
                        let (asq, acq) = (s.asq, s.acq);
                        s.sqs.insert(0, (asq, 0, 0));
                        let admin = Cq {
                            base: acq,
                            vector: Some(0),
                            ..Cq::default()
                        };
                        s.cqs.insert(0, admin);
                    }
                }
                reg::AQA => s.aqa = v,
                o if (reg::ASQ..reg::ASQ + 8).contains(&o) => set64(&mut s.asq, o, v),
                o if (reg::ACQ..reg::ACQ + 8).contains(&o) => set64(&mut s.acq, o, v),
                o if o >= reg::DOORBELLS && (o - reg::DOORBELLS) % 8 == 0 => {
                    let qid = ((o - reg::DOORBELLS) / 8) as u16;
                    let (base, mut head, _) = s.sqs[&qid];
                    while head != v as u16 {
                        let e = (base as *const u32).wrapping_add(usize::from(head) * 16);
                        // SAFETY: entry `head` of a test page the driver gave as this SQ.
                        let c =
                            core::array::from_fn(|i| unsafe { e.wrapping_add(i).read_volatile() });
                        head = (head + 1) % QSIZE;
                        s.sqs.get_mut(&qid).unwrap().1 = head;
                        s.run(qid, c);
                    }
                }
                _ => {}
            }
        }
    }

    #[repr(C, align(4096))]
    struct PageMem([u8; 4096]);

    fn tick() -> u64 {
        static T: AtomicU64 = AtomicU64::new(0);
        T.fetch_add(1, Ordering::Relaxed)
    }

    fn up_with(allocated: u32) -> (Fake, Result<Up, Error>, Vec<PageMem>) {
        let fake = Fake(Rc::new(RefCell::new(State {
            allocated,
            ..State::default()
        })));
        let mut mem: Vec<PageMem> = (0..8).map(|_| PageMem([0; 4096])).collect();
        let pages: Vec<Page> = mem
            .iter_mut()
            .map(|p| {
                let cpu = p.0.as_mut_ptr();
                Page {
                    cpu,
                    dma: cpu as u64,
                }
            })
            .collect();
        let c = Controller::new(fake.clone(), tick, 1000);
        let up = bring_up(&c, core::array::from_fn(|i| pages[i]), 1 << 20);
        (fake, up, mem)
    }

    #[test]
    fn the_polled_queue_pair_raises_no_interrupt_and_the_other_raises_vector_1() {
        let (fake, up, mem) = up_with(1 << 16 | 1);
        let mut up = up.expect("bring-up");
        assert_eq!(text(&up.id.model), "FAKE");
        assert_eq!((up.id.blocks, up.id.lba_bytes), (1024, 4096));
        // Two queue pairs asked for (0-based), before any was made.
        assert_eq!(fake.0.borrow().features, vec![(0x07, 1 << 16 | 1)]);
        let vectors: Vec<_> = fake
            .0
            .borrow()
            .cqs
            .iter()
            .map(|(q, c)| (*q, c.vector))
            .collect();
        assert_eq!(vectors, vec![(0, Some(0)), (1, Some(IO_VECTOR)), (2, None)]);
        // Admin completions are polled; the device raised vector 0 for each of the seven
        // commands (two Identify, Set Features, two Create CQ/SQ pairs).
        assert_eq!(fake.0.borrow().raised, vec![0; 7]);
        fake.0.borrow_mut().raised.clear();
        let data = Page {
            cpu: mem[7].0.as_ptr().cast_mut(),
            dma: mem[7].0.as_ptr() as u64,
        };
        let read = io(false, &data, 0, 1);
        for _ in 0..(2 * QSIZE + 3) {
            let got = up.polled.run(&fake, "read", read, 1 << 20);
            assert_eq!(got, Ok(0));
        }
        assert_eq!(fake.0.borrow().raised, Vec::<u16>::new(), "polled reads");
        assert_eq!(up.polled.submitted, u64::from(2 * QSIZE + 3));
        up.io.run(&fake, "read", read, 1 << 20).unwrap();
        assert_eq!(fake.0.borrow().raised, vec![IO_VECTOR]);
    }

    #[test]
    fn a_controller_that_gives_one_io_queue_pair_is_refused_before_any_is_made() {
        for allocated in [0, 1, 1 << 16] {
            let (fake, up, _mem) = up_with(allocated);
            assert!(
                matches!(up, Err(Error::Setup(why)) if why.contains("two I/O queue pairs")),
                "allocated {allocated:#x}"
            );
            assert_eq!(fake.0.borrow().cqs.len(), 1, "only the admin CQ");
        }
    }
}
