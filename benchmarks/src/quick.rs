//! `partition bench --quick`: a minute's look, printed rather than stored (one run, short
//! repetitions: not benchmark quality). The bare host's hot paths (hotpaths `--quick`)
//! beside the seed's figures, the probe guest's exit paths, and the memory-latency
//! staircase of the probe guest against the host with their ratios.

use std::fmt::Write as _;
use std::time::Duration;

use crate::lookup::SEED;
use crate::{Env, HugepageCount, Launch, hotpaths, probe, timed_run};

const GUEST_MB: u64 = 160;

/// Runs the quick look; the text to print.
pub fn run(env: &Env) -> Result<String, String> {
    let bin = hotpaths::binary(env)?;
    let cpus = format!("{},{}", env.core, env.host_core);
    let host = hotpaths::run_host(
        &bin,
        &[
            "--quick",
            "--cpus",
            &cpus,
            "--only",
            "null_syscall,read,write,stat,open_close,sig,ctx_switch,pipe,unix,fork_exit,mem_lat",
        ],
        &env.work,
    )?;
    let disk = env.work.join("quick-disk.img");
    std::fs::File::create(&disk)
        .and_then(|f| f.set_len(1 << 20))
        .map_err(|e| e.to_string())?;
    let pages = GUEST_MB / 2;
    let guard = HugepageCount::grow(pages);
    let c = Launch::new(
        env,
        &env.work.join("quick-state"),
        &env.core.to_string(),
        &format!("{GUEST_MB}M"),
    )
    .probe()
    .backing(if guard.is_some() {
        "hugetlb"
    } else {
        "prefault"
    })
    .disk(&disk, "")
    .cmdline("probe.memtest=0 probe.bench=paths probe.paths_n=300 probe.paths_max_mem=67108864")
    .command();
    let r = timed_run(c, Duration::from_secs(120)).map_err(|e| e.to_string());
    drop(guard);
    let _ = std::fs::remove_file(&disk);
    let r = r?;
    let p = probe::parse(&r.stdout);
    if !r.status.success() || !p.ok {
        return Err(format!(
            "the probe guest's paths run failed (exit {:?}): {}",
            r.status.code(),
            r.stderr.lines().last().unwrap_or("")
        ));
    }

    let v = |n: &str| host.rows.iter().find(|r| r.name == n).map(|r| r.value);
    let mut o = String::new();
    let _ = writeln!(
        o,
        "Hot paths on this host (hotpaths --quick: one run; the process on CPU {}, partners on {} or {}), µs:",
        env.core, env.core, env.host_core
    );
    let _ = writeln!(
        o,
        "  {:<34} {:>10}   seed 000: native / KVM guest (ratio)",
        "path", "this host"
    );
    for (row, names, nat, kvm, ratio) in SEED {
        for n in names.iter() {
            let Some(x) = v(n) else { continue };
            let label = if names.len() > 1 {
                format!(
                    "{row}, {}",
                    if n.ends_with("2cores") {
                        "two cores"
                    } else {
                        "one core"
                    }
                )
            } else {
                row.to_string()
            };
            let _ = writeln!(o, "  {label:<34} {x:>10.3}   {nat} / {kvm} ({ratio:.2}x)");
        }
    }
    let t = |k: &str| p.tests.get(k).map(|x| x.0);
    let _ = writeln!(
        o,
        "\nThe probe guest's paths through this VMM (median of 11 x 300 calls), ns:"
    );
    for (k, what) in [
        ("cpuid", "CPUID (exit answered in the kernel)"),
        ("mmio_read", "MMIO read (exit to our userspace device)"),
        ("mmio_doorbell", "doorbell write (ioeventfd, kernel only)"),
        ("service", "the probe's ring-0 trap (ud2) and back"),
    ] {
        if let Some(x) = t(k) {
            let _ = writeln!(o, "  {what:<44} {x:>10.0}");
        }
    }
    match (t("pio_in"), t("pio_in_service"), t("service")) {
        (Some(x), _, _) => {
            let _ = writeln!(
                o,
                "  {:<44} {x:>10.0}",
                "port read (exit to our userspace serial)"
            );
        }
        (None, Some(x), Some(s)) => {
            let _ = writeln!(
                o,
                "  {:<44} {:>10.0}   (ring 3 may not do port I/O here: via the ring-0 trap, less it)",
                "port read (exit to our userspace serial)",
                (x - s).max(0.0)
            );
        }
        _ => {}
    }
    let _ = writeln!(
        o,
        "\nMemory latency, the same chase ({} MiB of 2 MiB pages in the guest), ns per load:",
        GUEST_MB
    );
    let _ = writeln!(
        o,
        "  {:>10} {:>10} {:>12} {:>11}",
        "size", "host", "probe guest", "guest/host"
    );
    for (size, g) in &p.mem {
        let h = v(&format!("mem_lat_{size}"));
        let label = if *size >= 1 << 20 {
            format!("{} MiB", size >> 20)
        } else if *size >= 1024 {
            format!("{} KiB", size >> 10)
        } else {
            format!("{size} B")
        };
        let _ = writeln!(
            o,
            "  {label:>10} {:>10} {g:>12.2} {:>11}",
            h.map_or("-".into(), |h| format!("{h:.2}")),
            h.map_or("-".into(), |h| format!("{:.2}x", g / h))
        );
    }
    let _ = writeln!(
        o,
        "\nA Linux guest's hot paths need `partition bench --only host,guest` (and a guest image:\nscripts/guest-image.sh); the full run with provenance is scripts/bench.sh."
    );
    Ok(o)
}
