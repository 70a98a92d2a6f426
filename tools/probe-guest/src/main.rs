//! The probe guest: a freestanding x86-64 kernel that reports what its VMM gave it.
//!
//! Entered like Linux (64-bit boot protocol, RSI = boot_params, ELF entry `_start64`) or
//! through PVH (`XEN_ELFNOTE_PHYS32_ENTRY` → `pvh_entry32`, EBX = hvm_start_info). Ring 0 is
//! `ring0.s`; everything here runs in ring 3 and asks ring 0 for port I/O, MSRs, CPUID and
//! halting through `ud2` (see ring0.s).
//!
//! Output: lines starting `probe: ` on COM1. Exit: status byte to port 0xf4 (our VMM and
//! QEMU's isa-debug-exit), then ACPI S5, then an i8042 reset.
//!
//! Command line options: `probe.memtest=0` skips the memory test; `probe.seed=N` changes the
//! pattern seed; `probe.zerocheck=1` first reports whether RAM above 1 MiB (outside the
//! probe) was all zero at start; `probe.hold=1` stays up (halted) instead of powering off;
//! `probe.bench=wake` runs the wake-up benchmarks and `probe.bench=idle` idles for
//! `probe.idle_seconds` (see wake.rs for their options); `probe.bench=paths` times the
//! VMM's exit paths and the memory-latency staircase (paths.rs); `probe.bench=noise` reads
//! the TSC back to back in ring 3 and reports the gaps (noise.rs); `probe.blk=...` drives
//! the first virtio-blk device (blk.rs); `probe.assist=1` checks the instructions a VMM
//! must assist where ring 0 is emulated (assist.rs); `probe.canary=N` makes N system calls
//! through SYSCALL, each checked for everything it must leave alone, with
//! `probe.canary_on=ap` on the first AP while the BSP drives the disk (canary.rs);
//! `probe.engine=...` enumerates PCI and drives the VMM's submission engine (engine.rs);
//! `probe.nvme=N` drives a passed-through NVMe controller (nvme.rs); `probe.bigbar=V:D`
//! reads and writes a large BAR above 4 GiB (bigbar.rs); `probe.rom=V:D` reads a function's
//! expansion ROM through its ROM BAR (rom.rs).
#![no_std]
#![no_main]

mod bootinfo;
mod clock;
#[macro_use]
mod console;
mod assist;
mod bigbar;
mod blk;
mod canary;
mod engine;
mod firmware;
mod gaps;
mod libc;
mod memtest;
mod noise;
mod nvme;
mod paths;
mod pcie;
mod peers;
mod rom;
mod smp;
mod stats;
mod sys;
mod virtio_pci;
mod wake;

use core::sync::atomic::Ordering;

use bootinfo::BootInfo;

core::arch::global_asm!(include_str!("ring0.s"), options(att_syntax, raw));

/// Exit status: everything checked out.
const EXIT_OK: u8 = 0;
/// Exit status: a check failed (memory test, CPU bring-up).
const EXIT_FAILED: u8 = 1;
/// Exit status: the probe panicked.
const EXIT_PANIC: u8 = 2;
/// Port our VMM (and QEMU's isa-debug-exit) watches for an exit status.
const EXIT_PORT: u16 = 0xf4;
const DEFAULT_SEED: u64 = 0x5052_4f42_4521_0001;

unsafe extern "C" {
    static isr_stubs: u8;
    static mut idt: [u64; 512];
    static __image_start: u8;
    static __image_end: u8;
}

/// Fills the shared IDT: 256 interrupt gates to the stubs.
fn fill_idt() {
    let stubs = &raw const isr_stubs as u64;
    for v in 0..256u64 {
        let h = stubs + 16 * v;
        let attr: u64 = 0x8e;
        let lo = (h & 0xffff) | (0x08 << 16) | (attr << 40) | (((h >> 16) & 0xffff) << 48);
        // SAFETY: the IDT is ours, in the image; no interrupt can arrive yet (IF is clear
        // in ring 3 and every interrupt source is masked).
        unsafe {
            let p = (&raw mut idt).cast::<u64>();
            p.add(2 * v as usize).write_volatile(lo);
            p.add(2 * v as usize + 1).write_volatile(h >> 32);
        }
    }
}

fn power_off(status: u8, fadt: Option<u64>) -> ! {
    sys::outb(EXIT_PORT, status);
    if let Some(port) = fadt.and_then(firmware::fadt_sleep_control) {
        sys::outb(port, (5 << 2) | 0x20);
    }
    sys::outb(0x64, 0xfe);
    sys::stop()
}

