//! reserve, unreserve, status, release: parse, call the library, print.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use partition::config::cores;
use partition::config::size::format as bytes;
use partition::host::partitions::{self, Status};
use partition::host::plan::HostPlan;
use partition::host::reserve::{self, ReserveOutcome};
use partition::sys::signals::{self, SignalGuard};

use crate::{EXIT_USAGE, EXIT_VMM_ERROR, ReserveArgs};

/// The exit status of a verb that held the stop signals back while it changed the host: a
/// signal that arrived meanwhile is said and becomes the status (128+N), the work done.
fn held(guard: Option<SignalGuard>, code: ExitCode) -> ExitCode {
    match guard.as_ref().and_then(SignalGuard::take) {
        Some(sig) => {
            eprintln!(
                "partition: {} arrived while giving back; that was finished first",
                signals::name(sig)
            );
            ExitCode::from(128 + sig as u8)
        }
        None => code,
    }
}

fn fail(msg: impl std::fmt::Display, usage: bool) -> ExitCode {
    eprintln!("partition: error: {msg}");
    ExitCode::from(if usage { EXIT_USAGE } else { EXIT_VMM_ERROR })
}

/// A progress bar on a terminal, a line per quarter otherwise.
struct Progress {
    tty: bool,
    last: u64,
}

impl Progress {
    fn update(&mut self, done: u64, total: u64) {
        let pct = done
            .checked_mul(100)
            .and_then(|x| x.checked_div(total))
            .unwrap_or(100);
        if self.tty {
            let filled = (pct / 4) as usize;
            eprint!(
                "\rpartition: preallocating the pool [{}{}] {:>3}% {} / {}",
                "#".repeat(filled),
                " ".repeat(25 - filled),
                pct,
                bytes(done),
                bytes(total)
            );
            if done >= total {
                eprintln!();
            }
            let _ = std::io::stderr().flush();
        } else if pct >= self.last + 25 || done >= total {
            eprintln!(
                "partition: preallocating the pool: {pct}% ({} of {})",
                bytes(done),
                bytes(total)
            );
            self.last = pct - pct % 25;
        }
    }
}

