//! Rows of other idle policies, taken in runs of their own, into a completed `exits`
//! section (`partition bench --merge-policy-rows FROM`). In the rig a run of many guests
//! tends to lose the outer machine before its results come back (docs/testing.md), while a
//! run of one policy's guest comes back; each policy's rows only ever compare with the
//! others' by operation, so they can come from separate runs, provided each row says which.

use crate::doc::exits::ExitsSection;
use crate::exits::partition_label;

/// Adds (or replaces) in `into` the rows of every non-`mwait` policy that `from` ran,
/// with its guest's idle and routine, a `vmms` line naming the run it came from (its end
/// time and commit), and its policy in `policies`. `into` must be a completed section and
/// `from` a run whose only failures are QEMU's absence (`RIG_BENCH_NO_QEMU`, `--no-qemu`).
/// Returns the labels merged.
pub fn merge_policy_rows(
    into: &mut ExitsSection,
    from: &ExitsSection,
) -> Result<Vec<String>, String> {
    if !into.head.completed {
        return Err("the section to merge into is not complete".into());
    }
    if let Some(f) = from.failures.iter().find(|f| !f.starts_with("qemu:")) {
        return Err(format!("the run to merge from failed: {f}"));
    }
    if (from.params.n1, from.params.n2) != (into.params.n1, into.params.n2) {
        return Err(format!(
            "the run to merge from counted {},{} iterations, the section {},{}",
            from.params.n1, from.params.n2, into.params.n1, into.params.n2
        ));
    }
    let policies: Vec<&String> = from
        .params
        .policies
        .iter()
        .filter(|p| *p != "mwait")
        .collect();
    if policies.is_empty() {
        return Err("the run to merge from has no policy but mwait".into());
    }
    let commit = format!(
        "{}{}",
        from.head.provenance["commit"].as_str().unwrap_or("unknown"),
        if from.head.provenance["commit_dirty"] == true {
            " with uncommitted changes"
        } else {
            ""
        }
    );
    let when = from
        .head
        .finished_at
        .as_deref()
        .unwrap_or("an unknown time");
    if into.params.policies.is_empty() {
        into.params.policies.push("mwait".into());
    }
    let mut merged = Vec::new();
    for p in policies {
        let label = partition_label(p);
        let rows: Vec<_> = from
            .rows
            .iter()
            .filter(|r| r.vmm == label)
            .cloned()
            .collect();
        if rows.is_empty() {
            return Err(format!("the run to merge from has no rows for {label}"));
        }
        into.rows.retain(|r| r.vmm != label);
        into.rows.extend(rows);
        into.params
            .vmms
            .retain(|v| !v.starts_with(&format!("{label}:")));
        // A row set the source itself merged keeps the line naming the run it came from.
        let own = format!("{label}:");
        let line = from
            .params
            .vmms
            .iter()
            .find(|v| v.starts_with(&own))
            .cloned()
            .unwrap_or_else(|| {
                format!(
                    "{label}: as partition, the guest idling as --idle {p} has it, {} run(s) of \
                     its own (finished {when}, commit {commit})",
                    from.params.runs
                )
            });
        into.params.vmms.push(line);
        if let Some(v) = from.params.guest_idle.get(&label) {
            into.params.guest_idle.insert(label.clone(), v.clone());
        }
        if let Some(v) = from.params.idle_routine.get(&label) {
            into.params.idle_routine.insert(label.clone(), v.clone());
        }
        if !into.params.policies.contains(p) {
            into.params.policies.push(p.clone());
        }
        merged.push(label);
    }
    Ok(merged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doc::exits::{ExitsParams, ExitsRow};
    use crate::head::Head;
    use crate::stats::summary;

    fn section(policies: &[&str], failures: &[&str], completed: bool) -> ExitsSection {
        let rows = policies
            .iter()
            .map(|p| ExitsRow {
                vmm: partition_label(p),
                op: "pipe_2cores".into(),
                total: summary(&[5.0]),
                reasons: Default::default(),
                guest_ipis: Default::default(),
            })
            .collect();
        ExitsSection {
            head: Head {
                completed,
                finished_at: Some("2026-12-06T23:28:24Z".into()),
                provenance: serde_json::json!({"commit": "38dc446"}),
                ..Default::default()
            },
            params: ExitsParams {
                runs: 1,
                n1: 50,
                n2: 550,
                ops: vec!["pipe_2cores".into()],
                guest: String::new(),
                vmms: vec!["partition: --idle mwait".into()],
                guest_idle: Default::default(),
                idle_routine: Default::default(),
                policies: policies.iter().map(|p| p.to_string()).collect(),
            },
            method: String::new(),
            minimum: Vec::new(),
            rows,
            failures: failures.iter().map(|f| f.to_string()).collect(),
            replaced: Vec::new(),
        }
    }

    #[test]
    fn another_policys_rows_join_a_completed_section_saying_where_they_came_from() {
        let mut into = section(&["mwait"], &[], true);
        into.params.policies.clear(); // written before policies were recorded
        let from = section(
            &["hlt"],
            &["qemu: qemu-system-x86_64 is not installed"],
            false,
        );
        assert_eq!(
            merge_policy_rows(&mut into, &from).unwrap(),
            ["partition --idle hlt"]
        );
        assert_eq!(into.params.policies, ["mwait", "hlt"]);
        assert_eq!(into.rows.len(), 2);
        assert!(into.params.vmms[1].contains("finished 2026-12-06T23:28:24Z, commit 38dc446"));
        assert!(into.head.completed);
        // Again: replaced, not doubled.
        merge_policy_rows(&mut into, &from).unwrap();
        assert_eq!(into.rows.len(), 2);
        assert_eq!(into.params.vmms.len(), 2);
        // From a section whose hlt rows were merged in turn: their own run stays named (a
        // new base run re-takes the policy rows of the file it replaced).
        let mut fresh = section(&["mwait"], &[], true);
        let mut relay = into.clone();
        relay.head.finished_at = Some("2026-12-07T02:19:00Z".into());
        merge_policy_rows(&mut fresh, &relay).unwrap();
        assert!(
            fresh
                .params
                .vmms
                .iter()
                .any(|v| v.starts_with("partition --idle hlt:")
                    && v.contains("finished 2026-12-06T23:28:24Z, commit 38dc446")),
            "{:?}",
            fresh.params.vmms
        );
    }

    #[test]
    fn a_failed_run_or_an_incomplete_section_is_refused() {
        let from_bad = section(
            &["hlt"],
            &["partition --idle hlt round 0: triple fault"],
            false,
        );
        let mut into = section(&["mwait"], &[], true);
        assert!(
            merge_policy_rows(&mut into, &from_bad)
                .unwrap_err()
                .contains("failed")
        );
        let from = section(&["hlt"], &[], true);
        let mut open = section(&["mwait"], &[], false);
        assert!(merge_policy_rows(&mut open, &from).is_err());
        let only_mwait = section(&["mwait"], &[], true);
        assert!(merge_policy_rows(&mut into, &only_mwait).is_err());
        let mut other_counts = section(&["hlt"], &[], true);
        other_counts.params.n1 = 10;
        assert!(
            merge_policy_rows(&mut into, &other_counts)
                .unwrap_err()
                .contains("iterations")
        );
        assert_eq!(into.rows.len(), 1, "nothing merged");
    }
}
