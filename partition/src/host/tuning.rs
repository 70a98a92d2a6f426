//! The host around a partition: which of its settings cost a reserved core latency, what
//! each costs and what to change (`partition caps`; docs/operations.md has the table).
//! Read-only: files under /sys and /proc, read through a root directory so the tests can
//! hand it a made-up tree. Where this host does not show a setting (no cpufreq in a VM),
//! the finding says so instead of guessing.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::config::cores;

/// How a setting stands for the cores asked about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Nothing to change.
    Ok,
    /// It costs the cores latency or noise.
    Costs,
    /// This host does not show it.
    NotAvailable,
}

/// One setting.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Which setting ("governor", "smt-sibling", ...).
    pub setting: &'static str,
    /// The cores it was read for ("" when host-wide).
    pub cores: String,
    /// What the host has.
    pub value: String,
    /// How it stands.
    pub verdict: Verdict,
    /// What it costs a partition (empty when nothing).
    pub cost: String,
    /// What to change (empty when nothing).
    pub change: String,
}

/// The report for a set of cores.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HostReport {
    /// The cores it is about.
    pub cores: Vec<usize>,
    /// Where they came from ("reserved", "named", "all online").
    pub cores_from: String,
    /// One finding per setting (per group of cores that read alike).
    pub findings: Vec<Finding>,
}

/// Reads the report for `cores` from the host under `root` ("/" in use).
/// `irqbalance`: a running irqbalance's pid and whether a reservation banned it from the
/// cores.
/// `in_force`: the idle policy of the partition running on a core, by core.
pub fn report(
    root: &Path,
    cores: &[usize],
    cores_from: &str,
    irqbalance: Option<(u32, bool)>,
    in_force: &[(usize, String)],
) -> HostReport {
    let h = Host { root };
    let mut f = Vec::new();
    h.cpufreq(cores, &mut f);
    h.pstate(&mut f);
    h.idle(cores, in_force, &mut f);
    h.smt(cores, &mut f);
    h.cmdline(cores, &mut f);
    h.thp(&mut f);
    h.cgroup_moves(&mut f);
    h.mitigations(&mut f);
    irqbalance_finding(cores, irqbalance, &mut f);
    other_balancers(root, &mut f);
    HostReport {
        cores: cores.to_vec(),
        cores_from: cores_from.to_string(),
        findings: f,
    }
}

struct Host<'a> {
    root: &'a Path,
}

fn finding(
    setting: &'static str,
    cores: &str,
    value: impl Into<String>,
    verdict: Verdict,
    cost: impl Into<String>,
    change: impl Into<String>,
) -> Finding {
    Finding {
        setting,
        cores: cores.to_string(),
        value: value.into(),
        verdict,
        cost: cost.into(),
        change: change.into(),
    }
}

/// A host-wide setting with nothing to change.
fn host_ok(setting: &'static str, value: impl Into<String>) -> Finding {
    finding(setting, "", value, Verdict::Ok, "", "")
}

/// A host-wide setting this host does not show; `value` says so ("not available here...").
fn host_unseen(setting: &'static str, value: impl Into<String>) -> Finding {
    finding(setting, "", value, Verdict::NotAvailable, "", "")
}

/// Groups `cores` by what `read` gives for each (the same value, one finding).
fn grouped(
    cores: &[usize],
    read: impl Fn(usize) -> Option<String>,
) -> Vec<(String, Option<String>)> {
    let mut groups: Vec<(Vec<usize>, Option<String>)> = Vec::new();
    for &c in cores {
        let v = read(c);
        match groups.iter_mut().find(|(_, g)| *g == v) {
            Some((cs, _)) => cs.push(c),
            None => groups.push((vec![c], v)),
        }
    }
    groups
        .into_iter()
        .map(|(cs, v)| (cores::format(&cs), v))
        .collect()
}

