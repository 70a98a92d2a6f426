//! The report's `wake` and `noise` parts: wake-ups per idle policy and peer, the noise on the
//! partition's core quiet and beside the neighbour, and the VMM's paths beside it.

use std::fmt::Write as _;

use super::*;

/// Wake-ups per idle policy.
pub(super) fn wake(o: &mut String, w: &WakeSection) {
    let Some(ps) = &w.policies else {
        return;
    };
    let host = |m: fn(&WakeHost) -> &Option<WakeMetric>| {
        num(
            w.host
                .as_ref()
                .and_then(|h| m(h).as_ref())
                .map(|m| m.median_ns),
            0,
        )
    };
    let _ = writeln!(
        o,
        "\n## Wake-ups (`wake`)\n\nHost futex ping-pong {} ns, spin ping-pong {} ns.\n\n| policy | IPI round trip ns | timer lateness ns |\n|---|---|---|",
        host(|h| &h.futex_pingpong),
        host(|h| &h.spin_pingpong),
    );
    for p in ps {
        let (name, ipi, timer) = match p {
            PolicyRow::Measured(r) => (
                r.name.as_str(),
                r.ipi_round_trip.as_ref().map(|m| m.median_ns),
                r.timer_lateness.as_ref().map(|m| m.median_ns),
            ),
            PolicyRow::Refused { name, .. } => (name.as_str(), None, None),
        };
        let _ = writeln!(
            o,
            "| {name} | {} | {} |",
            ipi.map_or("refused".into(), |v| format!("{v:.0}")),
            num(timer, 0),
        );
    }
    // The peers, each in its own mode (QEMU's default and cpu-pm, Cloud Hypervisor,
    // Firecracker), on the same two cores.
    for r in w.peers.iter().flatten() {
        let _ = writeln!(
            o,
            "| peer: {} | {} | {} |",
            r.name,
            num(r.ipi_round_trip.as_ref().map(|m| m.median_ns), 0),
            num(r.timer_lateness.as_ref().map(|m| m.median_ns), 0),
        );
    }
    wake_goal(o, w);
    // Ours once (every policy runs alike), then each peer.
    let ours = w
        .policies
        .iter()
        .flatten()
        .find_map(|p| match p {
            crate::doc::wake::PolicyRow::Measured(r) => r.placement.as_deref(),
            _ => None,
        })
        .map(|how| ("partition (every policy)", how));
    let placed: Vec<(&str, &str)> = ours
        .into_iter()
        .chain(
            w.peers
                .iter()
                .flatten()
                .filter_map(|r| Some((r.name.as_str(), r.placement.as_deref()?))),
        )
        .collect();
    super::peers::placements(o, &placed);
    peer_builds(o, &w.head.peers());
}

/// The wake goal, each of our policies' IPI round trip at or under every peer's: which
/// policies meet it, and the best peer's figure.
pub(super) fn wake_goal(o: &mut String, w: &WakeSection) {
    let ipi = |r: &crate::doc::wake::WakeRow| r.ipi_round_trip.as_ref().map(|m| m.median_ns);
    let Some((peer, best)) = w
        .peers
        .iter()
        .flatten()
        .filter_map(|r| Some((r.name.as_str(), ipi(r)?)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
    else {
        return;
    };
    let (mut met, mut not) = (Vec::new(), Vec::new());
    for p in w.policies.iter().flatten() {
        if let PolicyRow::Measured(r) = p {
            if let Some(v) = ipi(r) {
                let e = format!("{} {v:.0}", r.name);
                if v <= best { met.push(e) } else { not.push(e) }
            }
        }
    }
    let list = |v: &[String]| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join(", ")
        }
    };
    let _ = writeln!(
        o,
        "\nGoal, an IPI round trip at or under every peer's (the best: {peer} {best:.0} ns): met by {}; not by {} (why: docs/benchmarks.md, \"Against the peers, where we stand\").",
        list(&met),
        list(&not)
    );
}

