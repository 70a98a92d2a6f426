//! Wake-up benchmarks (`probe.bench=wake`) and the idle window (`probe.bench=idle`).
//!
//! The idle mode follows what a Linux guest would do under the VMM's idle policy:
//! `idle=poll` on the command line → spin; `idle=halt` → hlt; MONITOR/MWAIT in CPUID → mwait; the
//! KVM_HINTS_REALTIME hint → haltpoll (spin up to `probe.haltpoll_us`, default 200, like
//! guest_halt_poll_ns, then hlt); otherwise hlt. `probe.idle=` overrides.
//!
//! - `ipi`: IPI ping-pong between the BSP and the first AP, both idling in that mode between
//!   messages; the BSP times each round trip with RDTSC.
//! - `timer`: TSC-deadline timer armed `probe.timer_us` (default 1000) ahead, idle, and how
//!   late the wake-up is (cyclictest's question).
//! - `shm`: ping-pong through shared memory in ring 3, no interrupts: the floor.
//!
//! Hlt and mwait waits are ring 0 (`sys::wait`, `sys::pingpong`, `sys::timer_wait`); spin and
//! the poll half of haltpoll are ring 3. The first `probe.wake_warmup` (default 20) samples
//! of each test are discarded.

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::bootinfo::BootInfo;
use crate::smp;
use crate::sys::{self, cpuid, peek, rdtsc};

/// Interrupt vectors (ring0.s handles all of them alike: count, EOI).
pub const VEC_PING: usize = 0x40;
pub const VEC_PONG: usize = 0x41;
pub const VEC_TIMER: usize = 0x42;
pub const VEC_KICK: usize = 0x43;
const MAX_SAMPLES: usize = 4096;

unsafe extern "C" {
    static irq_counts: [u64; 256];
    static wake_samples: [u64; MAX_SAMPLES];
    static wake_rounds: [u64; 2];
    static wake_spurious: [u64; 2];
}

/// The ping-pong's round words (0: PING's, 1: PONG's), shared with ring 0's ping-pong
/// (ring0.s `sys_pingpong`): a side publishes round r in its word before it sends the IPI,
/// and its peer goes on only when the word says r. The IPI is the doorbell, not the
/// message, so an interrupt delivered twice (the rig's QEMU TCG does that now and then,
/// docs/testing.md) or one that comes after its round was seen ends no extra round.
fn round_word(which: usize) -> &'static AtomicU64 {
    // SAFETY: wake_rounds is two 8-byte-aligned u64s in .bss, touched only by the
    // ping-pong (here and in ring 0) with single aligned loads and stores.
    unsafe { &*((&raw const wake_rounds as *const AtomicU64).add(which)) }
}

/// Wake-ups on PING's (0) or PONG's (1) vector that found no new round in the word.
fn spurious(which: usize) -> &'static AtomicU64 {
    // SAFETY: as `round_word`; ring 0 increments these with `incq` on the CPU that waits.
    unsafe { &*((&raw const wake_spurious as *const AtomicU64).add(which)) }
}

