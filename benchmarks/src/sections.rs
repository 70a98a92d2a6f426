//! The benchmark sections behind `partition bench`: one [`Section`] each, in the order a
//! full run takes them. A section returns the results-file sections it measured (the hot
//! paths return `host` and `guest` together: they alternate).

use crate::Env;
use crate::doc::SectionDoc;

/// What a run asks of the sections beyond the environment.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// memsetup sizes, largest last.
    pub sizes: Vec<u64>,
    /// One window of the noise section, ms (0: [`NOISE_WINDOW_MS`]).
    pub noise_ms: u64,
    /// The exits section's two counted runs a loop (None: `exits::N1`, `exits::N2`).
    pub exits_count: Option<(u64, u64)>,
    /// The exits section's idle policies for our partition, a row set each (empty:
    /// `mwait` alone).
    pub exits_policies: Vec<String>,
}

/// One benchmark section.
pub trait Section: Sync {
    /// The results-file sections it can write, each with what it measures (`--list`).
    fn names(&self) -> &'static [(&'static str, &'static str)];
    /// Runs the parts `wanted` selects (by results-file name); returns what it measured,
    /// as results-file sections.
    fn run(
        &self,
        env: &Env,
        opts: &Options,
        wanted: &dyn Fn(&str) -> bool,
    ) -> Vec<(&'static str, SectionDoc)>;
}

struct HotPaths;
struct Probe;
struct Crosscheck;
struct Wake;
struct Blk;
struct MemSetup;
struct Builds;
struct Sandboxing;
struct Submit;
struct Noise;
struct Exits;

/// One window of the noise section, ms.
pub const NOISE_WINDOW_MS: u64 = 2000;

impl Section for Noise {
    fn names(&self) -> &'static [(&'static str, &'static str)] {
        &[(
            "noise",
            "what the host takes from the partition's core: a TSC gap detector in the probe guest's ring 3, as a bare-host thread on the same core and in QEMU microvm pinned there, quiet and beside a noisy neighbour (stress-ng and a disk-reading guest) on the housekeeping core: us lost per second, largest gap, gaps over 1/10/100 us, p99.99; and our wake round trip and mapped-doorbell submit-to-fence, quiet and beside the same neighbour",
        )]
    }
    fn run(
        &self,
        env: &Env,
        opts: &Options,
        _: &dyn Fn(&str) -> bool,
    ) -> Vec<(&'static str, SectionDoc)> {
        let ms = if opts.noise_ms == 0 {
            NOISE_WINDOW_MS
        } else {
            opts.noise_ms
        };
        vec![(
            "noise",
            SectionDoc::Noise(Box::new(crate::noise::run(env, ms))),
        )]
    }
}

impl Section for Exits {
    fn names(&self) -> &'static [(&'static str, &'static str)] {
        &[(
            "exits",
            "exits per operation on real KVM (the rig), counted by the host's kvm_exit tracepoint: Debian's kernel running hotpaths' loops in counted mode in our partition and in QEMU (-cpu host -overcommit cpu-pm=on -smp 2), by reason, beside the least the hardware allows (needs --exits-guest: scripts/rig-bench.sh exits)",
        )]
    }
    fn run(
        &self,
        env: &Env,
        opts: &Options,
        _: &dyn Fn(&str) -> bool,
    ) -> Vec<(&'static str, SectionDoc)> {
        let (n1, n2) = opts
            .exits_count
            .unwrap_or((crate::exits::N1, crate::exits::N2));
        vec![(
            "exits",
            SectionDoc::Exits(Box::new(crate::exits::run(
                env,
                n1,
                n2,
                &opts.exits_policies,
            ))),
        )]
    }
}