/// What the host takes from the partition's core: ours, the bare twin and QEMU, quiet and
/// beside the neighbour, each with the ratio to the bare twin under the same neighbour.
pub(super) fn noise(o: &mut String, n: &crate::doc::noise::NoiseSection) {
    let Some(rows) = &n.rows else {
        return;
    };
    let _ = writeln!(
        o,
        "\n## Noise on the partition's core (`noise`)\n\nCore {}, windows of {} ms, {} \
         rounds; neighbour {}. Cases: `bare` (a host thread), `partition` (our probe guest, \
         ad hoc) and `qemu` pinned to the core; `bare-reserved` and `partition-reserved` on \
         the core `partition reserve` took out of every other cpuset. x bare: against the \
         twin under the same neighbour (the reserved twin for reserved rows).\n",
        n.params.core, n.params.window_ms, n.params.runs, n.params.neighbour
    );
    if let Some(note) = &n.reserved_note {
        let _ = writeln!(o, "Reserved-core rows: {}\n", note.replace('|', "/"));
    }
    let _ = writeln!(
        o,
        "| case | neighbour | noise us/s | x bare | largest gap us | gaps >1 us /s | >10 us /s \
         | >100 us /s | p99.99 gap ns |\n|---|---|---|---|---|---|---|---|---|"
    );
    let cell = |r: &crate::doc::noise::NoiseRow, k: &str, prec: usize| {
        r.metrics.get(k).map_or("-".into(), |s| {
            format!("{:.prec$} ({:.prec$}-{:.prec$})", s.median, s.min, s.max)
        })
    };
    for r in rows {
        // The twin under the same neighbour: the reserved one for the reserved rows.
        let twin = if r.case.ends_with("-reserved") {
            "bare-reserved"
        } else {
            "bare"
        };
        let bare = rows
            .iter()
            .find(|b| b.case == twin && b.neighbour == r.neighbour)
            .and_then(|b| b.metrics.get("noise_us_per_s"))
            .map(|s| s.median);
        let ratio = match (r.metrics.get("noise_us_per_s"), bare) {
            (Some(s), Some(b)) if b > 0.0 => format!("{:.2}", s.median / b),
            _ => "-".into(),
        };
        let _ = writeln!(
            o,
            "| {} | {} | {} | {ratio} | {} | {} | {} | {} | {} |{}",
            r.case,
            if r.neighbour { "busy" } else { "quiet" },
            cell(r, "noise_us_per_s", 0),
            cell(r, "max_gap_us", 0),
            cell(r, "over_1us_per_s", 0),
            cell(r, "over_10us_per_s", 1),
            cell(r, "over_100us_per_s", 1),
            cell(r, "p9999_gap_ns", 0),
            failed_cell(&r.failures)
        );
    }
    noise_paths(o, &n.paths);
}

/// The wake round trip and the submit-to-fence in our partition, quiet and beside the
/// neighbour, each beside neighbour with its ratio to quiet.
pub(super) fn noise_paths(o: &mut String, paths: &[crate::doc::noise::PathRow]) {
    if paths.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "\nOur partition's paths, quiet and beside the same neighbour (`wake-ipi`: the probe's \
         IPI round trip between its two vCPUs, the first on the neighbour's core; \
         `submit-fence`: the mapped doorbell to the engine's fence, polled, the engine on the \
         neighbour's core), us, median of per-run medians (min-max):\n\n| path | policy | \
         neighbour | median us | x quiet | p99 us |\n|---|---|---|---|---|---|"
    );
    let us = |s: &Option<crate::stats::Summary>| {
        s.as_ref().map_or("-".into(), |s| {
            format!(
                "{:.2} ({:.2}-{:.2})",
                s.median / 1e3,
                s.min / 1e3,
                s.max / 1e3
            )
        })
    };
    for r in paths {
        let quiet = paths
            .iter()
            .find(|q| q.path == r.path && !q.neighbour)
            .and_then(|q| q.median_ns.as_ref())
            .map(|q| q.median);
        let ratio = match (&r.median_ns, quiet) {
            (Some(s), Some(q)) if q > 0.0 => format!("{:.2}", s.median / q),
            _ => "-".into(),
        };
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {ratio} | {} |{}",
            r.path,
            r.policy,
            if r.neighbour { "busy" } else { "quiet" },
            us(&r.median_ns),
            us(&r.p99_ns),
            failed_cell(&r.failures)
        );
    }
}