pub fn reserve(a: ReserveArgs) -> ExitCode {
    let available = cores::available();
    let (plan, state_dir) = match &a.plan {
        Some(path) => match HostPlan::from_file(path, &available) {
            Ok((p, None)) => (p, a.state.state_dir),
            // A plan's state directory: absolute, and not silently over another one the
            // command line or PARTITION_STATE_DIR named.
            Ok((_, Some(dir))) if !dir.is_absolute() => {
                return fail(
                    format!(
                        "--plan {}: state_dir {:?} must be an absolute path",
                        path.display(),
                        dir
                    ),
                    true,
                );
            }
            Ok((_, Some(dir)))
                if a.state.state_dir != Path::new(partition::host::ledger::DEFAULT_STATE_DIR)
                    && a.state.state_dir != dir =>
            {
                return fail(
                    format!(
                        "--plan {} names state_dir {} and --state-dir (or PARTITION_STATE_DIR) \
                         names {}: give one",
                        path.display(),
                        dir.display(),
                        a.state.state_dir.display()
                    ),
                    true,
                );
            }
            Ok((p, Some(dir))) => (p, dir),
            Err(e) => return fail(format!("--plan {e}"), true),
        },
        None => {
            let (Some(memory), Some(core_list)) = (a.memory.as_deref(), a.cores.as_deref()) else {
                return fail("--memory and --cores are required without --plan", true);
            };
            match HostPlan::new(memory, Some(&a.page_size), a.node, core_list, &available) {
                Ok(p) => (
                    p.with_isolation(a.isolation.unwrap_or_default())
                        .with_irqbalance(a.irqbalance.unwrap_or_default()),
                    a.state.state_dir,
                ),
                Err(e) => return fail(e, true),
            }
        }
    };
    let mut progress = Progress {
        tty: std::io::stderr().is_terminal(),
        last: 0,
    };
    // Held back until the host is in a state the ledger describes; a stop signal that came
    // meanwhile gives a new reservation back (stopping means: change nothing).
    let guard = SignalGuard::new().ok();
    let r = reserve::reserve(&plan, &state_dir, &mut |d, t| progress.update(d, t));
    if let Some(sig) = guard.as_ref().and_then(SignalGuard::take) {
        let what = match &r {
            Ok(r) if !matches!(r.outcome, ReserveOutcome::Unchanged) => {
                match reserve::unreserve(&state_dir) {
                    Ok(u) if u.warnings.is_empty() => "; the new reservation was given back",
                    Ok(u) => {
                        for w in &u.warnings {
                            eprintln!("partition: warning: {w}");
                        }
                        "; the new reservation was given back, with the warnings above"
                    }
                    Err(e) => {
                        eprintln!("partition: error: giving the reservation back: {e}");
                        "; the new reservation is still in place (see the error above)"
                    }
                }
            }
            Ok(_) => "",
            Err(e) => {
                eprintln!("partition: error: {e}");
                "; it had failed already (the error above), nothing was reserved"
            }
        };
        eprintln!("partition: reserve stopped by {}{what}", signals::name(sig));
        return ExitCode::from(128 + sig as u8);
    }
    drop(guard);
    let r = match r {
        Ok(r) => r,
        Err(e) => {
            let usage = e.is_usage();
            return fail(e, usage);
        }
    };
    let l = &r.ledger;
    match r.outcome {
        ReserveOutcome::Unchanged => {
            eprintln!(
                "partition: already reserved in {}: {} pool, cores {}; nothing changed",
                state_dir.display(),
                bytes(l.pool.size),
                cores::format(&l.cores.reserved)
            );
            return ExitCode::SUCCESS;
        }
        ReserveOutcome::Replaced => eprintln!("partition: the previous reservation was given back"),
        ReserveOutcome::Created => {}
    }
    eprintln!(
        "partition: reserved {} of {} KiB hugepages in {} (preallocated in {:.2} s)",
        bytes(l.pool.size),
        l.pool.page_size >> 10,
        l.pool.file.display(),
        r.prealloc.as_secs_f64()
    );
    let plural = |v: &[usize]| if v.len() == 1 { "core" } else { "cores" };
    eprintln!(
        "partition: {} {} reserved for partitions; the host keeps {} {}; isolation: {}",
        plural(&l.cores.reserved),
        cores::format(&l.cores.reserved),
        plural(&l.cores.housekeeping),
        cores::format(&l.cores.housekeeping),
        reserve::describe_isolation(&l.cores.isolation)
    );
    eprintln!(
        "partition: {} IRQ affinities moved to the host's cores{}",
        l.irqs.len(),
        if r.irqs_refused > 0 {
            format!(" ({} IRQs refused to move)", r.irqs_refused)
        } else {
            String::new()
        }
    );
    if let Some(adv) = r.cmdline_advice {
        eprintln!(
            "partition: for full isolation and a boot-time pool, add to the kernel command line: {adv}"
        );
    }
    ExitCode::SUCCESS
}

pub fn unreserve(state_dir: &Path) -> ExitCode {
    let guard = SignalGuard::new().ok();
    let code = match reserve::unreserve(state_dir) {
        Ok(r) if !r.had_reservation => {
            eprintln!("partition: nothing is reserved in {}", state_dir.display());
            ExitCode::SUCCESS
        }
        Ok(r) => {
            for w in &r.warnings {
                eprintln!("partition: warning: {w}");
            }
            eprintln!(
                "partition: reservation in {} given back{}",
                state_dir.display(),
                if r.warnings.is_empty() {
                    ""
                } else {
                    " (with the warnings above)"
                }
            );
            if r.warnings.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(EXIT_VMM_ERROR)
            }
        }
        Err(e) => {
            let usage = e.is_usage();
            fail(e, usage)
        }
    };
    held(guard, code)
}