impl Section for HotPaths {
    fn names(&self) -> &'static [(&'static str, &'static str)] {
        &[
            (
                "host",
                "the hotpaths suite (lmbench's loops: syscalls, signals, context switch, pipe, AF_UNIX, fork/exec, memory latency and bandwidth) on the bare host, pinned to the partition's cores; alternates with `guest`",
            ),
            (
                "guest",
                "the same suite in a Linux partition on those cores, per idle policy (needs scripts/guest-image.sh; on a host that cannot run Linux guests it says why)",
            ),
        ]
    }
    fn run(
        &self,
        env: &Env,
        _: &Options,
        wanted: &dyn Fn(&str) -> bool,
    ) -> Vec<(&'static str, SectionDoc)> {
        let (host, guest) = crate::hotpaths::run(env, wanted("host"), wanted("guest"));
        let mut out = Vec::new();
        if let Some(h) = host {
            out.push(("host", SectionDoc::Host(Box::new(h))));
        }
        if let Some(g) = guest {
            out.push(("guest", SectionDoc::Guest(Box::new(g))));
        }
        out
    }
}

impl Section for Probe {
    fn names(&self) -> &'static [(&'static str, &'static str)] {
        &[(
            "probe",
            "the VMM's own paths from the probe guest (CPUID, port and MMIO exits, ioeventfd doorbell) and its memory-latency staircase against the same chase on the host; ours with and without ioeventfd, and QEMU microvm",
        )]
    }
    fn run(
        &self,
        env: &Env,
        _: &Options,
        _: &dyn Fn(&str) -> bool,
    ) -> Vec<(&'static str, SectionDoc)> {
        vec![("probe", SectionDoc::Probe(Box::new(crate::probe::run(env))))]
    }
}

impl Section for Crosscheck {
    fn names(&self) -> &'static [(&'static str, &'static str)] {
        &[(
            "crosscheck",
            "our bare-host figures against lmbench, stress-ng, cyclictest and fio run in the same session",
        )]
    }
    fn run(
        &self,
        env: &Env,
        _: &Options,
        _: &dyn Fn(&str) -> bool,
    ) -> Vec<(&'static str, SectionDoc)> {
        vec![(
            "crosscheck",
            SectionDoc::Crosscheck(Box::new(crate::crosscheck::run(env))),
        )]
    }
}

impl Section for Wake {
    fn names(&self) -> &'static [(&'static str, &'static str)] {
        &[(
            "wake",
            "the price of a fast wakeup per idle policy: timer lateness, IPI and shared-memory ping-pong in a 2-vCPU probe guest vs futex/spin/clock_nanosleep on the bare host; idle busy share and energy; QEMU microvm default and cpu-pm=on",
        )]
    }
    fn run(
        &self,
        env: &Env,
        _: &Options,
        _: &dyn Fn(&str) -> bool,
    ) -> Vec<(&'static str, SectionDoc)> {
        vec![("wake", SectionDoc::Wake(Box::new(crate::wake::run(env))))]
    }
}

impl Section for Blk {
    fn names(&self) -> &'static [(&'static str, &'static str)] {
        &[(
            "blk",
            "4 KiB reads at depth 1 (and depth 32, GET_ID fences, a 64 MiB sequential read): host pread/io_uring warm and O_DIRECT vs the probe guest over exit notify, ioeventfd, ioeventfd+polling, O_DIRECT vs QEMU microvm virtio-blk (io_uring, iothread+polling)",
        )]
    }
    fn run(
        &self,
        env: &Env,
        _: &Options,
        _: &dyn Fn(&str) -> bool,
    ) -> Vec<(&'static str, SectionDoc)> {
        vec![("blk", SectionDoc::Blk(Box::new(crate::blk::run(env))))]
    }
}

impl Section for MemSetup {
    fn names(&self) -> &'static [(&'static str, &'static str)] {
        &[(
            "memsetup",
            "launch to first serial byte, its memory-setup part and the VMM's own CPU time and RSS: pool vs fresh anonymous (prefault) vs fresh hugetlb vs QEMU microvm -mem-prealloc, anonymous and from hugetlbfs, 256 MiB to 8 GiB",
        )]
    }
    fn run(
        &self,
        env: &Env,
        opts: &Options,
        _: &dyn Fn(&str) -> bool,
    ) -> Vec<(&'static str, SectionDoc)> {
        let sizes = if opts.sizes.is_empty() {
            crate::memsetup::default_sizes()
        } else {
            opts.sizes.clone()
        };
        vec![(
            "memsetup",
            SectionDoc::MemSetup(Box::new(crate::memsetup::run(env, &sizes))),
        )]
    }
}

