//! The report's parts that set us against the peer VMMs: 4 KiB block reads (`blk`), the
//! peers' builds, and memory setup to the first byte (`memsetup`) with the goals against the
//! fastest peer.

use std::fmt::Write as _;

use super::*;

/// 4 KiB block reads: the host's own, ours, QEMU's.
pub(super) fn blk(o: &mut String, b: &BlkSection) {
    let Some(ours) = &b.ours else {
        return;
    };
    let _ = writeln!(
        o,
        "\n## Block (`blk`): 4 KiB random read at depth 1, guest polling, µs"
    );
    if !b.headline.is_empty() {
        let _ = writeln!(
            o,
            "\nLike against like (warm; µs):\n\n| pairing | completion | ours | peer | ours / peer |\n|---|---|---|---|---|"
        );
        for h in &b.headline {
            let _ = writeln!(
                o,
                "| {} | {} | {} {:.2} | {} {:.2} | {:.2} |",
                h.pairing,
                h.completion,
                h.ours,
                h.ours_median_ns / 1000.0,
                h.peer,
                h.peer_median_ns / 1000.0,
                h.ours_over_peer
            );
        }
        let _ = writeln!(o, "\nEvery row (the guest polling the used ring):");
    }
    let _ = writeln!(o, "\n| row | cache | median |\n|---|---|---|");
    // Host rows time the read itself, guest rows the guest's polled completion.
    let qemu: &[GuestRow] = match &b.qemu {
        Some(Peers::Rows(r)) => r,
        _ => &[],
    };
    let host = b
        .host
        .iter()
        .flatten()
        .map(|r| (r.name.as_str(), r.lat4k.as_ref()));
    let rust_peers = b.rust_peers.iter().flat_map(|p| match &p.rows {
        Peers::Rows(r) => r.as_slice(),
        Peers::Note(_) => &[],
    });
    let guest = ours
        .iter()
        .chain(qemu)
        .chain(rust_peers)
        .map(|r| (r.name.as_str(), r.lat4k_guest_polls.as_ref()));
    for (name, m) in host.chain(guest) {
        let _ = writeln!(
            o,
            "| {name} | {} | {} |",
            if name.contains("direct") {
                "cold"
            } else {
                "warm"
            },
            num(m.map(|m| m.median / 1000.0), 2)
        );
    }
    for p in &b.rust_peers {
        if let Peers::Note(n) = &p.rows {
            let _ = writeln!(o, "\n{n}.");
        }
    }
    peer_builds(o, &b.head.peers());
}

/// Each Rust peer a section ran: its binary, version and commit, or why it did not run.
pub(super) fn peer_builds(o: &mut String, peers: &[crate::peers::PeerInfo]) {
    for p in peers {
        let _ = match (&p.note, &p.binary) {
            (Some(note), _) => writeln!(o, "\n{note}."),
            (None, Some(bin)) => writeln!(
                o,
                "\n{}: {} ({}{}).",
                p.name,
                bin.display(),
                p.version.as_deref().unwrap_or("version unknown"),
                p.commit
                    .as_deref()
                    .map(|c| format!(", commit {c}"))
                    .unwrap_or_default()
            ),
            (None, None) => Ok(()),
        };
    }
}

/// Launch to the first serial byte per source and size.
pub(super) fn memsetup(o: &mut String, m: &MemSetupSection) {
    let Some(rows) = &m.rows else {
        return;
    };
    let _ = writeln!(
        o,
        "\n## Memory setup (`memsetup`): launch to first serial byte\n\nThe VMM's own cost at the first byte: CPU time of all its threads since exec, and its resident set (guest memory on hugepages is counted apart, as hugetlb).\n\n| source | size | first byte, ms | memory, ms | VMM CPU, ms | VMM RSS, MiB | hugetlb, MiB |\n|---|---|---|---|---|---|---|"
    );
    for r in rows {
        let med =
            |s: &Option<Summary>, scale: f64, prec: usize| num(s.map(|s| s.median / scale), prec);
        let _ = writeln!(
            o,
            "| {} | {} MiB | {} | {} | {} | {} | {} |",
            r.source,
            r.size_bytes >> 20,
            med(&r.first_byte_ms, 1.0, 1),
            med(&r.memory_ms, 1.0, 2),
            med(&r.vmm_cpu_ms_at_first_byte, 1.0, 1),
            med(&r.vmm_rss_kib_at_first_byte, 1024.0, 1),
            med(&r.vmm_hugetlb_kib_at_first_byte, 1024.0, 0),
        );
    }
    let lines: Vec<(String, String)> = rows
        .iter()
        .filter_map(|r| {
            Some((
                r.source.clone(),
                format!("`{}`; {}", r.config.as_ref()?, r.placement.as_ref()?),
            ))
        })
        .fold(Vec::new(), |mut acc, (s, t)| {
            if !acc.iter().any(|(a, _)| *a == s) {
                acc.push((s, t));
            }
            acc
        });
    let lines: Vec<(&str, &str)> = lines
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    placements(o, &lines);
    peer_builds(o, &m.peers);
    if !m.against_peers.is_empty() {
        let _ = writeln!(
            o,
            "\nOurs against the peers' best (the goal: each ratio at most {}):\n\n| ours | size | first byte over the fastest peer's | VMM CPU over the lowest peer's | RSS over Firecracker's | met |\n|---|---|---|---|---|---|",
            crate::doc::memsetup::PEER_GOAL
        );
        for g in &m.against_peers {
            let _ = writeln!(
                o,
                "| {} | {} MiB | {:.2} ({}) | {:.2} ({}) | {} | {} |",
                g.ours,
                g.size_bytes >> 20,
                g.first_byte_over_fastest,
                g.fastest_peer,
                g.cpu_over_lowest,
                g.lowest_cpu_peer,
                num(g.rss_over_firecracker, 2),
                if g.met { "yes" } else { "no" }
            );
        }
        peer_goals_unmet(o, m, rows);
    }
    memsetup_timeline(o, rows);
}

