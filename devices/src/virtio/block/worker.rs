//! One queue's worker: pop requests, run them on io_uring straight into guest memory,
//! publish completions, interrupt the guest.
//!
//! The loop: reap completions; take new requests while the ring has room (a full ring is
//! back-pressure: requests wait in the avail ring, nothing fails); signal the guest if it
//! wants to hear; when idle, spin for `poll` with notifications suppressed, then re-enable
//! them, look once more, and sleep in `io_uring_enter` until an I/O completes, the doorbell
//! eventfd fires (an io_uring poll on it) or the stop eventfd does.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use io_uring::register::Restriction;
use io_uring::{IoUring, opcode, squeue, types};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use super::disk::Disk;
use super::request::{self, Buf, Limits, Op, Parsed, S_IOERR, S_OK, SECTOR, Segment};
use crate::ratelimit::RateLimiter;
use crate::virtio::queue::Queue;
use crate::virtio::{INT_CONFIG, INT_VRING, VirtioInterrupt};
use crate::warn_ratelimited;

const TOKEN_NOTIFY: u64 = u64::MAX;
const TOKEN_STOP: u64 = u64::MAX - 1;
const TOKEN_CANCEL: u64 = u64::MAX - 2;

/// How a queue is served.
#[derive(Clone, Copy, Debug)]
pub struct WorkerConfig {
    /// Spin this long for new requests before sleeping (0: pure interrupt mode).
    pub poll: Duration,
    /// Host core to pin the worker to.
    pub core: Option<usize>,
    /// Use an io_uring SQPOLL kernel thread.
    pub sqpoll: bool,
}

/// Counters shared with the device (and printed at teardown).
#[derive(Debug, Default)]
pub struct QueueStats {
    /// Requests completed.
    pub requests: AtomicU64,
    /// Requests refused with a status code.
    pub refused: AtomicU64,
    /// Times the doorbell woke the worker.
    pub doorbells: AtomicU64,
    /// Interrupts raised.
    pub interrupts: AtomicU64,
    /// Times the ring was full (back-pressure).
    pub ring_full: AtomicU64,
}

/// What a worker shares with the device.
#[derive(Debug, Default)]
pub struct Shared {
    /// Set by the worker on a queue violation: the device must be reset.
    pub needs_reset: AtomicBool,
    /// Counters.
    pub stats: QueueStats,
}

/// An in-flight request. Its iovecs hold host pointers into guest memory.
struct Inflight {
    head: u16,
    status: u64,
    used_len: u32,
    expected: u64,
    ops: u32,
    failed: bool,
    /// Owned until the completion arrives: the kernel reads it.
    iovecs: Vec<libc::iovec>,
    /// Write-zeroes ranges to fall back to plain writes for, if the file refuses fallocate.
    zero_fallback: Vec<Segment>,
}

/// A queue worker.
pub struct Worker {
    queue: Queue,
    mem: GuestMemoryMmap,
    disk: Arc<Disk>,
    lim: Limits,
    ring: IoUring,
    slots: Vec<Option<Inflight>>,
    free: Vec<usize>,
    notify: Arc<EventFd>,
    stop: Arc<EventFd>,
    interrupt: Arc<VirtioInterrupt>,
    shared: Arc<Shared>,
    cfg: WorkerConfig,
    used_since_signal: bool,
    stopping: bool,
    /// Rate limit of its guest-triggered messages: the device's, so it lasts across
    /// activations (a guest may reset and re-activate without end).
    log: Arc<RateLimiter>,
}

// SAFETY: the raw pointers in `slots` point into guest memory, which outlives the worker
// thread (the device joins its workers before the VM's memory goes away), and into the
// slots' own iovec vectors, which move with the worker.
unsafe impl Send for Worker {}

/// Most SQEs one request can need (a discard with every segment).
fn max_ops(lim: &Limits) -> usize {
    lim.max_segments.max(1) as usize
}

/// The io_uring operations a worker issues; nothing else is allowed on its ring. io_uring
/// requests bypass seccomp, so this is the filter for them: no open, socket, connect,
/// nothing that reaches a file the worker does not already hold.
pub const RING_OPS: [u8; 6] = [
    opcode::Readv::CODE,
    opcode::Writev::CODE,
    opcode::Fsync::CODE,
    opcode::Fallocate::CODE,
    opcode::PollAdd::CODE,
    opcode::AsyncCancel::CODE,
];