impl Section for Builds {
    fn names(&self) -> &'static [(&'static str, &'static str)] {
        &[(
            "builds",
            "this build against a baseline build (--baseline BIN; scripts/bench.sh --baseline REV builds one): the probe's ioeventfd doorbell and MMIO exit, polled 4 KiB block reads and fences, launch to first byte, A B A B; runs only when a baseline is given",
        )]
    }
    fn run(
        &self,
        env: &Env,
        _: &Options,
        _: &dyn Fn(&str) -> bool,
    ) -> Vec<(&'static str, SectionDoc)> {
        crate::compare::builds(env)
            .map(|s| vec![("builds", SectionDoc::Compare(Box::new(s)))])
            .unwrap_or_default()
    }
}

impl Section for Sandboxing {
    fn names(&self) -> &'static [(&'static str, &'static str)] {
        &[(
            "sandbox",
            "what confinement costs: the same probe paths (ioeventfd doorbell, MMIO exit, polled 4 KiB reads and fences, launch to first byte) with --no-sandbox and sandboxed, A B A B",
        )]
    }
    fn run(
        &self,
        env: &Env,
        _: &Options,
        _: &dyn Fn(&str) -> bool,
    ) -> Vec<(&'static str, SectionDoc)> {
        vec![(
            "sandbox",
            SectionDoc::Compare(Box::new(crate::compare::sandbox(env))),
        )]
    }
}

impl Section for Submit {
    fn names(&self) -> &'static [(&'static str, &'static str)] {
        &[
            (
                "submit",
                "GPU-style submission: submit-to-fence through the PCI submission engine for every doorbell mode (trap, ioeventfd, mapped page) x completion (polled fence, MSI-X) x idle policy, against bare-host twins running the engine's own code on the same two cores and QEMU's edu and pci-testdev on microvm (PCIe) in the same run",
            ),
            (
                "submit-vfio",
                "GPU-style submission through a passed-through NVMe controller (--vfio BDF): one-block reads polled and by MSI-X from the probe in a partition, the same driver on the bare host through VFIO, and QEMU microvm with vfio-pci; the partition's exits per submission",
            ),
        ]
    }
    fn run(
        &self,
        env: &Env,
        _: &Options,
        wanted: &dyn Fn(&str) -> bool,
    ) -> Vec<(&'static str, SectionDoc)> {
        let mut out = Vec::new();
        if wanted("submit") {
            out.push((
                "submit",
                SectionDoc::Submit(Box::new(crate::submit::run(env))),
            ));
        }
        if wanted("submit-vfio") {
            out.push((
                "submit-vfio",
                SectionDoc::SubmitVfio(Box::new(crate::submit_vfio::run(env))),
            ));
        }
        out
    }
}

/// Every section, in the order a full run takes them.
pub static ALL: &[&dyn Section] = &[
    &HotPaths,
    &Probe,
    &Crosscheck,
    &Wake,
    &Noise,
    &Blk,
    &Submit,
    &Exits,
    &MemSetup,
    &Sandboxing,
    &Builds,
];

/// Whether `name` is a results-file section some [`Section`] writes.
pub fn known(name: &str) -> bool {
    ALL.iter()
        .any(|s| s.names().iter().any(|(n, _)| *n == name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_written_by_one_section_only() {
        let mut seen = std::collections::HashSet::new();
        for s in ALL {
            for (n, what) in s.names() {
                assert!(seen.insert(*n), "{n} twice");
                assert!(!what.is_empty());
            }
        }
        assert_eq!(seen.len(), 13);
        assert!(known("guest") && known("memsetup") && known("submit") && !known("gpu"));
        assert!(known("submit-vfio"));
    }
}