/// `probe.xsave=1`: enables every XSAVE feature CPUID 0xd.0 offers (XSETBV) and asks CPUID
/// again for the save area they need (0xd.0 EBX, which the hypervisor must compute from the
/// guest's XCR0): what a Linux guest's XSAVE consistency check reads. Prints both sizes;
/// true (a failure) when the second is not what the offered features add up to.
fn xsave_check() -> bool {
    let l1 = sys::cpuid(1, 0);
    if l1[2] & (1 << 26) == 0 {
        say!("xsave skipped: no XSAVE in CPUID 1");
        return false;
    }
    let d0 = sys::cpuid(0xd, 0);
    let offered = u64::from(d0[0]) | u64::from(d0[3]) << 32;
    // x87, SSE and AVX: what Linux enables first (the rest have their own rules).
    let want = offered & 0x7;
    let before = d0[1];
    let xcr0 = sys::xsetbv(want);
    let after = sys::cpuid(0xd, 0)[1];
    // The size XCR0's features need: 512 legacy + 64 header, then each extended feature's
    // offset + size from its sub-leaf, standard (uncompacted) layout.
    let mut need = 576u32;
    for i in 2..64 {
        if xcr0 & (1 << i) != 0 {
            let s = sys::cpuid(0xd, i);
            need = need.max(s[1] + s[0]);
        }
    }
    say!(
        "xsave offered={:#x} xcr0={:#x} ebx_before={} ebx_after={} need={} consistent={}",
        offered,
        xcr0,
        before,
        after,
        need,
        after == need
    );
    after != need
}

/// Entry of the bootstrap processor in ring 3. `kind` 0 = Linux zero page at `info`,
/// 1 = PVH start info at `info`.
#[unsafe(no_mangle)]
extern "C" fn probe_main(kind: u64, info: u64) -> ! {
    fill_idt();
    // SAFETY: the entry protocol put the structure at `info`.
    let bi = unsafe { BootInfo::read(kind, info) };
    say!("hello protocol={} info={:#x}", bi.protocol, bi.info_addr);
    say!("cmdline={}", bi.cmdline());
    say!("e820 entries={}", bi.e820().len());
    for e in bi.e820() {
        say!(
            "e820 {:#018x}-{:#018x} type={}",
            e.addr,
            e.addr + e.size,
            e.kind
        );
    }
    let (tsc_khz, tsc_src) = clock::tsc_khz();
    say!("tsc_khz={} source={}", tsc_khz, tsc_src);

    // CPUs: the ACPI MADT first (what Linux uses), the MP table as a cross-check.
    let rsdp = firmware::find_rsdp(bi.rsdp);
    let madt = rsdp.and_then(|r| firmware::find_table(r, b"APIC"));
    let fadt = rsdp.and_then(|r| firmware::find_table(r, b"FACP"));
    let madt_cpus = madt.map(firmware::madt_cpus);
    let mp_cpus = firmware::mptable_cpus();
    if let Some(c) = &madt_cpus {
        say!(
            "acpi rsdp={:#x} madt_cpus={} apic_ids={:?}",
            rsdp.unwrap_or(0),
            c.len,
            c.ids()
        );
    } else {
        say!("acpi none");
    }
    match &mp_cpus {
        Some(c) => say!("mptable cpus={} apic_ids={:?}", c.len, c.ids()),
        None => say!("mptable none"),
    }
    let cpus = madt_cpus.as_ref().or(mp_cpus.as_ref());
    let expected = cpus.map(|c| c.len).unwrap_or(1);

    let (idle_mode, why) = wake::detect(&bi, tsc_khz);
    say!("idle mode={} ({})", idle_mode.name(), why);
    smp::enable_lapic();
    let bsp = smp::apic_id();
    BSP_APIC.store(bsp, Ordering::Release);
    let mut started = 1usize;
    if expected > 1 {
        smp::install_trampoline();
        let mut index = 1;
        for &id in cpus.map(|c| c.ids()).unwrap_or(&[]) {
            if id == bsp {
                continue;
            }
            if smp::start_ap(id, index, tsc_khz) {
                started += 1;
            } else {
                say!("smp apic_id={} did not start", id);
            }
            index += 1;
        }
    }
    say!(
        "smp bsp_apic_id={} expected={} started={}",
        bsp,
        expected,
        started
    );

    let mut failed = started != expected;

    let first_ap = cpus
        .map(|c| c.ids())
        .unwrap_or(&[])
        .iter()
        .copied()
        .find(|&id| id != bsp && started > 1);
    match bi.arg("probe.bench") {
        Some("wake") => wake::run(&bi, tsc_khz, bsp, first_ap),
        Some("idle") => wake::idle_window(&bi, tsc_khz),
        Some("noise") => noise::run(&bi, tsc_khz),
        Some("paths") => {
            // The largest free RAM range above 1 MiB for the memory chase.
            let mut best: Option<(u64, u64)> = None;
            ram_ranges(&bi, 0x10_0000, |a, b| {
                if best.is_none_or(|(x, y)| b - a > y - x) {
                    best = Some((a.next_multiple_of(4096), b));
                }
            });
            paths::run(&bi, tsc_khz, best)
        }
        Some(other) => say!("unknown probe.bench={}", other),
        None => {}
    }
    // `probe.marks=N`: marks 1 and 2 around N port reads (each an exit to the VMM), so a
    // test sees what the VMM and KVM counted between two marks.
    if let Some(n) = bi.arg("probe.marks").and_then(|v| v.parse::<u32>().ok()) {
        sys::mark(1);
        for _ in 0..n {
            core::hint::black_box(sys::inb(0x3fd));
        }
        sys::mark(2);
        say!("marks n={}", n);
    }
    if bi.arg("probe.xsave") == Some("1") {
        failed |= xsave_check();
    }
    failed |= assist::run(&bi);
    let canary = canary::start(&bi, first_ap);
    failed |= blk::run(&bi, tsc_khz);
    failed |= canary::finish(canary);
    failed |= engine::run(&bi, tsc_khz, bsp);
    failed |= nvme::run(&bi, tsc_khz, bsp);
    failed |= bigbar::run(&bi);
    failed |= rom::run(&bi);
    if bi.arg("probe.zerocheck") == Some("1") {
        zerocheck(&bi);
    }
    if bi.arg("probe.memtest") != Some("0") {
        let seed = bi
            .arg("probe.seed")
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(DEFAULT_SEED);
        failed |= run_memtest(&bi, seed);
    }

    say!(
        "result {} status={}",
        if failed { "FAILED" } else { "ok" },
        if failed { EXIT_FAILED } else { EXIT_OK }
    );
    if bi.arg("probe.hold") == Some("1") {
        say!("holding (probe.hold=1): halted until the VMM stops me");
        loop {
            sys::halt();
        }
    }
    power_off(if failed { EXIT_FAILED } else { EXIT_OK }, fadt)
}