pub fn release(state_dir: &Path, name: &str, grace: u64) -> ExitCode {
    let guard = SignalGuard::new().ok();
    let code = match partitions::release(state_dir, name, Duration::from_secs(grace)) {
        Ok(r) => {
            let how = match (r.was_alive, r.launcher_cleaned_up) {
                (true, true) => format!(
                    "stopped ({}), memory scrubbed by its launcher",
                    r.signals.join(", then ")
                ),
                (true, false) => format!("stopped ({}), then reclaimed", r.signals.join(", then ")),
                (false, _) => "was dead; reclaimed".to_string(),
            };
            let scrub = r
                .scrubbed
                .map(|d| format!("; scrubbed in {:.1} ms", d.as_secs_f64() * 1e3))
                .unwrap_or_default();
            eprintln!("partition: {name}: {how}{scrub}; its cores and memory are free");
            ExitCode::SUCCESS
        }
        Err(e) => {
            let usage = e.is_usage();
            fail(e, usage)
        }
    };
    held(guard, code)
}

fn print_status(s: &Status) {
    for r in &s.reclaimed {
        eprintln!(
            "partition: {}: its launcher (pid {}) and its keeper were gone (it was {}); \
             its {} of memory scrubbed in {:.1} ms, it and cores {} given back",
            r.name,
            r.pid,
            serde_json::to_value(r.state)
                .ok()
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_default(),
            bytes(r.bytes),
            r.scrub_ms,
            partition::config::cores::format(&r.cores)
        );
    }
    println!("state dir: {}", s.state_dir.display());
    if !s.reserved {
        println!("nothing reserved");
        if s.unfinished {
            println!(
                "a reserve that did not finish left host resources taken (hugepages, its pool \
                 file, moved IRQs or narrowed cpusets, written down in the state directory): \
                 `partition reserve` or `partition unreserve` gives them back"
            );
        }
        return;
    }
    if let Some(p) = &s.pool {
        println!(
            "pool: {} of {} KiB pages, {} free, file {}",
            bytes(p.size),
            p.page_size >> 10,
            bytes(p.free_bytes),
            p.file.display()
        );
        for f in &p.free {
            println!("  free  {:#012x}+{:#x} ({})", f.offset, f.len, bytes(f.len));
        }
        for u in &p.used {
            println!(
                "  used  {:#012x}+{:#x} ({}) by {}",
                u.extent.offset,
                u.extent.len,
                bytes(u.extent.len),
                u.partition
            );
        }
    }
    if let Some(c) = &s.cores {
        println!(
            "cores: reserved {}, free {}, host {}",
            cores::format(&c.reserved),
            if c.free.is_empty() {
                "none".into()
            } else {
                cores::format(&c.free)
            },
            cores::format(&c.housekeeping)
        );
        println!("isolation: {}", c.isolation);
    }
    println!(
        "irqs: {} affinities moved to the host's cores",
        s.irqs_moved
    );
    for i in &s.irqs_back {
        println!(
            "  IRQ {} may fire on a reserved core again (affinity {}): moved back since the \
             reservation",
            i.irq, i.affinity
        );
    }
    if let Some(b) = &s.irqbalance {
        println!(
            "irqbalance: pid {} {} banned from cores {}",
            b.pid,
            if b.alive {
                "runs,"
            } else {
                "is gone (a new one forgot the ban),"
            },
            cores::format(&b.banned)
        );
    }
    if s.partitions.is_empty() {
        println!("partitions: none");
    }
    for p in &s.partitions {
        println!(
            "partition {}: {} pid {} state {:?}, cores {}, extent {:#x}+{:#x} ({}), up {} s, idle {}, kernel {}",
            p.name,
            if p.alive { "alive" } else { "DEAD" },
            p.pid,
            p.state,
            cores::format(&p.cores),
            p.extent.offset,
            p.extent.len,
            bytes(p.extent.len),
            p.uptime_secs,
            shown(&p.idle),
            shown(&p.kernel)
        );
        if let Some(x) = &p.exits {
            for v in &x.vcpus {
                let e: Vec<String> = v
                    .exits
                    .iter()
                    .filter(|(_, n)| **n > 0)
                    .map(|(k, n)| format!("{}={n}", shown(k)))
                    .collect();
                println!("  vcpu{} (core {}) exits: {}", v.vcpu, v.core, e.join(" "));
            }
        }
        if let Some(n) = &p.note {
            println!("  note: {n}");
        }
    }
}