impl Host<'_> {
    fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel.trim_start_matches('/'))
    }

    fn read(&self, rel: &str) -> Option<String> {
        let s = std::fs::read_to_string(self.path(rel)).ok()?;
        Some(s.trim().to_string())
    }

    fn cpu(&self, core: usize, rel: &str) -> Option<String> {
        self.read(&format!("sys/devices/system/cpu/cpu{core}/{rel}"))
    }

    fn cpufreq(&self, cores: &[usize], f: &mut Vec<Finding>) {
        for (list, driver) in grouped(cores, |c| self.cpu(c, "cpufreq/scaling_driver")) {
            let Some(driver) = driver else {
                f.push(finding(
                    "cpufreq",
                    &list,
                    "not available here (no cpufreq in sysfs: a VM, or frequency left to \
                     the firmware)",
                    Verdict::NotAvailable,
                    "",
                    "",
                ));
                continue;
            };
            f.push(finding(
                "cpufreq-driver",
                &list,
                driver,
                Verdict::Ok,
                "",
                "",
            ));
        }
        let performance = |setting: &'static str,
                           file: &str,
                           cost: &str,
                           change: &dyn Fn(&str) -> String,
                           f: &mut Vec<Finding>| {
            for (list, v) in grouped(cores, |c| self.cpu(c, &format!("cpufreq/{file}"))) {
                let Some(v) = v else { continue };
                if v == "performance" {
                    f.push(finding(setting, &list, v, Verdict::Ok, "", ""));
                } else {
                    let to = change(&list);
                    f.push(finding(setting, &list, v, Verdict::Costs, cost, to));
                }
            }
        };
        performance(
            "governor",
            "scaling_governor",
            "after each idle period the core runs slower until the governor raises its \
             frequency (microseconds to milliseconds); wake-up and doorbell latency vary with it",
            &|list| {
                format!(
                    "cpupower -c {list} frequency-set -g performance (or write performance to \
                     cpu{{N}}/cpufreq/scaling_governor)"
                )
            },
            f,
        );
        performance(
            "epp",
            "energy_performance_preference",
            "the CPU's own frequency choice favours power over latency",
            &|_| "write performance to cpu{N}/cpufreq/energy_performance_preference".into(),
            f,
        );
    }

    fn pstate(&self, f: &mut Vec<Finding>) {
        let modes: Vec<String> = ["amd_pstate", "intel_pstate"]
            .iter()
            .filter_map(|d| {
                self.read(&format!("sys/devices/system/cpu/{d}/status"))
                    .map(|m| format!("{d} {m}"))
            })
            .collect();
        if modes.is_empty() {
            f.push(host_unseen(
                "pstate-mode",
                "not available here (neither amd_pstate nor intel_pstate drives this host)",
            ));
            return;
        }
        let value = modes.join(", ");
        let costs = value.ends_with("passive") || value.ends_with("guided");
        f.push(finding(
            "pstate-mode",
            "",
            value,
            if costs { Verdict::Costs } else { Verdict::Ok },
            if costs {
                "the governor, not the CPU, picks each frequency step: slower to follow a \
                 burst than active mode with energy_performance_preference=performance"
            } else {
                ""
            },
            if costs {
                "boot with amd_pstate=active (or intel_pstate=active), or keep the governor at \
                 performance"
            } else {
                ""
            },
        ));
    }

    /// The deepest enabled idle state of `core`: (index, name, exit latency in us).
    fn deepest_idle(&self, core: usize) -> Option<(usize, String, u64)> {
        let mut best = None;
        for i in 0..16 {
            let Some(name) = self.cpu(core, &format!("cpuidle/state{i}/name")) else {
                break;
            };
            if self
                .cpu(core, &format!("cpuidle/state{i}/disable"))
                .as_deref()
                == Some("1")
            {
                continue;
            }
            let lat = self
                .cpu(core, &format!("cpuidle/state{i}/latency"))
                .and_then(|l| l.parse().ok())
                .unwrap_or(0);
            best = Some((i, name, lat));
        }
        best
    }

    fn idle(&self, cores: &[usize], in_force: &[(usize, String)], f: &mut Vec<Finding>) {
        let driver = self
            .read("sys/devices/system/cpu/cpuidle/current_driver")
            .unwrap_or_else(|| "none".into());
        let policy = |c: usize| {
            in_force
                .iter()
                .find(|(core, _)| *core == c)
                .map(|(_, p)| p.clone())
        };
        for (list, key) in grouped(cores, |c| {
            let d = self.deepest_idle(c)?;
            Some(format!(
                "{}\t{}\t{}",
                d.1,
                d.2,
                policy(c).unwrap_or_default()
            ))
        }) {
            let Some(key) = key else {
                f.push(finding(
                    "idle-states",
                    &list,
                    format!("not available here (cpuidle driver {driver}, no states in sysfs)"),
                    Verdict::NotAvailable,
                    "",
                    "",
                ));
                continue;
            };
            let mut parts = key.split('\t');
            let name = parts.next().unwrap_or("");
            let lat: u64 = parts.next().and_then(|l| l.parse().ok()).unwrap_or(0);
            let running = parts.next().filter(|p| !p.is_empty());
            let mut value =
                format!("deepest enabled: {name}, exit latency {lat} us (cpuidle driver {driver})");
            if let Some(p) = running {
                value.push_str(&format!("; a partition runs there with --idle {p}"));
            }
            let kept_out = matches!(running, Some("mwait" | "poll"));
            if lat <= 2 || kept_out {
                if kept_out {
                    value.push_str(", which keeps the core out of the host's idle states");
                }
                f.push(finding("idle-states", &list, value, Verdict::Ok, "", ""));
                continue;
            }
            let cost = match running {
                Some(p) => format!(
                    "under --idle {p} the vCPU thread sleeps when the guest idles and the core \
                     may enter {name}: each wake-up pays up to {lat} us more"
                ),
                None => format!(
                    "with --idle hlt, haltpoll or shared the vCPU thread sleeps and the core \
                     may enter {name}: each wake-up pays up to {lat} us more; with --idle \
                     mwait or poll the vCPU thread keeps the core out of the host's idle \
                     states"
                ),
            };
            f.push(finding(
                "idle-states",
                &list,
                value,
                Verdict::Costs,
                cost,
                "launch with --idle mwait (or poll); or disable the deep states on these \
                 cores (write 1 to cpu{N}/cpuidle/state{K}/disable), or boot with \
                 processor.max_cstate=1",
            ));
        }
    }

    fn smt(&self, cores: &[usize], f: &mut Vec<Finding>) {
        for &c in cores {
            let Some(list) = self.cpu(c, "topology/thread_siblings_list") else {
                f.push(finding(
                    "smt-sibling",
                    &c.to_string(),
                    "not available here (no topology in sysfs)",
                    Verdict::NotAvailable,
                    "",
                    "",
                ));
                continue;
            };
            let siblings: Vec<usize> = cores::parse(&list)
                .unwrap_or_default()
                .into_iter()
                .filter(|s| *s != c)
                .collect();
            let outside: Vec<usize> = siblings
                .iter()
                .copied()
                .filter(|s| !cores.contains(s))
                .collect();
            if siblings.is_empty() {
                f.push(finding(
                    "smt-sibling",
                    &c.to_string(),
                    "none (one thread per core)",
                    Verdict::Ok,
                    "",
                    "",
                ));
            } else if outside.is_empty() {
                f.push(finding(
                    "smt-sibling",
                    &c.to_string(),
                    format!("{} (reserved too)", cores::format(&siblings)),
                    Verdict::Ok,
                    "",
                    "",
                ));
            } else {
                let o = cores::format(&outside);
                f.push(finding(
                    "smt-sibling",
                    &c.to_string(),
                    format!("{o} (left to the host)"),
                    Verdict::Costs,
                    "the sibling thread shares this core's execution units and L1/L2 caches: \
                     whatever the host runs there is noise in the partition",
                    format!(
                        "reserve {o} too, or take it offline (write 0 to \
                         /sys/devices/system/cpu/cpu{o}/online)"
                    ),
                ));
            }
        }
    }

    fn cmdline(&self, cores: &[usize], f: &mut Vec<Finding>) {
        let cmdline = self.read("proc/cmdline").unwrap_or_default();
        let param = |key: &str| {
            cmdline
                .split_whitespace()
                .rev()
                .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
                .map(String::from)
        };
        // isolcpus takes flags before the list ("managed_irq,domain,2-3").
        let cpu_list = |v: &str| -> Vec<usize> {
            let list: Vec<&str> = v
                .split(',')
                .filter(|p| p.starts_with(|c: char| c.is_ascii_digit()))
                .collect();
            cores::parse(&list.join(",")).unwrap_or_default()
        };
        let want = cores::format(cores);
        let params: [(&str, &str); 3] = [
            (
                "isolcpus",
                "the scheduler balances load onto the cores and unbound kernel work may run \
                 there; the reservation's cpusets keep tasks off, not the kernel's own",
            ),
            (
                "nohz_full",
                "a scheduler tick every 1-4 ms interrupts each core (on most hosts a VM exit \
                 for the guest running there)",
            ),
            (
                "rcu_nocbs",
                "RCU callbacks run on the cores, as softirqs between the guest's instructions",
            ),
        ];
        for (key, cost) in params {
            let v = param(key);
            let covered = v.as_deref().map(cpu_list).unwrap_or_default();
            let missing: Vec<usize> = cores
                .iter()
                .copied()
                .filter(|c| !covered.contains(c))
                .collect();
            let value = v.map_or_else(|| "not set".to_string(), |v| format!("{key}={v}"));
            if missing.is_empty() {
                f.push(finding(key, &want, value, Verdict::Ok, "", ""));
            } else {
                let add = if key == "isolcpus" {
                    format!("isolcpus=managed_irq,domain,{want}")
                } else {
                    format!("{key}={want}")
                };
                f.push(finding(
                    key,
                    &cores::format(&missing),
                    value,
                    Verdict::Costs,
                    cost,
                    format!("boot with {add}"),
                ));
            }
        }
        let v = param("irqaffinity");
        let on: Vec<usize> = match v.as_deref() {
            Some(v) => cpu_list(v)
                .into_iter()
                .filter(|c| cores.contains(c))
                .collect(),
            None => cores.to_vec(),
        };
        let value = v.map_or_else(
            || "not set (new IRQs may start on any core)".to_string(),
            |v| format!("irqaffinity={v}"),
        );
        if on.is_empty() {
            f.push(finding("irqaffinity", &want, value, Verdict::Ok, "", ""));
        } else {
            f.push(finding(
                "irqaffinity",
                &cores::format(&on),
                value,
                Verdict::Costs,
                "an IRQ a device registers after `reserve` (a hot-plugged device, a driver \
                 loaded later) starts on the reserved cores until something moves it",
                "boot with irqaffinity= listing only the host's cores",
            ));
        }
    }

    fn thp(&self, f: &mut Vec<Finding>) {
        let Some(v) = self.read("sys/kernel/mm/transparent_hugepage/enabled") else {
            f.push(host_unseen("transparent-hugepages", "not available here"));
            return;
        };
        let mode = v
            .split_whitespace()
            .find(|w| w.starts_with('['))
            .map(|w| w.trim_matches(|c| c == '[' || c == ']').to_string())
            .unwrap_or(v);
        if mode == "always" {
            f.push(finding(
                "transparent-hugepages",
                "",
                mode,
                Verdict::Costs,
                "khugepaged and compaction run host-wide, and a compaction stall can land on \
                 the VMM's threads; partitions do not need THP (their memory is the \
                 hugetlbfs pool)",
                "write madvise to /sys/kernel/mm/transparent_hugepage/enabled",
            ));
        } else {
            f.push(host_ok("transparent-hugepages", mode));
        }
    }

    /// Whether a pool launch's move into the reserved cores' cpuset waits for an RCU grace
    /// period. Under cgroup v1 each vCPU thread moves itself (`0` to `tasks`,
    /// `GuestsCpuset::join`), which the kernel does without its global thread-group lock
    /// (Linux 5.17 on): nothing to wait for. Under cgroup v2 the launcher moves as a whole
    /// process (`cgroup.procs`), and without favordynmods the kernel's write lock on that
    /// semaphore waits a grace period first (`percpu_down_write` -> `rcu_sync_enter`). With
    /// it the semaphore stays in the mode that needs none (kernel/cgroup/cgroup.c,
    /// `cgroup_favor_dynmods`; a mount option or `cgroup_favordynmods=` at boot, Linux 6.2
    /// on), at some cost to fork and exit.
    fn cgroup_moves(&self, f: &mut Vec<Finding>) {
        let Some(mounts) = self.read("proc/mounts") else {
            f.push(host_unseen("cgroup-moves", "not available here"));
            return;
        };
        // The hierarchies a pool partition's cpuset lives in (cgroup2, or v1's cpuset) make
        // the finding matter; favordynmods on any hierarchy makes every move cheap, since
        // the semaphore is one for the whole host.
        // Per cgroup mount: (v1 with the cpuset controller, cgroup2, favordynmods).
        let cgroups: Vec<(bool, bool, bool)> = mounts
            .lines()
            .filter_map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                let (kind, opts) = (*w.get(2)?, *w.get(3)?);
                let has = |o: &str| opts.split(',').any(|x| x == o);
                let v2 = kind == "cgroup2";
                (v2 || kind == "cgroup").then(|| (!v2 && has("cpuset"), v2, has("favordynmods")))
            })
            .collect();
        if !cgroups.iter().any(|(v1, v2, _)| *v1 || *v2) {
            f.push(host_unseen(
                "cgroup-moves",
                "not available here (no cgroup2 or cpuset hierarchy mounted)",
            ));
            return;
        }
        if cgroups.iter().any(|(v1, _, _)| *v1) {
            f.push(host_ok(
                "cgroup-moves",
                "cgroup v1 cpuset: each vCPU thread moves itself, which takes no grace \
                 period (Linux 5.17 on)",
            ));
            return;
        }
        let favoured = cgroups.iter().any(|(_, _, fav)| *fav);
        let at_boot = self.read("proc/cmdline").is_some_and(|c| {
            c.split_whitespace().any(|w| {
                matches!(
                    w.strip_prefix("cgroup_favordynmods="),
                    Some("1" | "y" | "Y" | "true" | "on")
                )
            })
        });
        if favoured || at_boot {
            f.push(host_ok("cgroup-moves", "favordynmods"));
        } else {
            f.push(finding(
                "cgroup-moves",
                "",
                "without favordynmods",
                Verdict::Costs,
                "the launcher's move into the reserved cores' cpuset partition (cgroup v2: \
                 the whole process) waits an RCU grace period before the guest can start (up \
                 to 32 ms of a pool launch's 27-48 ms when the threads moved by number under \
                 v1 on the development host, docs/operations.md)",
                "boot with cgroup_favordynmods=true (Linux 6.2 on), or mount the cpuset \
                 hierarchy with -o favordynmods",
            ));
        }
    }

    fn mitigations(&self, f: &mut Vec<Finding>) {
        let dir = self.path("sys/devices/system/cpu/vulnerabilities");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            f.push(host_unseen("mitigations", "not available here"));
            return;
        };
        let mut on: Vec<String> = entries
            .flatten()
            .filter_map(|e| {
                let text = std::fs::read_to_string(e.path()).ok()?;
                text.trim()
                    .starts_with("Mitigation")
                    .then(|| e.file_name().to_string_lossy().into_owned())
            })
            .collect();
        on.sort();
        // The ones whose cost is paid at VM entry or exit (a buffer clear, a cache flush, a
        // predictor barrier): what a partition's every exit pays.
        let at_exit: Vec<&String> = on
            .iter()
            .filter(|n| {
                [
                    "mds",
                    "mmio_stale_data",
                    "l1tf",
                    "retbleed",
                    "spec_rstack_overflow",
                    "spectre_v2",
                    "tsa",
                    "vmscape",
                    "its",
                    "indirect_target_selection",
                ]
                .contains(&n.as_str())
            })
            .collect();
        let cmd = self
            .read("proc/cmdline")
            .unwrap_or_default()
            .split_whitespace()
            .find(|w| w.starts_with("mitigations="))
            .map(String::from);
        let value = format!(
            "{} in force{}{}",
            on.len(),
            if on.is_empty() {
                String::new()
            } else {
                format!(": {}", on.join(", "))
            },
            cmd.map(|c| format!(" ({c})")).unwrap_or_default()
        );
        if at_exit.is_empty() {
            f.push(finding("mitigations", "", value, Verdict::Ok, "", ""));
        } else {
            f.push(finding(
                "mitigations",
                "",
                value,
                Verdict::Costs,
                format!(
                    "{}: each adds work to VM entries and exits (buffer clears, flushes, predictor \
                     barriers): paid per exit, so a partition whose hot paths take no exit \
                     (--idle mwait, mapped doorbells) pays it rarely",
                    at_exit
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                "nothing, as a rule: they protect the host; mitigations=off removes them only \
                 where every guest and process is trusted",
            ));
        }
    }
}