/// Waits, in `m`, until round word `which` says `r`, the vector's count being the doorbell
/// (its interrupt ends the wait; a wake-up without the round is counted, then waited past).
fn wait_round(which: usize, vector: usize, r: u64, m: Mode) {
    let word = round_word(which);
    let mut old = count(vector);
    while word.load(Ordering::Acquire) != r {
        wait_word(count_addr(vector), old, m);
        old = count(vector);
        if word.load(Ordering::Acquire) != r {
            spurious(which).fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// How a CPU waits.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `sti; hlt` in ring 0.
    Hlt,
    /// `monitor; mwait` in ring 0.
    Mwait,
    /// Spin in ring 3.
    Spin,
    /// Spin in ring 3 for up to this many TSC cycles, then hlt.
    HaltPoll(u64),
}

impl Mode {
    /// Name for the report.
    pub fn name(self) -> &'static str {
        match self {
            Self::Hlt => "hlt",
            Self::Mwait => "mwait",
            Self::Spin => "spin",
            Self::HaltPoll(_) => "haltpoll",
        }
    }
    const fn code(self) -> u32 {
        match self {
            Self::Hlt => 0,
            Self::Mwait => 1,
            Self::Spin => 2,
            Self::HaltPoll(_) => 3,
        }
    }
}

/// The mode all CPUs use, set by the BSP before it starts the APs.
static MODE: AtomicU32 = AtomicU32::new(0);
static POLL_CYCLES: AtomicU64 = AtomicU64::new(0);

/// Picks the idle mode from the command line and CPUID.
pub fn detect(bi: &BootInfo, tsc_khz: u64) -> (Mode, &'static str) {
    let poll_us: u64 = bi
        .arg("probe.haltpoll_us")
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let haltpoll = Mode::HaltPoll(poll_us * tsc_khz.max(1) / 1000);
    let mwait_ok = cpuid(1, 0)[2] & (1 << 3) != 0;
    let chosen = match bi.arg("probe.idle") {
        Some("hlt") => (Mode::Hlt, "probe.idle"),
        Some("mwait") if mwait_ok => (Mode::Mwait, "probe.idle"),
        Some("spin") => (Mode::Spin, "probe.idle"),
        Some("haltpoll") => (haltpoll, "probe.idle"),
        _ if bi.arg("idle") == Some("poll") => (Mode::Spin, "idle=poll on the command line"),
        _ if bi.arg("idle") == Some("halt") => (Mode::Hlt, "idle=halt on the command line"),
        _ if mwait_ok => (Mode::Mwait, "MONITOR/MWAIT in CPUID"),
        _ if cpuid(0x4000_0001, 0)[3] & 1 != 0 => (haltpoll, "KVM_HINTS_REALTIME in CPUID"),
        _ => (Mode::Hlt, "default"),
    };
    MODE.store(chosen.0.code(), Ordering::Release);
    if let Mode::HaltPoll(c) = chosen.0 {
        POLL_CYCLES.store(c, Ordering::Release);
    }
    chosen
}

/// The mode in force.
pub fn mode() -> Mode {
    match MODE.load(Ordering::Acquire) {
        1 => Mode::Mwait,
        2 => Mode::Spin,
        3 => Mode::HaltPoll(POLL_CYCLES.load(Ordering::Acquire)),
        _ => Mode::Hlt,
    }
}

/// How many times vector `v` was taken.
pub fn irq_count(v: usize) -> u64 {
    count(v)
}

/// Address of vector `v`'s counter (for `sys::wait`).
pub fn irq_count_addr(v: usize) -> *const u64 {
    count_addr(v)
}

fn count(v: usize) -> u64 {
    // SAFETY: irq_counts is the ring-0 counter array; reading it is always fine.
    unsafe { peek((&raw const irq_counts as *const u64).add(v) as u64) }
}

fn count_addr(v: usize) -> *const u64 {
    // SAFETY: v < 256.
    unsafe { (&raw const irq_counts as *const u64).add(v) }
}

/// Waits, in `mode`, until the u64 at `addr` differs from `old`. Interrupts must be on in
/// ring 3 for the spin paths (the counters move in interrupt handlers).
pub fn wait_word(addr: *const u64, old: u64, mode: Mode) {
    let changed = || {
        // SAFETY: addr points at a live u64 (a counter or a mailbox word).
        unsafe { core::ptr::read_volatile(addr) != old }
    };
    match mode {
        Mode::Hlt => {
            sys::wait(addr, old, false);
        }
        Mode::Mwait => {
            sys::wait(addr, old, true);
        }
        Mode::Spin => {
            while !changed() {
                core::hint::spin_loop();
            }
        }
        Mode::HaltPoll(cycles) => {
            let start = rdtsc();
            while !changed() {
                if rdtsc().wrapping_sub(start) > cycles {
                    sys::wait(addr, old, false);
                    break;
                }
                core::hint::spin_loop();
            }
        }
    }
}

/// Per-AP command mailbox.
#[repr(C, align(64))]
struct Mailbox {
    seq: AtomicU64,
    op: AtomicU64,
    arg: AtomicU64,
    arg2: AtomicU64,
    /// With `OP_CALL`: the `fn(u64, u64)` to run, as an address.
    func: AtomicU64,
    /// The AP stores a command's `seq` here once it is waiting for that command's first
    /// message (see [`wait_ready`]).
    ready: AtomicU64,
    done: AtomicU64,
}

const OP_PINGPONG: u64 = 1;
const OP_SHM: u64 = 2;
const OP_CALL: u64 = 3;

static MAILBOX: Mailbox = Mailbox {
    seq: AtomicU64::new(0),
    op: AtomicU64::new(0),
    arg: AtomicU64::new(0),
    arg2: AtomicU64::new(0),
    func: AtomicU64::new(0),
    ready: AtomicU64::new(0),
    done: AtomicU64::new(0),
};

#[repr(C, align(64))]
struct Line(AtomicU64);
static SHM_A: Line = Line(AtomicU64::new(0));
static SHM_B: Line = Line(AtomicU64::new(0));

/// The AP side: park in the idle mode, run what the mailbox says, repeat. Only AP index 1
/// takes commands; others just park.
pub fn ap_loop(index: u64, bsp_apic: u32) -> ! {
    let mut last = 0;
    loop {
        let m = mode();
        if m != Mode::Hlt && m != Mode::Mwait {
            sys::set_interrupts(true);
        }
        wait_word(MAILBOX.seq.as_ptr(), last, m);
        let seq = MAILBOX.seq.load(Ordering::Acquire);
        if seq == last {
            continue;
        }
        last = seq;
        if index != 1 {
            continue;
        }
        let n = MAILBOX.arg.load(Ordering::Acquire);
        match MAILBOX.op.load(Ordering::Acquire) {
            OP_PINGPONG => respond(n, seq, bsp_apic, m),
            OP_CALL => {
                let addr = MAILBOX.func.load(Ordering::Acquire) as usize;
                // SAFETY: only `post_call` stores here, and it stores a `fn(u64, u64)`.
                let f: fn(u64, u64) = unsafe { core::mem::transmute(addr) };
                f(n, MAILBOX.arg2.load(Ordering::Acquire))
            }
            OP_SHM => {
                for i in 1..=n {
                    while SHM_A.0.load(Ordering::Acquire) != i {
                        core::hint::spin_loop();
                    }
                    SHM_B.0.store(i, Ordering::Release);
                }
            }
            _ => {}
        }
        MAILBOX.done.store(seq, Ordering::Release);
    }
}

/// The AP's half of the IPI ping-pong: `n` rounds, numbered 1..=n in the round words (see
/// [`round_word`]), so the count of rounds does not depend on when this AP gets here: a
/// PING that arrives before it has published its round, which the AP finds there (the
/// rig's TCG once took over 5 ms to bring the AP here).
fn respond(n: u64, seq: u64, bsp_apic: u32, m: Mode) {
    match m {
        Mode::Hlt | Mode::Mwait => {
            // Ring 0 runs with interrupts off outside `sti; hlt`/`sti; mwait` and reads the
            // counter before each wait, so a PING that comes early stays pending in the APIC
            // until the wait; ring 3 must not take it first.
            sys::set_interrupts(false);
            MAILBOX.ready.store(seq, Ordering::Release);
            sys::pingpong(n, bsp_apic, m == Mode::Mwait, false)
        }
        _ => {
            sys::set_interrupts(true);
            MAILBOX.ready.store(seq, Ordering::Release);
            for r in 1..=n {
                wait_round(0, VEC_PING, r, m);
                round_word(1).store(r, Ordering::Release);
                smp::send_ipi(bsp_apic, 0x4000 | VEC_PONG as u32);
            }
        }
    }
}

/// Posts a command to AP 1 and kicks it awake.
fn post(ap_apic: u32, op: u64, arg: u64) -> u64 {
    MAILBOX.op.store(op, Ordering::Release);
    MAILBOX.arg.store(arg, Ordering::Release);
    let seq = MAILBOX.seq.fetch_add(1, Ordering::AcqRel) + 1;
    smp::send_ipi(ap_apic, 0x4000 | VEC_KICK as u32);
    seq
}

/// Posts `f(arg, arg2)` to AP 1 (the SYSCALL canary runs there this way); returns the
/// sequence number to wait for with [`wait_posted`].
pub fn post_call(ap_apic: u32, f: fn(u64, u64), arg: u64, arg2: u64) -> u64 {
    MAILBOX.func.store(f as usize as u64, Ordering::Release);
    MAILBOX.arg2.store(arg2, Ordering::Release);
    post(ap_apic, OP_CALL, arg)
}

/// Waits until AP 1 finished command `seq`.
pub fn wait_posted(seq: u64) {
    wait_done(seq)
}

/// Waits until AP 1 says it is waiting for command `seq`'s first message.
fn wait_ready(seq: u64) {
    while MAILBOX.ready.load(Ordering::Acquire) != seq {
        core::hint::spin_loop();
    }
}

fn wait_done(seq: u64) {
    while MAILBOX.done.load(Ordering::Acquire) != seq {
        core::hint::spin_loop();
    }
}

/// Sorts and summarises cycle samples as nanoseconds.
fn report(test: &str, m: Mode, extra: &str, samples: &mut [u64], tsc_khz: u64) {
    samples.sort_unstable();
    let n = samples.len();
    if n == 0 {
        say!("wake test={} mode={} n=0", test, m.name());
        return;
    }
    let ns = |c: u64| c.saturating_mul(1_000_000) / tsc_khz.max(1);
    let p99 = samples[((n * 99).div_ceil(100)).clamp(1, n) - 1];
    say!(
        "wake test={} mode={}{} n={} median_ns={} p99_ns={} min_ns={} max_ns={}",
        test,
        m.name(),
        extra,
        n,
        ns(samples[n / 2]),
        ns(p99),
        ns(samples[0]),
        ns(samples[n - 1])
    );
}

/// Runs the wake tests. `ap_apic` is the first AP's APIC ID, if there is one.
pub fn run(bi: &BootInfo, tsc_khz: u64, bsp_apic: u32, ap_apic: Option<u32>) {
    let m = mode();
    let arg = |k: &str, d: u64| bi.arg(k).and_then(|v| v.parse().ok()).unwrap_or(d);
    let n = (arg("probe.wake_n", 200) as usize).clamp(1, MAX_SAMPLES / 2);
    let warm = (arg("probe.wake_warmup", 20) as usize).min(MAX_SAMPLES / 2);
    let total = n + warm;
    // SAFETY: the BSP runs this; the only borrow of sample buffer 0.
    let buf = unsafe { sys::scratch(0) };
    let _ = bsp_apic;
    say!("wake start mode={} n={} warmup={}", m.name(), n, warm);

    // Timer lateness, on the BSP.
    let alarm = smp::Alarm::new(VEC_TIMER as u8, tsc_khz);
    let interval = arg("probe.timer_us", 1000) * tsc_khz / 1000;
    if m != Mode::Hlt && m != Mode::Mwait {
        sys::set_interrupts(true);
    }
    for s in buf.iter_mut().take(total) {
        let deadline = rdtsc() + interval;
        let woke = match m {
            Mode::Hlt | Mode::Mwait => sys::timer_wait(alarm.arm(deadline), m == Mode::Mwait),
            _ => {
                let old = count(VEC_TIMER);
                match alarm.arm(deadline) {
                    0 => {}
                    msr => sys::wrmsr(0x6e0, msr),
                }
                wait_word(count_addr(VEC_TIMER), old, m);
                rdtsc()
            }
        };
        *s = woke.saturating_sub(deadline);
    }
    report(
        "timer",
        m,
        &interval_note(arg("probe.timer_us", 1000)),
        &mut buf[warm..total],
        tsc_khz,
    );

    let Some(ap) = ap_apic else {
        say!("wake test=ipi skipped: one CPU");
        return;
    };
    // IPI ping-pong, both sides idling in the mode. The AP counts PINGs from the figure
    // posted with the command; once it says it is ready, it is given `probe.wake_settle_us`
    // (default 5000) to settle into its idle wait, so the first rounds do not time its way
    // there (the warm-up rounds are dropped in any case).
    for w in 0..2 {
        round_word(w).store(0, Ordering::Release);
        spurious(w).store(0, Ordering::Release);
    }
    let (pings, pongs) = (count(VEC_PING), count(VEC_PONG));
    let seq = post(ap, OP_PINGPONG, total as u64);
    wait_ready(seq);
    spin_for(arg("probe.wake_settle_us", 5000) * tsc_khz / 1000);
    match m {
        Mode::Hlt | Mode::Mwait => {
            sys::pingpong(total as u64, ap, m == Mode::Mwait, true);
            for (i, b) in buf.iter_mut().take(total).enumerate() {
                // SAFETY: ring 0 wrote `total` (< MAX_SAMPLES) samples into wake_samples.
                *b = unsafe { peek((&raw const wake_samples as *const u64).add(i) as u64) };
            }
        }
        _ => {
            sys::set_interrupts(true);
            for (i, s) in buf.iter_mut().take(total).enumerate() {
                let r = i as u64 + 1;
                round_word(0).store(r, Ordering::Release);
                let t0 = rdtsc();
                smp::send_ipi(ap, 0x4000 | VEC_PING as u32);
                wait_round(1, VEC_PONG, r, m);
                *s = rdtsc() - t0;
            }
        }
    }
    wait_done(seq);
    // How often each vector was taken against the rounds run: more than one a round is an
    // interrupt delivered twice (the doorbell design above absorbs it; this says it came).
    let mut extra = heapless_fmt::Small::new();
    let _ = core::fmt::Write::write_fmt(
        &mut extra,
        format_args!(
            " rounds={} ping_irqs={} pong_irqs={} spurious={}",
            total,
            count(VEC_PING) - pings,
            count(VEC_PONG) - pongs,
            spurious(0).load(Ordering::Acquire) + spurious(1).load(Ordering::Acquire)
        ),
    );
    report("ipi", m, &extra, &mut buf[warm..total], tsc_khz);

    // Shared memory ping-pong in ring 3: the no-interrupt floor.
    SHM_A.0.store(0, Ordering::Release);
    SHM_B.0.store(0, Ordering::Release);
    let seq = post(ap, OP_SHM, total as u64);
    for (i, s) in buf.iter_mut().take(total).enumerate() {
        let v = i as u64 + 1;
        let t0 = rdtsc();
        SHM_A.0.store(v, Ordering::Release);
        while SHM_B.0.load(Ordering::Acquire) != v {
            core::hint::spin_loop();
        }
        *s = rdtsc() - t0;
    }
    wait_done(seq);
    report("shm", Mode::Spin, "", &mut buf[warm..total], tsc_khz);
}

fn interval_note(us: u64) -> heapless_fmt::Small {
    let mut s = heapless_fmt::Small::new();
    let _ = core::fmt::Write::write_fmt(&mut s, format_args!(" interval_us={us}"));
    s
}

fn spin_for(cycles: u64) {
    let t = rdtsc();
    while rdtsc().wrapping_sub(t) < cycles {
        core::hint::spin_loop();
    }
}

/// `probe.bench=idle`: idle for `probe.idle_seconds` (default 3) in the mode, between two
/// lines the host can time its CPU accounting against.
pub fn idle_window(bi: &BootInfo, tsc_khz: u64) {
    let m = mode();
    let secs = bi
        .arg("probe.idle_seconds")
        .and_then(|v| v.parse().ok())
        .unwrap_or(3u64);
    let alarm = smp::Alarm::new(VEC_TIMER as u8, tsc_khz);
    say!("idle start mode={} seconds={}", m.name(), secs);
    let end = rdtsc() + secs * tsc_khz * 1000;
    match m {
        Mode::Hlt | Mode::Mwait => {
            sys::timer_wait(alarm.arm(end), m == Mode::Mwait);
        }
        _ => {
            sys::set_interrupts(true);
            let old = count(VEC_TIMER);
            match alarm.arm(end) {
                0 => {}
                msr => sys::wrmsr(0x6e0, msr),
            }
            wait_word(count_addr(VEC_TIMER), old, m);
        }
    }
    say!("idle end");
}

/// A tiny fixed-capacity string for format arguments.
mod heapless_fmt {
    /// Up to 96 bytes.
    pub struct Small {
        buf: [u8; 96],
        len: usize,
    }
    impl Small {
        pub const fn new() -> Self {
            Self {
                buf: [0; 96],
                len: 0,
            }
        }
    }
    impl core::fmt::Write for Small {
        fn write_str(&mut self, s: &str) -> core::fmt::Result {
            let b = s.as_bytes();
            let n = b.len().min(self.buf.len() - self.len);
            self.buf[self.len..self.len + n].copy_from_slice(&b[..n]);
            self.len += n;
            Ok(())
        }
    }
    impl core::ops::Deref for Small {
        type Target = str;
        fn deref(&self) -> &str {
            core::str::from_utf8(&self.buf[..self.len]).unwrap_or("")
        }
    }
}