pub fn status(state_dir: &Path, json: bool) -> ExitCode {
    match partitions::status(state_dir) {
        Ok(s) => {
            if json {
                match serde_json::to_string_pretty(&s) {
                    Ok(t) => println!("{t}"),
                    Err(e) => return fail(e, false),
                }
            } else {
                print_status(&s);
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            let usage = e.is_usage();
            fail(e, usage)
        }
    }
}

/// `status --api-socket PATH`: what one partition's API says.
pub fn api_status(socket: &Path, json: bool) -> ExitCode {
    let mut doc = serde_json::Map::new();
    for (key, path) in [
        ("partition", "/partition"),
        ("state", "/state"),
        ("counters", "/counters"),
    ] {
        match partition::sys::api_client::request(socket, "GET", path, None) {
            Ok((200, v)) => {
                doc.insert(key.into(), v);
            }
            Ok((code, v)) => {
                return fail(
                    format!(
                        "{}: GET {path}: {code} {}",
                        socket.display(),
                        shown(&v.to_string())
                    ),
                    false,
                );
            }
            Err(e) => {
                return fail(
                    format!(
                        "{}: {e} (is a partition serving its API there?)",
                        socket.display()
                    ),
                    true,
                );
            }
        }
    }
    let doc = serde_json::Value::Object(doc);
    if json {
        println!("{doc}");
        return ExitCode::SUCCESS;
    }
    let p = &doc["partition"];
    // Another process's words: shown with their control characters escaped.
    let text = |v: &serde_json::Value, or: &str| shown(v.as_str().unwrap_or(or));
    println!(
        "partition {} (pid {}): {}, cores {}, {} of {} memory, kernel {}",
        text(&p["name"], "(unnamed)"),
        shown(&p["pid"].to_string()),
        text(&doc["state"]["state"], "?"),
        shown(&p["cores"].to_string()),
        bytes(p["memory"]["bytes"].as_u64().unwrap_or(0)),
        text(&p["memory"]["backing"], "?"),
        text(&p["kernel"], "?"),
    );
    for v in doc["counters"]["vcpus"].as_array().into_iter().flatten() {
        let exits: Vec<String> = v["exits"]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(_, n)| n.as_u64() > Some(0))
            .map(|(k, n)| format!("{}={n}", shown(k)))
            .collect();
        println!(
            "  vcpu{} (core {}) exits: {}",
            shown(&v["vcpu"].to_string()),
            shown(&v["core"].to_string()),
            exits.join(" ")
        );
    }
    ExitCode::SUCCESS
}

/// Text from a ledger or an API, as the terminal may show it (control characters escaped,
/// at most 256 characters).
fn shown(s: &str) -> String {
    partition::sys::api_client::printable(s, 256)
}

/// The cores a host report is about, where they came from, a running irqbalance's pid with
/// whether the reservation banned it from them, and the idle policy of each core's running
/// partition.
type ReportCores = (
    Vec<usize>,
    &'static str,
    Option<(u32, bool)>,
    Vec<(usize, String)>,
);

/// The host report's cores: those named, else the reservation's, else every online one.
fn report_cores(named: Option<&str>, state_dir: &Path) -> Result<ReportCores, String> {
    // The ledger alone: no partition's API is asked for a report on the host.
    let placement = partitions::placement(state_dir).unwrap_or_default();
    let in_force = placement.in_force;
    let reservation =
        (!placement.reserved.is_empty()).then_some((placement.reserved, placement.irqbalance));
    let daemon = partition::host::irqbalance::running();
    let banned = |cores: &[usize]| {
        daemon.map(|d| {
            let by_us = reservation.as_ref().is_some_and(|(r, b)| {
                b.as_ref().is_some_and(|b| {
                    b.pid == d.pid && b.alive && cores.iter().all(|c| r.contains(c))
                })
            });
            (d.pid, by_us)
        })
    };
    if let Some(list) = named {
        let c = cores::parse(list).map_err(|e| format!("--cores {list}: {e}"))?;
        cores::check_available(&c, &cores::available())
            .map_err(|e| format!("--cores {list}: {e}"))?;
        let b = banned(&c);
        return Ok((c, "named", b, in_force));
    }
    if let Some((r, _)) = &reservation {
        let b = banned(r);
        return Ok((r.clone(), "reserved", b, in_force));
    }
    let all = cores::available();
    let b = banned(&all);
    Ok((all, "all online", b, in_force))
}