/// Daemons besides irqbalance that set IRQ affinities, governors or idle states themselves.
fn other_balancers(root: &Path, f: &mut Vec<Finding>) {
    const OTHERS: [(&str, &str); 1] = [(
        "tuned",
        "its profile may set IRQ affinities, the governor and idle states itself (its \
         irqbalance and cpu plugins), over what reserve set",
    )];
    let proc = root.join("proc");
    let comms: Vec<(u32, String)> = std::fs::read_dir(&proc)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
            Some((pid, comm.trim_end().to_string()))
        })
        .collect();
    let found: Vec<String> = OTHERS
        .iter()
        .filter_map(|(name, _)| {
            let (pid, _) = comms.iter().find(|(_, c)| c == name)?;
            Some(format!("{name} (pid {pid})"))
        })
        .collect();
    if found.is_empty() {
        f.push(finding(
            "other-balancers",
            "",
            "none running (tuned)",
            Verdict::Ok,
            "",
            "",
        ));
        return;
    }
    f.push(finding(
        "other-balancers",
        "",
        found.join(", "),
        Verdict::Costs,
        OTHERS[0].1,
        "use tuned's cpu-partitioning profile with isolated_cores= the reserved cores, or \
         stop it",
    ));
}

fn irqbalance_finding(cores: &[usize], daemon: Option<(u32, bool)>, f: &mut Vec<Finding>) {
    let list = cores::format(cores);
    match daemon {
        None => f.push(finding(
            "irqbalance",
            "",
            "not running",
            Verdict::Ok,
            "",
            "",
        )),
        Some((pid, true)) => f.push(finding(
            "irqbalance",
            &list,
            format!("runs (pid {pid}), banned from the reserved cores by the reservation"),
            Verdict::Ok,
            "",
            "",
        )),
        Some((pid, false)) => f.push(finding(
            "irqbalance",
            &list,
            format!("runs (pid {pid}), not banned from these cores"),
            Verdict::Costs,
            "it rewrites /proc/irq/*/smp_affinity every 10 s and puts device interrupts \
             back on the cores a reservation moved them off",
            "reserve bans them through its socket (the default, --irqbalance ban) when it \
             runs at reserve time; one started later reads IRQBALANCE_BANNED_CPULIST from \
             its environment file, and keeps off isolcpus/nohz_full cores by itself",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(tag: &str, files: &[(&str, &str)]) -> PathBuf {
        let root = std::env::temp_dir().join(format!("tuning-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (p, v) in files {
            let p = root.join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, v).unwrap();
        }
        root
    }

    fn by<'a>(r: &'a HostReport, setting: &str) -> Vec<&'a Finding> {
        r.findings.iter().filter(|f| f.setting == setting).collect()
    }

    #[test]
    fn a_tuned_host_has_nothing_to_change() {
        let cpu = "sys/devices/system/cpu";
        let mut files: Vec<(String, &str)> = Vec::new();
        for c in [2, 18] {
            for (f, v) in [
                ("cpufreq/scaling_driver", "amd-pstate-epp\n"),
                ("cpufreq/scaling_governor", "performance\n"),
                ("cpufreq/energy_performance_preference", "performance\n"),
                ("cpuidle/state0/name", "POLL\n"),
                ("cpuidle/state0/latency", "0\n"),
                ("cpuidle/state1/name", "C1\n"),
                ("cpuidle/state1/latency", "1\n"),
                ("cpuidle/state2/name", "C2\n"),
                ("cpuidle/state2/latency", "350\n"),
                ("cpuidle/state2/disable", "1\n"),
                ("topology/thread_siblings_list", "2,18\n"),
            ] {
                files.push((format!("{cpu}/cpu{c}/{f}"), v));
            }
        }
        for (f, v) in [
            (format!("{cpu}/amd_pstate/status"), "active\n"),
            (
                "proc/cmdline".to_string(),
                "ro isolcpus=managed_irq,domain,2,18 nohz_full=2,18 rcu_nocbs=2,18 \
                 irqaffinity=0-1\n",
            ),
            (
                "sys/kernel/mm/transparent_hugepage/enabled".to_string(),
                "always [madvise] never\n",
            ),
            (
                "proc/mounts".to_string(),
                "proc /proc proc rw 0 0\ncgroup2 /sys/fs/cgroup cgroup2 \
                 rw,nosuid,nodev,noexec,relatime,nsdelegate,favordynmods 0 0\n",
            ),
            (format!("{cpu}/vulnerabilities/meltdown"), "Not affected\n"),
            (
                format!("{cpu}/vulnerabilities/spectre_v1"),
                "Mitigation: usercopy/swapgs barriers\n",
            ),
        ] {
            files.push((f, v));
        }
        let refs: Vec<(&str, &str)> = files.iter().map(|(f, v)| (f.as_str(), *v)).collect();
        let root = tree("tuned", &refs);
        let r = report(&root, &[2, 18], "named", None, &[]);
        let costs: Vec<&Finding> = r
            .findings
            .iter()
            .filter(|f| f.verdict != Verdict::Ok)
            .collect();
        assert!(costs.is_empty(), "{costs:#?}");
        assert_eq!(
            by(&r, "idle-states")[0].value,
            "deepest enabled: C1, exit latency 1 us (cpuidle driver none)"
        );
        assert_eq!(by(&r, "smt-sibling")[0].value, "18 (reserved too)");
        assert_eq!(by(&r, "mitigations")[0].value, "1 in force: spectre_v1");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn each_setting_that_costs_says_what_and_what_to_change() {
        let cpu = "sys/devices/system/cpu";
        let root = tree(
            "untuned",
            &[
                (
                    &format!("{cpu}/cpu1/cpufreq/scaling_driver"),
                    "acpi-cpufreq\n",
                ),
                (
                    &format!("{cpu}/cpu1/cpufreq/scaling_governor"),
                    "schedutil\n",
                ),
                (
                    &format!("{cpu}/cpu1/cpufreq/energy_performance_preference"),
                    "balance_power\n",
                ),
                (&format!("{cpu}/intel_pstate/status"), "passive\n"),
                (&format!("{cpu}/cpu1/cpuidle/state0/name"), "POLL\n"),
                (&format!("{cpu}/cpu1/cpuidle/state0/latency"), "0\n"),
                (&format!("{cpu}/cpu1/cpuidle/state1/name"), "C6\n"),
                (&format!("{cpu}/cpu1/cpuidle/state1/latency"), "133\n"),
                (
                    &format!("{cpu}/cpu1/topology/thread_siblings_list"),
                    "1,5\n",
                ),
                ("proc/cmdline", "ro nohz_full=2 mitigations=auto\n"),
                (
                    "sys/kernel/mm/transparent_hugepage/enabled",
                    "[always] madvise never\n",
                ),
                (
                    "proc/mounts",
                    "cgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n",
                ),
                (
                    &format!("{cpu}/vulnerabilities/mds"),
                    "Mitigation: Clear CPU buffers; SMT vulnerable\n",
                ),
                ("proc/4242/comm", "tuned\n"),
            ],
        );
        let r = report(
            &root,
            &[1],
            "reserved",
            Some((77, false)),
            &[(1, "hlt".into())],
        );
        for s in [
            "governor",
            "epp",
            "pstate-mode",
            "idle-states",
            "smt-sibling",
            "isolcpus",
            "nohz_full",
            "rcu_nocbs",
            "irqaffinity",
            "transparent-hugepages",
            "cgroup-moves",
            "mitigations",
            "irqbalance",
            "other-balancers",
        ] {
            let f = by(&r, s);
            assert_eq!(f.len(), 1, "{s}: {:#?}", r.findings);
            assert_eq!(f[0].verdict, Verdict::Costs, "{s}: {:#?}", f[0]);
            assert!(
                !f[0].cost.is_empty() && !f[0].change.is_empty(),
                "{:#?}",
                f[0]
            );
        }
        let idle = by(&r, "idle-states")[0];
        assert!(
            idle.cost.contains("under --idle hlt") && idle.cost.contains("133 us"),
            "{idle:#?}"
        );
        assert_eq!(by(&r, "other-balancers")[0].value, "tuned (pid 4242)");
        // The same core under a partition that polls or waits in MWAIT: kept out.
        let r = report(&root, &[1], "reserved", None, &[(1, "mwait".into())]);
        let idle = by(&r, "idle-states")[0];
        assert_eq!(idle.verdict, Verdict::Ok, "{idle:#?}");
        assert!(
            idle.value
                .ends_with("keeps the core out of the host's idle states")
        );
        assert!(by(&r, "smt-sibling")[0].change.contains("reserve 5 too"));
        assert_eq!(by(&r, "nohz_full")[0].value, "nohz_full=2");
        assert!(
            by(&r, "isolcpus")[0]
                .change
                .contains("isolcpus=managed_irq,domain,1")
        );
        assert!(
            by(&r, "mitigations")[0]
                .value
                .contains("(mitigations=auto)")
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn what_this_host_does_not_show_is_said_not_guessed() {
        let root = tree("bare", &[("proc/cmdline", "ro\n")]);
        let r = report(&root, &[1], "named", None, &[]);
        for s in [
            "cpufreq",
            "pstate-mode",
            "idle-states",
            "smt-sibling",
            "transparent-hugepages",
            "cgroup-moves",
            "mitigations",
        ] {
            let f = by(&r, s);
            assert_eq!(f.len(), 1, "{s}: {:#?}", r.findings);
            assert_eq!(f[0].verdict, Verdict::NotAvailable, "{s}");
            assert!(f[0].value.starts_with("not available here"), "{:#?}", f[0]);
        }
        assert_eq!(by(&r, "irqbalance")[0].verdict, Verdict::Ok);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn favordynmods_counts_from_the_mount_or_the_boot_line() {
        let v1 = "cgroup /sys/fs/cgroup/cpuset cgroup rw,relatime,cpuset 0 0\n";
        let v2 = "cgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n";
        for (tag, cmdline, mounts, want) in [
            ("plain", "ro\n", v1, Verdict::Ok),
            ("boot", "ro cgroup_favordynmods=true\n", v1, Verdict::Ok),
            // Under v1 the threads move themselves: no grace period, favordynmods or not.
            ("v1-self", "ro cgroup_favordynmods=false\n", v1, Verdict::Ok),
            ("boot-v2", "ro cgroup_favordynmods=true\n", v2, Verdict::Ok),
            (
                "boot-no-v2",
                "ro cgroup_favordynmods=false\n",
                v2,
                Verdict::Costs,
            ),
            ("v2", "ro\n", v2, Verdict::Costs),
            (
                "mount-v2",
                "ro\n",
                "cgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate,favordynmods 0 0\n",
                Verdict::Ok,
            ),
            (
                "other-hierarchy",
                "ro\n",
                "cgroup /sys/fs/cgroup/cpu cgroup rw,cpu,favordynmods 0 0\n\
                 cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n",
                Verdict::Ok,
            ),
            (
                "no-cpuset",
                "ro\n",
                "cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n",
                Verdict::NotAvailable,
            ),
        ] {
            let root = tree(
                &format!("fdm-{tag}"),
                &[("proc/cmdline", cmdline), ("proc/mounts", mounts)],
            );
            let r = report(&root, &[1], "named", None, &[]);
            let f = by(&r, "cgroup-moves");
            assert_eq!(f.len(), 1, "{tag}: {:#?}", r.findings);
            assert_eq!(f[0].verdict, want, "{tag}: {:#?}", f[0]);
            std::fs::remove_dir_all(&root).unwrap();
        }
    }
}