/// A queue thread's ring, made once before the thread is confined (its seccomp filter
/// then denies `io_uring_setup` and `io_uring_register`): created disabled, restricted to
/// [`RING_OPS`], then enabled. Sized for the largest queue of `queue_size` entries.
pub fn ring(queue_size: u16, sqpoll: bool) -> std::io::Result<IoUring> {
    let entries = (queue_size as u32).max(8).next_power_of_two() * 2;
    let mut b = IoUring::builder();
    b.setup_r_disabled();
    if sqpoll {
        b.setup_sqpoll(50);
    }
    let ring = b.build(entries)?;
    let mut allowed = RING_OPS.map(Restriction::sqe_op);
    ring.submitter().register_restrictions(&mut allowed)?;
    ring.submitter().register_enable_rings()?;
    Ok(ring)
}

impl Worker {
    /// A worker for `queue` on `ring` (made by [`ring`] before the thread was confined;
    /// [`Worker::run`] gives it back for the next activation).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        queue: Queue,
        mem: GuestMemoryMmap,
        disk: Arc<Disk>,
        lim: Limits,
        notify: Arc<EventFd>,
        stop: Arc<EventFd>,
        interrupt: Arc<VirtioInterrupt>,
        shared: Arc<Shared>,
        cfg: WorkerConfig,
        ring: IoUring,
    ) -> Self {
        let n = queue.size() as usize;
        Self {
            queue,
            mem,
            disk,
            lim,
            ring,
            slots: (0..n).map(|_| None).collect(),
            free: (0..n).rev().collect(),
            notify,
            stop,
            interrupt,
            shared,
            cfg,
            used_since_signal: false,
            stopping: false,
            log: Arc::new(RateLimiter::new(5, Duration::from_secs(1))),
        }
    }

    /// Shares `log` as its rate limit (the device's, which outlives this activation).
    pub fn with_log(mut self, log: Arc<RateLimiter>) -> Self {
        self.log = log;
        self
    }

    fn push(&mut self, e: &squeue::Entry) -> bool {
        // SAFETY: every entry's buffers (iovec arrays in `slots`, guest memory) outlive the
        // operation: slots are only freed on their completion, guest memory outlives the
        // worker.
        unsafe { self.ring.submission().push(e).is_ok() }
    }

    fn arm(&mut self, fd: i32, token: u64) {
        let e = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32)
            .build()
            .user_data(token);
        if !self.push(&e) {
            let _ = self.ring.submit();
            let _ = self.push(&e);
        }
    }

    /// Runs until stopped, then gives the ring back with nothing left in it for the next
    /// activation. (The thread was pinned to `cfg.core` when it started.)
    pub fn run(mut self) -> IoUring {
        use std::os::fd::AsRawFd;
        let (nfd, sfd) = (self.notify.as_raw_fd(), self.stop.as_raw_fd());
        self.arm(nfd, TOKEN_NOTIFY);
        self.arm(sfd, TOKEN_STOP);
        let _ = self.ring.submit();
        let mut last_work = Instant::now();
        let mut polling = false;
        while !self.stopping {
            let mut did = self.reap(nfd);
            if self.stopping {
                break;
            }
            if self.shared.needs_reset.load(Ordering::Acquire) {
                // Nothing more from this queue until the driver resets the device: the
                // rings are not read again (a driver that ran its avail index ahead would
                // otherwise keep this loop spinning), only in-flight I/O completes.
                self.signal();
                let _ = self.ring.submit_and_wait(1);
                continue;
            }
            did |= self.fill();
            if did {
                let _ = self.ring.submit();
            }
            self.signal();
            if did {
                last_work = Instant::now();
                continue;
            }
            if !self.cfg.poll.is_zero() && last_work.elapsed() < self.cfg.poll {
                if !polling {
                    let _ = self.queue.disable_notification(&self.mem);
                    polling = true;
                }
                std::hint::spin_loop();
                continue;
            }
            polling = false;
            if self.stopping {
                break;
            }
            match self.queue.enable_notification(&self.mem) {
                Ok(true) => continue,
                Ok(false) => {}
                Err(e) => {
                    self.violation(e);
                    continue;
                }
            }
            let r = self.ring.submit_and_wait(1);
            log::trace!(
                "virtio-blk worker: woke ({r:?}), {} in flight",
                self.inflight()
            );
        }
        log::debug!(
            "virtio-blk worker: stopping with {} in flight",
            self.inflight()
        );
        // Let in-flight I/O finish: the kernel is writing into guest memory.
        while self.inflight() > 0 {
            let _ = self.ring.submit_and_wait(1);
            self.reap(nfd);
        }
        self.signal();
        self.cancel_doorbell_poll();
        self.ring
    }

    /// Takes the doorbell's poll out of the ring (the stop's has completed: that is how
    /// the worker stopped), so the next activation starts from an empty ring.
    fn cancel_doorbell_poll(&mut self) {
        let e = opcode::AsyncCancel::new(TOKEN_NOTIFY)
            .build()
            .user_data(TOKEN_CANCEL);
        if !self.push(&e) {
            let _ = self.ring.submit();
            let _ = self.push(&e);
        }
        // The cancel's own completion, and the poll's (cancelled, or fired before the
        // cancel reached it), whichever order they come in; at most a few seconds.
        let (mut cancel, mut poll) = (None::<i32>, false);
        let deadline = Instant::now() + Duration::from_secs(5);
        while (cancel.is_none() || (cancel == Some(0) && !poll)) && Instant::now() < deadline {
            let _ = self.ring.submit_and_wait(1);
            for c in self.ring.completion() {
                match c.user_data() {
                    TOKEN_CANCEL => cancel = Some(c.result()),
                    TOKEN_NOTIFY => poll = true,
                    _ => {}
                }
            }
        }
        if cancel.is_none() || (cancel == Some(0) && !poll) {
            log::warn!("virtio-blk worker: the doorbell poll did not leave the ring");
        }
    }

    fn inflight(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Marks the queue broken: said and signalled once; the run loop then stops reading
    /// the rings until the device is reset.
    fn violation(&mut self, e: crate::virtio::queue::QueueError) {
        if self.shared.needs_reset.swap(true, Ordering::AcqRel) {
            return;
        }
        log::error!("virtio-blk: queue violation, the device needs a reset: {e}");
        self.interrupt.trigger(INT_CONFIG);
    }

    fn complete(&mut self, head: u16, status: Option<u64>, code: u8, used_len: u32) {
        if let Some(s) = status {
            let _ = self.mem.write_obj(code, GuestAddress(s));
        }
        match self.queue.add_used(&self.mem, head, used_len) {
            Ok(()) => {
                self.used_since_signal = true;
                let c = if code == S_OK {
                    &self.shared.stats.requests
                } else {
                    &self.shared.stats.refused
                };
                c.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => self.violation(e),
        }
    }

    fn signal(&mut self) {
        if self.used_since_signal && self.queue.needs_interrupt(&self.mem) {
            self.interrupt.trigger(INT_VRING);
            self.shared.stats.interrupts.fetch_add(1, Ordering::Relaxed);
        }
        self.used_since_signal = false;
    }

    /// Takes requests while there is room for them; returns whether anything happened.
    fn fill(&mut self) -> bool {
        let mut did = false;
        loop {
            let room = {
                let sq = self.ring.submission();
                sq.capacity() - sq.len()
            };
            if self.free.is_empty() || room < max_ops(&self.lim) {
                let pending = self.queue.pending(&self.mem).unwrap_or(0);
                if pending > 0 {
                    self.shared.stats.ring_full.fetch_add(1, Ordering::Relaxed);
                }
                return did;
            }
            let chain = match self.queue.pop(&self.mem) {
                Ok(Some(c)) => c,
                Ok(None) => return did,
                Err(e) => {
                    self.violation(e);
                    return did;
                }
            };
            did = true;
            match request::parse(&chain, &self.mem, &self.lim) {
                Parsed::Fail {
                    head,
                    status,
                    code,
                    why,
                } => {
                    warn_ratelimited!(self.log, "virtio-blk: request {head} refused: {why}");
                    self.complete(head, status, code, status.map_or(0, |_| 1));
                }
                Parsed::Ok(req) => self.start(req),
            }
        }
    }

    fn start(&mut self, req: request::Request) {
        let used_len = req.used_len();
        let (head, status) = (req.head, req.status);
        match req.op {
            Op::GetId { buf } => {
                let n = buf.len.min(request::ID_BYTES) as usize;
                let id = self.disk.id;
                let r = self.mem.write_slice(&id[..n], GuestAddress(buf.addr));
                let code = if r.is_ok() { S_OK } else { S_IOERR };
                self.complete(head, Some(status), code, used_len);
            }
            op => {
                let Some(slot) = self.free.pop() else {
                    // fill() checked for a free slot.
                    self.complete(head, Some(status), S_IOERR, 1);
                    return;
                };
                let mut inf = Inflight {
                    head,
                    status,
                    used_len,
                    expected: 0,
                    ops: 0,
                    failed: false,
                    iovecs: Vec::new(),
                    zero_fallback: Vec::new(),
                };
                let entries = self.entries(op, &mut inf, slot as u64);
                inf.ops = entries.len() as u32;
                self.slots[slot] = Some(inf);
                if entries.is_empty() {
                    self.finish(slot);
                }
                for e in entries {
                    if !self.push(&e) {
                        // Cannot happen: fill() checked the room.
                        if let Some(i) = self.slots[slot].as_mut() {
                            i.failed = true;
                            i.ops -= 1;
                        }
                    }
                }
            }
        }
    }

    fn entries(&self, op: Op, inf: &mut Inflight, token: u64) -> Vec<squeue::Entry> {
        let rw = |sector: u64, bufs: &[Buf], inf: &mut Inflight, write: bool| {
            inf.iovecs = bufs
                .iter()
                .map(|b| libc::iovec {
                    iov_base: b.host.cast(),
                    iov_len: b.len as usize,
                })
                .collect();
            inf.expected = bufs.iter().map(|b| b.len as u64).sum();
            let off = sector * SECTOR;
            let (fd, _direct) = self
                .disk
                .fd_for(off, bufs.iter().map(|b| (b.host as u64, b.len as u64)));
            let (ptr, n) = (inf.iovecs.as_ptr(), inf.iovecs.len() as u32);
            let e = if write {
                opcode::Writev::new(types::Fd(fd), ptr, n)
                    .offset(off)
                    .build()
            } else {
                opcode::Readv::new(types::Fd(fd), ptr, n)
                    .offset(off)
                    .build()
            };
            vec![e.user_data(token)]
        };
        use std::os::fd::AsRawFd;
        let fd = types::Fd(self.disk.file.as_raw_fd());
        match op {
            Op::Read { sector, bufs } => rw(sector, &bufs, inf, false),
            Op::Write { sector, bufs } => rw(sector, &bufs, inf, true),
            Op::Flush => vec![
                opcode::Fsync::new(fd)
                    .flags(types::FsyncFlags::DATASYNC)
                    .build()
                    .user_data(token),
            ],
            Op::Discard(segs) => segs
                .iter()
                .map(|s| fallocate(fd, s, libc::FALLOC_FL_PUNCH_HOLE, token))
                .collect(),
            Op::WriteZeroes(segs) => {
                // If the file cannot zero in place, these get plain writes of zeroes.
                inf.zero_fallback = segs.clone();
                segs.iter()
                    .map(|s| {
                        let mode = if s.unmap {
                            libc::FALLOC_FL_PUNCH_HOLE
                        } else {
                            libc::FALLOC_FL_ZERO_RANGE
                        };
                        fallocate(fd, s, mode, token)
                    })
                    .collect()
            }
            Op::GetId { .. } => Vec::new(),
        }
    }

    fn finish(&mut self, slot: usize) {
        let Some(inf) = self.slots[slot].take() else {
            return;
        };
        self.free.push(slot);
        let code = if inf.failed { S_IOERR } else { S_OK };
        let used = if inf.failed { 1 } else { inf.used_len };
        self.complete(inf.head, Some(inf.status), code, used);
    }

    /// Processes completions; returns whether any request finished.
    fn reap(&mut self, notify_fd: i32) -> bool {
        let mut did = false;
        let cqes: Vec<(u64, i32)> = self
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (token, res) in cqes {
            match token {
                TOKEN_NOTIFY => {
                    let _ = self.notify.read();
                    self.shared.stats.doorbells.fetch_add(1, Ordering::Relaxed);
                    self.arm(notify_fd, TOKEN_NOTIFY);
                    did = true;
                }
                TOKEN_STOP => {
                    log::debug!("virtio-blk worker: stop ({res})");
                    self.stopping = true;
                }
                slot => {
                    let slot = slot as usize;
                    let disk = self.disk.clone();
                    let Some(inf) = self.slots.get_mut(slot).and_then(Option::as_mut) else {
                        continue;
                    };
                    if res < 0 {
                        let eopnotsupp = -res == libc::EOPNOTSUPP;
                        if eopnotsupp && !inf.zero_fallback.is_empty() {
                            // The file cannot zero a range in place: write zeroes.
                            if !write_zeroes(&disk, &inf.zero_fallback) {
                                inf.failed = true;
                            }
                            inf.zero_fallback.clear();
                        } else if eopnotsupp {
                            // A discard the file cannot do: discard is advisory.
                        } else {
                            warn_ratelimited!(
                                self.log,
                                "virtio-blk: I/O on {} failed: {}",
                                disk.path.display(),
                                std::io::Error::from_raw_os_error(-res)
                            );
                            inf.failed = true;
                        }
                    } else if inf.expected > 0 && res as u64 != inf.expected {
                        warn_ratelimited!(
                            self.log,
                            "virtio-blk: short I/O ({res} of {} bytes)",
                            inf.expected
                        );
                        inf.failed = true;
                    }
                    inf.ops = inf.ops.saturating_sub(1);
                    if inf.ops == 0 {
                        self.finish(slot);
                        did = true;
                    }
                }
            }
        }
        did
    }
}

fn fallocate(fd: types::Fd, s: &Segment, mode: i32, token: u64) -> squeue::Entry {
    opcode::Fallocate::new(fd, s.sectors as u64 * SECTOR)
        .offset(s.sector * SECTOR)
        .mode(mode | libc::FALLOC_FL_KEEP_SIZE)
        .build()
        .user_data(token)
}

/// Zeroes ranges with plain writes (files that refuse FALLOC_FL_ZERO_RANGE).
fn write_zeroes(disk: &Disk, segs: &[Segment]) -> bool {
    use std::os::unix::fs::FileExt;
    let zeros = vec![0u8; 1 << 16];
    for s in segs {
        let mut off = s.sector * SECTOR;
        let mut left = s.sectors as u64 * SECTOR;
        while left > 0 {
            let n = left.min(zeros.len() as u64) as usize;
            if disk.file.write_all_at(&zeros[..n], off).is_err() {
                return false;
            }
            off += n as u64;
            left -= n as u64;
        }
    }
    true
}

/// Pins the calling thread to `core` (core_affinity: `sched_setaffinity` on this thread).
pub fn pin(core: usize) -> bool {
    core_affinity::set_for_current(core_affinity::CoreId { id: core })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the kernel answers for `e` on `ring`.
    fn answer(ring: &mut IoUring, e: squeue::Entry) -> i32 {
        // SAFETY: the entry's buffers (a static path, none for a socket) outlive the call,
        // which waits for its completion.
        unsafe { ring.submission().push(&e).unwrap() };
        ring.submit_and_wait(1).unwrap();
        ring.completion().next().unwrap().result()
    }

    #[test]
    fn a_workers_ring_refuses_open_and_socket_and_runs_its_own_operations() {
        let mut ring = match ring(MAX_QUEUE_SIZE_FOR_TEST, false) {
            Ok(r) => r,
            Err(e) => {
                skip::skip(
                    "devices::virtio::block::worker::a_workers_ring_refuses_open_and_socket_and_runs_its_own_operations",
                    &format!("this kernel gives no io_uring ({e})"),
                );
                return;
            }
        };
        // OPENAT of /etc/passwd and SOCKET: refused by the ring's restrictions.
        let open = opcode::OpenAt::new(types::Fd(libc::AT_FDCWD), c"/etc/passwd".as_ptr())
            .flags(libc::O_RDONLY)
            .build();
        assert_eq!(answer(&mut ring, open), -libc::EACCES);
        let socket = opcode::Socket::new(libc::AF_INET, libc::SOCK_STREAM, 0).build();
        assert_eq!(answer(&mut ring, socket), -libc::EACCES);
        // Its own: a poll on an eventfd, cancelled.
        let e = EventFd::new(0).unwrap();
        use std::os::fd::AsRawFd;
        let poll = opcode::PollAdd::new(types::Fd(e.as_raw_fd()), libc::POLLIN as u32)
            .build()
            .user_data(TOKEN_NOTIFY);
        // SAFETY: the eventfd outlives the poll (cancelled below).
        unsafe { ring.submission().push(&poll).unwrap() };
        ring.submit().unwrap();
        let cancel = opcode::AsyncCancel::new(TOKEN_NOTIFY)
            .build()
            .user_data(TOKEN_CANCEL);
        let mut results = std::collections::BTreeMap::new();
        // SAFETY: no buffers.
        unsafe { ring.submission().push(&cancel).unwrap() };
        while results.len() < 2 {
            ring.submit_and_wait(1).unwrap();
            for c in ring.completion() {
                results.insert(c.user_data(), c.result());
            }
        }
        assert_eq!(results[&TOKEN_CANCEL], 0);
        assert_eq!(results[&TOKEN_NOTIFY], -libc::ECANCELED);
    }

    const MAX_QUEUE_SIZE_FOR_TEST: u16 = crate::virtio::queue::MAX_QUEUE_SIZE;
}
