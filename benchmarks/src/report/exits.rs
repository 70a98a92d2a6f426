//! The report's `exits` part: exits per operation by reason, ours under each idle policy and
//! QEMU's, beside the least the hardware allows, with the guest's own IPI counts.

use std::fmt::Write as _;

use crate::doc::exits::ExitsSection;

/// Exits per operation on real KVM: ours and QEMU's by reason, beside the minimum.
pub(super) fn exits(o: &mut String, e: &ExitsSection) {
    let _ = writeln!(
        o,
        "\n## Exits per operation on real KVM (`exits`)\n\n{} rounds; each loop {} then {} \
         iterations, counted by {}. Guest: {}. {}. Reasons as the host's tracepoint names \
         them (AMD: `io`, `msr`, `npf` (nested page fault: MMIO), `interrupt` (a host interrupt), \
         `vintr` (an interrupt window), `hlt`, `pause`...).\n",
        e.params.runs,
        e.params.n1,
        e.params.n2,
        e.method,
        e.params.guest,
        e.params.vmms.join("; ")
    );
    if !e.params.guest_idle.is_empty() {
        let idle: Vec<String> = e
            .params
            .guest_idle
            .iter()
            .map(|(vmm, how)| format!("{vmm}: `{how}`"))
            .collect();
        let _ = writeln!(
            o,
            "How each guest idles (its cpuidle driver and governor, as it said at its start; \
             an empty driver: none, the kernel's default idle): {}.\n",
            idle.join(", ")
        );
    }
    if !e.params.idle_routine.is_empty() {
        let seen: Vec<String> = e
            .params
            .idle_routine
            .iter()
            .map(|(vmm, r)| match &r.predicted {
                Some(p) => format!("{vmm}: `{}` (the launch predicted {p})", r.guest),
                None => format!("{vmm}: `{}`", r.guest),
            })
            .collect();
        let _ = writeln!(
            o,
            "The idle loop each guest's kernel took, from its boot log (`mwait`: \"using mwait \
             in idle threads\"; `default`: its HLT): {}.\n",
            seen.join(", ")
        );
    }
    if !e.failures.is_empty() {
        let _ = writeln!(o, "Failed: {}\n", e.failures.join("; ").replace('|', "/"));
    }
    if !e.replaced.is_empty() {
        let _ = writeln!(
            o,
            "Run again in a round of its own (a triple fault in the guest, below both VMMs; \
             the rows are over the runs that finished): {}\n",
            e.replaced.join("; ").replace('|', "/")
        );
    }
    let _ = writeln!(
        o,
        "| operation | minimum (AMD, no AVIC) | partition exits/op (by reason) | QEMU exits/op (by reason) |\n|---|---|---|---|"
    );
    for op in &e.params.ops {
        let min = e
            .minimum
            .iter()
            .find(|(m, _)| m == op)
            .map_or("-", |(_, w)| w.as_str());
        let _ = writeln!(
            o,
            "| {op} | {} | {} | {} |",
            min.replace('|', "/"),
            cell(e, "partition", op),
            cell(e, "qemu", op)
        );
    }
    policies(o, e);
}

/// One VMM's figure for `op`: the total with its spread, the reasons, and the guest's own
/// IPI count per iteration where it gave one.
fn cell(e: &ExitsSection, vmm: &str, op: &str) -> String {
    e.rows
        .iter()
        .find(|r| r.vmm == vmm && r.op == op)
        .and_then(|r| {
            let t = r.total?;
            let reasons: Vec<String> = r
                .reasons
                .iter()
                .filter(|(_, v)| v.abs() >= 0.005)
                .map(|(k, v)| format!("{k} {v:.2}"))
                .collect();
            let ipis: Vec<String> = r
                .guest_ipis
                .iter()
                .map(|(k, v)| format!("{k} {v:.2}"))
                .collect();
            Some(format!(
                "**{:.2}** ({:.2}-{:.2}){}{}",
                t.median,
                t.min,
                t.max,
                if reasons.is_empty() {
                    String::new()
                } else {
                    format!(": {}", reasons.join(", "))
                },
                if ipis.is_empty() {
                    String::new()
                } else {
                    format!("; guest IPIs {}", ipis.join(", "))
                }
            ))
        })
        .unwrap_or_else(|| "-".into())
}

/// Every idle policy's rows side by side, where the section ran more than one.
fn policies(o: &mut String, e: &ExitsSection) {
    if e.params.policies.len() < 2 {
        return;
    }
    let labels: Vec<String> = e
        .params
        .policies
        .iter()
        .map(|p| crate::exits::partition_label(p))
        .collect();
    let _ = writeln!(
        o,
        "\nEvery idle policy, the same guest and loops (exits per iteration by reason; guest \
         IPIs: its own RES and CAL counts per iteration):\n\n| operation | {} |\n|---|{}",
        e.params
            .policies
            .iter()
            .map(|p| format!("`--idle {p}`"))
            .collect::<Vec<_>>()
            .join(" | "),
        "---|".repeat(labels.len())
    );
    for op in &e.params.ops {
        let cells: Vec<String> = labels.iter().map(|l| cell(e, l, op)).collect();
        let _ = writeln!(o, "| {op} | {} |", cells.join(" | "));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doc::exits::{ExitsParams, ExitsRow};
    use crate::stats::summary;

    fn row(vmm: &str, op: &str, total: f64, ipis: Option<f64>) -> ExitsRow {
        ExitsRow {
            vmm: vmm.into(),
            op: op.into(),
            total: summary(&[total]),
            reasons: [("msr wr 0x830".to_string(), total / 2.0)].into(),
            guest_ipis: ipis
                .map(|v| [("RES".to_string(), v)].into())
                .unwrap_or_default(),
        }
    }

    #[test]
    fn every_policy_gets_a_column_and_the_guests_ipis_are_shown() {
        let mut e = ExitsSection {
            head: Default::default(),
            params: ExitsParams {
                runs: 1,
                n1: 10,
                n2: 30,
                ops: vec!["pipe_2cores".into()],
                guest: String::new(),
                vmms: Vec::new(),
                guest_idle: Default::default(),
                idle_routine: Default::default(),
                policies: vec!["mwait".into(), "hlt".into()],
            },
            method: String::new(),
            minimum: Vec::new(),
            rows: vec![
                row("partition", "pipe_2cores", 5.0, Some(1.95)),
                row("partition --idle hlt", "pipe_2cores", 6.0, None),
            ],
            failures: Vec::new(),
            replaced: Vec::new(),
        };
        let mut o = String::new();
        exits(&mut o, &e);
        assert!(
            o.contains("| operation | `--idle mwait` | `--idle hlt` |"),
            "{o}"
        );
        assert!(o.contains("**6.00**"), "{o}");
        assert!(o.contains("guest IPIs RES 1.95"), "{o}");
        // One policy: no side-by-side table.
        e.params.policies.truncate(1);
        let mut o = String::new();
        exits(&mut o, &e);
        assert!(!o.contains("`--idle mwait` |"), "{o}");
    }
}