/// What each row ran and where its threads ran ([`crate::placement`]), one line a row,
/// under a table; nothing for results from before rows said so.
pub(super) fn placements(o: &mut String, rows: &[(&str, &str)]) {
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(o, "\nWhat each row ran, and where its threads ran:\n");
    for (name, how) in rows {
        let _ = writeln!(o, "- {name}: {how}");
    }
}

/// For each goal against the peers not met: the figures on both sides and, for the VMM's
/// CPU, the launch's largest CPU phases (from its timeline), so the report says why with
/// numbers; docs/benchmarks.md ("Against the peers, where we stand") reads them.
pub(super) fn peer_goals_unmet(
    o: &mut String,
    m: &MemSetupSection,
    rows: &[crate::doc::memsetup::MemSetupRow],
) {
    let goal = crate::doc::memsetup::PEER_GOAL;
    let row = |source: &str, size: u64| {
        rows.iter()
            .find(|r| r.source == source && r.size_bytes == size)
    };
    let med = |s: &Option<Summary>| s.map(|s| s.median);
    for g in m.against_peers.iter().filter(|g| !g.met) {
        let (Some(ours), Some(fast), Some(low)) = (
            row(&g.ours, g.size_bytes),
            row(&g.fastest_peer, g.size_bytes),
            row(&g.lowest_cpu_peer, g.size_bytes),
        ) else {
            continue;
        };
        let mut why = Vec::new();
        if g.first_byte_over_fastest > goal {
            why.push(format!(
                "first byte {} ms against {}'s {} ms",
                num(med(&ours.first_byte_ms), 1),
                g.fastest_peer,
                num(med(&fast.first_byte_ms), 1)
            ));
        }
        if g.cpu_over_lowest > goal {
            // Its three largest CPU phases, by median.
            let mut phases: Vec<(&str, f64)> = ours
                .runs_timeline_cpu_ms
                .iter()
                .filter_map(|(n, v)| Some((n.as_str(), crate::stats::summary(v)?.median)))
                .collect();
            phases.sort_by(|a, b| b.1.total_cmp(&a.1));
            let top: Vec<String> = phases
                .iter()
                .take(3)
                .map(|(n, v)| format!("{n} {v:.2}"))
                .collect();
            why.push(format!(
                "VMM CPU {} ms against {}'s {} ms{}",
                num(med(&ours.vmm_cpu_ms_at_first_byte), 1),
                g.lowest_cpu_peer,
                num(med(&low.vmm_cpu_ms_at_first_byte), 1),
                if top.is_empty() {
                    String::new()
                } else {
                    format!(
                        " (its largest phases, ms: {}, of {} phases)",
                        top.join(", "),
                        phases.len()
                    )
                }
            ));
        }
        if let Some(r) = g.rss_over_firecracker.filter(|r| *r > goal) {
            why.push(format!(
                "resident set {} MiB, {r:.2}x Firecracker's",
                num(med(&ours.vmm_rss_kib_at_first_byte).map(|k| k / 1024.0), 1)
            ));
        }
        let _ = writeln!(
            o,
            "\nNot met for `{}` at {} MiB: {} (what stands in the way: docs/benchmarks.md, \"Against the peers, where we stand\").",
            g.ours,
            g.size_bytes >> 20,
            why.join("; ")
        );
    }
}

/// Where our pool launches' time to the first byte goes: each phase's median wall and CPU
/// time, per size (the per-run figures are in the results file).
pub(super) fn memsetup_timeline(o: &mut String, rows: &[crate::doc::memsetup::MemSetupRow]) {
    let pool: Vec<_> = rows
        .iter()
        .filter(|r| r.source == "pool" && !r.runs_timeline_ms.is_empty())
        .collect();
    let Some(first) = pool.first() else {
        return;
    };
    let _ = write!(
        o,
        "\nWhere the pool launch's time to the first byte goes (`launch --timings`; `exec` is \
         spawn to `main`): median per phase, wall / VMM CPU, ms. Each column's medians need \
         not add up to its total.\n\n| phase |"
    );
    for r in &pool {
        let _ = write!(o, " {} MiB |", r.size_bytes >> 20);
    }
    let _ = write!(o, "\n|---|");
    for _ in &pool {
        let _ = write!(o, "---|");
    }
    for (phase, _) in &first.runs_timeline_ms {
        let _ = write!(o, "\n| {phase} |");
        // This phase's median in one of a row's per-phase lists.
        let med = |l: &[(String, Vec<f64>)]| {
            l.iter()
                .find(|(n, _)| n == phase)
                .and_then(|(_, v)| crate::stats::summary(v))
                .map(|s| s.median)
        };
        for r in &pool {
            let wall = med(&r.runs_timeline_ms);
            let cpu = med(&r.runs_timeline_cpu_ms);
            let _ = write!(o, " {} / {} |", num(wall, 2), num(cpu, 2));
        }
    }
    let _ = write!(o, "\n| **total** |");
    for r in &pool {
        let _ = write!(
            o,
            " {} / {} |",
            num(r.first_byte_ms.map(|s| s.median), 1),
            num(r.vmm_cpu_ms_at_first_byte.map(|s| s.median), 1)
        );
    }
    let _ = writeln!(o);
}