pub fn caps(json: bool, named: Option<&str>, state_dir: &Path) -> ExitCode {
    use partition::cpu::idle::{IdlePolicy, resolve};
    let (report_on, from, irqbalance, in_force) = match report_cores(named, state_dir) {
        Ok(c) => c,
        Err(e) => return fail(e, true),
    };
    let host =
        partition::host::tuning::report(Path::new("/"), &report_on, from, irqbalance, &in_force);
    let caps = match partition::kvm::idle_caps() {
        Ok(c) => c,
        Err(e) => return fail(e, false),
    };
    let apic = partition::kvm::apic::host_accel_here();
    let x2apic = partition::kvm::apic::show_x2apic(&apic);
    let policies: Vec<serde_json::Value> = IdlePolicy::ALL
        .iter()
        .map(|&p| match resolve(p, &caps) {
            Ok(plan) => serde_json::json!({
                "policy": p.name(), "offered": true, "resolves_to": plan.policy.name(),
                "plan": plan.describe(),
            }),
            Err(e) => {
                serde_json::json!({ "policy": p.name(), "offered": false, "why": e.to_string() })
            }
        })
        .collect();
    if json {
        let v = serde_json::json!({
            "disable_exits": caps.disable_exits.bits(),
            "disable_exits_names": caps.disable_exits.to_string(),
            "halt_poll": caps.halt_poll,
            "host_mwait": caps.host_mwait,
            "host_halt_poll_ns": caps.host_halt_poll_ns,
            "apic_acceleration": apic,
            "guest_x2apic": x2apic,
            "policies": policies,
            "host": host,
        });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        println!(
            "KVM_CAP_X86_DISABLE_EXITS: {} ({:#x})",
            caps.disable_exits,
            caps.disable_exits.bits()
        );
        println!(
            "KVM_CAP_HALT_POLL: {}",
            if caps.halt_poll { "yes" } else { "no" }
        );
        println!(
            "host MONITOR/MWAIT: {}",
            if caps.host_mwait { "yes" } else { "no" }
        );
        println!(
            "host halt_poll_ns: {}",
            caps.host_halt_poll_ns
                .map_or("unknown".into(), |n| n.to_string())
        );
        println!(
            "APIC virtualization: {}; guests are shown x2APIC: {}",
            apic.summary,
            if x2apic {
                "yes"
            } else {
                "no (AVIC without x2AVIC would intercept x2APIC's ICR writes)"
            }
        );
        print_host_report(&host);
        for p in policies {
            if p["offered"] == true {
                println!(
                    "--idle {:9} {}",
                    p["policy"].as_str().unwrap_or(""),
                    p["plan"].as_str().unwrap_or("")
                );
            } else {
                println!(
                    "--idle {:9} refused: {}",
                    p["policy"].as_str().unwrap_or(""),
                    p["why"].as_str().unwrap_or("")
                );
            }
        }
    }
    ExitCode::SUCCESS
}

fn print_host_report(r: &partition::host::tuning::HostReport) {
    use partition::host::tuning::Verdict;
    println!(
        "host settings for cores {} ({}):",
        cores::format(&r.cores),
        r.cores_from
    );
    for f in &r.findings {
        let mark = match f.verdict {
            Verdict::Ok => "ok  ",
            Verdict::Costs => "COST",
            Verdict::NotAvailable => "n/a ",
        };
        let on = if f.cores.is_empty() {
            String::new()
        } else {
            format!(" (cores {})", f.cores)
        };
        println!("  {mark} {}{on}: {}", f.setting, f.value);
        if !f.cost.is_empty() {
            println!("         costs: {}", f.cost);
        }
        if !f.change.is_empty() {
            println!("         change: {}", f.change);
        }
    }
}