/// Calls `f` on each usable RAM range at or above `floor`, minus the probe image.
fn ram_ranges(bi: &BootInfo, floor: u64, mut f: impl FnMut(u64, u64)) {
    let img_start = &raw const __image_start as u64;
    let img_end = (&raw const __image_end as u64).next_multiple_of(4096);
    for e in bi.e820().iter().filter(|e| e.kind == 1) {
        let (s, end) = (
            e.addr.max(floor).next_multiple_of(8),
            (e.addr + e.size) & !7,
        );
        for (a, b) in [(s, end.min(img_start)), (s.max(img_end), end)] {
            if a < b {
                f(a, b);
            }
        }
    }
}

/// Reports whether RAM the VMM had no business writing (above 1 MiB, outside the probe)
/// is all zero: what a scrubbed or fresh extent must look like.
fn zerocheck(bi: &BootInfo) {
    let mut bytes = 0;
    let mut nonzero = 0;
    let mut first = None;
    ram_ranges(bi, 0x10_0000, |a, b| {
        // SAFETY: usable RAM from the e820 map.
        let (n, f) = unsafe { memtest::nonzero_words(a, b) };
        bytes += b - a;
        nonzero += n;
        if first.is_none() {
            first = f;
        }
    });
    say!(
        "zerocheck bytes={} nonzero_words={} first_nonzero={:#x} all_zero={}",
        bytes,
        nonzero,
        first.unwrap_or(0),
        nonzero == 0
    );
}

/// Tests all usable RAM except page 0 and the probe's own image. Returns true on failure.
fn run_memtest(bi: &BootInfo, seed: u64) -> bool {
    let img_start = &raw const __image_start as u64;
    let img_end = (&raw const __image_end as u64).next_multiple_of(4096);
    say!(
        "memtest seed={:#x} skip=0x0-0x1000(null page),{:#x}-{:#x}(probe image)",
        seed,
        img_start,
        img_end
    );
    let start = sys::rdtsc();
    let mut total = memtest::Outcome::default();
    ram_ranges(bi, 0x1000, |a, b| {
        // SAFETY: usable RAM outside page 0 and the image; the APs are parked in ring 3
        // on their stacks inside the image.
        let o = unsafe { memtest::test_range(a, b, seed) };
        say!(
            "memtest range {:#x}-{:#x} checksum={:#018x} errors={}",
            a,
            b,
            o.checksum,
            o.errors
        );
        if let Some(bad) = o.first_bad {
            say!("memtest first_bad={:#x}", bad);
        }
        total.bytes += o.bytes;
        total.checksum = total.checksum.wrapping_add(o.checksum);
        total.errors += o.errors;
    });
    let cycles = sys::rdtsc().wrapping_sub(start);
    say!(
        "memtest bytes={} checksum={:#018x} errors={} tsc_cycles={}",
        total.bytes,
        total.checksum,
        total.errors,
        cycles
    );
    total.errors != 0 || total.bytes == 0
}

static BSP_APIC: core::sync::atomic::AtomicU32 = core::sync::atomic::AtomicU32::new(0);

/// Entry of an application processor in ring 3.
#[unsafe(no_mangle)]
extern "C" fn ap_main(index: u64) -> ! {
    smp::enable_lapic();
    smp::AP_UP[index as usize].store(1, Ordering::Release);
    wake::ap_loop(index, BSP_APIC.load(Ordering::Acquire))
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    say!("PANIC {}", info);
    power_off(EXIT_PANIC, None)
}
