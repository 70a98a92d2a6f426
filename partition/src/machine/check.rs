//! The launch's plan: every piece of user input validated and every choice made (the
//! cores, the memory layout, the idle plan, the CPU model, where each device goes, the
//! guest's command line, the sandbox's user) from the configuration and the host's facts
//! ([`HostFacts`], read before) alone. Nothing is opened or read here: the kernel, the
//! initrd, the disks, the console and the API socket's directory are what the plan names,
//! and opening them is the next step's (`machine/open.rs`). A unit test hands [`check`] a
//! made-up host. Its errors are the pipeline's one type, [`LaunchError`]
//! (`machine/error.rs`).

use std::path::PathBuf;

use boot::BootError;
use boot::layout::MemoryLayout;
use boot::regs::BootProtocol;
use pool::Backing;

use super::config::{CoreSelection, KernelSource, MemorySource, SandboxRequest, ValidConfig};
use super::error::LaunchError;
use super::facts::{HostFacts, HostMemory};
use crate::board::resources::MachinePlan;
use crate::board::spec::DeviceSpec;
use crate::config::cores;
use crate::cpu::cpumodel::CpuModel;
use crate::cpu::idle::IdlePlan;
use crate::sys::sandbox::Sandbox;

/// A launch planned: typed values only, every one checked. What the later steps need of
/// the launch they take from here, never from the configuration.
#[derive(Clone, Debug)]
pub struct Plan {
    /// vCPU i runs on `cores[i]`.
    pub(super) cores: Vec<usize>,
    /// With `--cores from-cgroup`: why the cgroup's cores count as exclusive.
    pub(super) cores_from: Option<String>,
    /// Guest memory's layout (its size among it).
    pub(super) layout: MemoryLayout,
    /// Where guest memory comes from.
    pub(super) source: MemorySource,
    /// The ledger's directory.
    pub(super) state_dir: PathBuf,
    pub(super) idle: IdlePlan,
    pub(super) cpu_model: CpuModel,
    /// The guest's command line, with what the CPU model, the idle policy and the disks
    /// add (the kernel's own limit is checked when it is opened).
    pub(super) cmdline: String,
    /// Where every device goes.
    pub(super) machine: MachinePlan,
    pub(super) sandbox: Sandbox,
    pub(super) kernel: KernelSource,
    pub(super) initrd: Option<PathBuf>,
    pub(super) protocol: BootProtocol,
    pub(super) ioeventfd: bool,
    /// Every device asked for, of every kind, in the order asked.
    pub(super) devices: Vec<DeviceSpec>,
    pub(super) api_socket: Option<PathBuf>,
    /// With `--memory-from`: the volume's directory, held open since the facts were read.
    pub(super) volume: Option<crate::host::volume::VolumeDir>,
}

impl Plan {
    /// Guest memory size.
    pub fn memory(&self) -> u64 {
        self.layout.size()
    }
    /// vCPU → core assignment.
    pub fn cores(&self) -> &[usize] {
        &self.cores
    }
    /// The idle plan in force.
    pub fn idle(&self) -> &IdlePlan {
        &self.idle
    }
    /// The guest's command line, with what the CPU model, the idle policy and the disks
    /// add.
    pub fn cmdline(&self) -> &str {
        &self.cmdline
    }
    /// The CPU model in force.
    pub fn cpu_model(&self) -> &CpuModel {
        &self.cpu_model
    }
    /// How the running VMM will be confined.
    pub fn sandbox(&self) -> &Sandbox {
        &self.sandbox
    }
    /// With `--cores from-cgroup`: why the cgroup's cores count as exclusive.
    pub fn cores_from(&self) -> Option<&str> {
        self.cores_from.as_deref()
    }
    /// Where the local API's socket goes, if anywhere.
    pub fn api_socket(&self) -> Option<&std::path::Path> {
        self.api_socket.as_deref()
    }
    /// The partition's name, for a launch from the reservation.
    pub fn name(&self) -> Option<&str> {
        match &self.source {
            MemorySource::Pool(req) => Some(&req.name),
            _ => None,
        }
    }
}

/// Validates everything the user gave against the host's facts (`cfg` kept its own rules
/// already), and plans the launch. Opens and reads nothing.
pub fn check(cfg: ValidConfig, host: &HostFacts) -> Result<Plan, LaunchError> {
    let cfg = cfg.into_inner();
    let (cores, cores_from) = match (&cfg.cores, &host.cgroup) {
        (CoreSelection::List(list), _) => (list.clone(), None),
        (CoreSelection::FromCgroup, Some(cg)) => {
            let (c, why) = cg.exclusive_cores()?;
            (c, Some(why))
        }
        (CoreSelection::FromCgroup, None) => return Err(LaunchError::Facts("no cgroup cores")),
    };
    cores::check_distinct(&cores)?;
    cores::check_available(&cores, &host.online)?;
    let sandbox = match (&cfg.sandbox, &host.identity) {
        (SandboxRequest::Off, _) => Sandbox::Off,
        (SandboxRequest::On { .. }, Some(who)) => Sandbox::On(who.clone()),
        (SandboxRequest::On { .. }, None) => {
            return Err(LaunchError::Facts("no sandbox user"));
        }
    };
    if cores.len() > boot::mptable::MAX_CPUS {
        return Err(BootError::Tables(format!(
            "{} vCPUs: at most {} are supported",
            cores.len(),
            boot::mptable::MAX_CPUS
        ))
        .into());
    }
    let layout = MemoryLayout::new(cfg.memory)?;
    match &cfg.source {
        MemorySource::Anonymous(backing) => {
            let page = backing.page_size() as u64;
            if cfg.memory % page != 0 {
                return Err(LaunchError::PageMultiple {
                    size: cfg.memory,
                    page: page as usize,
                    backing: *backing,
                });
            }
            if let Some((core, holder)) = &host.reserved {
                return Err(holder.refusal(*core).into());
            }
            check_host_memory(cfg.memory, *backing, &host.memory)?;
        }
        MemorySource::Pool(req) => crate::host::claim::check_name(&req.name)?,
        MemorySource::Volume(dir) => {
            let volume = host
                .volume
                .as_ref()
                .ok_or_else(|| crate::host::pod::PodError::NotHugetlbfs(dir.clone()))?;
            if let Some(no) = volume.refusal(cfg.memory) {
                return Err(no.into());
            }
            if let Some((core, holder)) = &host.reserved {
                return Err(holder.refusal(*core).into());
            }
        }
    }
    let idle = crate::cpu::idle::resolve(cfg.idle, &host.idle_caps)?;
    // The kinds every board has (the console) join those asked, after them: the host's
    // facts, read for those asked, stay in step.
    let devices = DeviceSpec::with_implied(cfg.devices);
    let machine = MachinePlan::new(
        layout.ram_ranges().len(),
        &DeviceSpec::asks(&devices, &host.devices),
        host.phys_bits,
    )?;
    let cpu_model = crate::cpu::cpumodel::resolve(cfg.cpu_model, host.kvm_pvm);
    // The CPU model's words go first, so the user's own can override them (see
    // `cpumodel::command_line` for `clearcpuid=`). The longest line any kernel takes
    // bounds it here; the kernel's own bound is checked once it is read.
    let cmdline = boot::compose_cmdline(
        &crate::cpu::cpumodel::command_line(&cpu_model, &cfg.cmdline),
        &[
            idle.cmdline,
            &crate::board::virtio_mmio::cmdline(&machine.virtio_mmio()),
        ],
        boot::layout::CMDLINE_MAX - 1,
    )?;
    Ok(Plan {
        cores,
        cores_from,
        layout,
        source: cfg.source,
        state_dir: cfg.state_dir,
        idle,
        cpu_model,
        cmdline,
        machine,
        sandbox,
        kernel: cfg.kernel,
        initrd: cfg.initrd,
        protocol: cfg.protocol,
        ioeventfd: cfg.ioeventfd,
        devices,
        api_socket: cfg.api_socket,
        volume: host.volume.clone(),
    })
}

/// Refuses guest memory the host cannot back before anything is built: more than the
/// host's memory (or, made up front, more than is available now), more than this process's
/// memory cgroup allows (the kernel would kill the VMM as the guest touched it), or with
/// `--backing hugetlb` more than the kernel's free hugepages.
fn check_host_memory(size: u64, backing: Backing, host: &HostMemory) -> Result<(), LaunchError> {
    use crate::config::size::format;
    let refuse = |why: String| Err(LaunchError::HostMemory(why));
    match backing {
        Backing::Hugetlb => {
            if let Some(free) = host.hugepages_free {
                if size > free {
                    return refuse(format!(
                        "{} of hugepages asked for, the kernel has {} free (--backing \
                         hugetlb takes them from its free pool: free more with `sysctl \
                         vm.nr_hugepages=N`, or launch from a reserved pool with --name)",
                        format(size),
                        format(free)
                    ));
                }
            }
            return Ok(());
        }
        Backing::AnonymousPopulated => {
            if let Some(avail) = host.available {
                if size > avail {
                    return refuse(format!(
                        "{} made up front (--backing prefault) is more than the {} this host \
                         has available",
                        format(size),
                        format(avail)
                    ));
                }
            }
        }
        Backing::Anonymous => {}
    }
    if let Some(total) = host.total {
        if size > total {
            return refuse(format!(
                "{} is more than this host's {} of memory",
                format(size),
                format(total)
            ));
        }
    }
    if let Some((limit, cg)) = &host.cgroup_limit {
        if size > *limit {
            return refuse(format!(
                "{} is more than the {} this process's memory cgroup ({}) allows: the \
                 kernel would kill the VMM as the guest touched it",
                format(size),
                format(*limit),
                cg.display()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::board::kind::DeviceFacts;
    use crate::cpu::idle::{DisableExits, IdleCaps, IdlePolicy};
    use crate::host::claim::{ClaimError, CoreHolder};
    use crate::machine::config::LaunchConfig;
    use crate::machine::config::PoolRequest;
    use devices::pci::passthrough::PhysicalBar;
    use devices::virtio::block::BlockConfig;

    /// A made-up host: 4 cores, 8 GiB (4 available, 64 MiB of free hugepages), KVM offering
    /// every idle exit off, not nested.
    fn host() -> HostFacts {
        HostFacts {
            online: vec![0, 1, 2, 3],
            cgroup: None,
            identity: None,
            memory: HostMemory {
                total: Some(8 << 30),
                available: Some(4 << 30),
                hugepages_free: Some(64 << 20),
                cgroup_limit: None,
            },
            reserved: None,
            volume: None,
            idle_caps: IdleCaps {
                disable_exits: DisableExits::all(),
                halt_poll: true,
                host_mwait: true,
                host_halt_poll_ns: Some(200_000),
                hlt_exits_ignored: false,
            },
            kvm_pvm: false,
            phys_bits: 48,
            devices: Vec::new(),
        }
    }

    /// Names a kernel, an initrd and a disk that do not exist: the plan opens none of them
    /// (the console, implied on stdout, is a device like the disk).
    fn config() -> LaunchConfig {
        LaunchConfig {
            cores: CoreSelection::List(vec![2, 3]),
            memory: 64 << 20,
            kernel: KernelSource::Path("/nonexistent/vmlinux".into()),
            initrd: Some("/nonexistent/initrd".into()),
            idle: IdlePolicy::Auto,
            devices: vec![DeviceSpec::Disk(BlockConfig::new(
                "/nonexistent/disk.img".into(),
                "d0".into(),
            ))],
            ..crate::machine::config::tests::cfg()
        }
    }

    /// The configuration's own rules, then the plan.
    fn planned(cfg: LaunchConfig, host: &HostFacts) -> Result<Plan, LaunchError> {
        check(ValidConfig::try_from(cfg)?, host)
    }

    fn refused(cfg: LaunchConfig, host: &HostFacts) -> LaunchError {
        match planned(cfg, host) {
            Ok(_) => panic!("check accepted it"),
            Err(e) => e,
        }
    }

    #[test]
    fn a_plan_is_made_from_the_configuration_and_the_facts_alone() {
        let plan = planned(config(), &host()).unwrap();
        assert_eq!(plan.cores(), &[2, 3]);
        // The console, asked for by nobody, is on the board: COM1 at its ISA ports.
        let isa: Vec<&str> = plan.machine.isa().iter().map(|d| d.name).collect();
        assert_eq!(isa, ["COM1"]);
        assert_eq!(plan.memory(), 64 << 20);
        assert_eq!(plan.idle().policy, IdlePolicy::Mwait);
        assert_eq!(plan.cpu_model().name, "host");
        assert_eq!(plan.machine.virtio_mmio().len(), 1);
        assert!(
            plan.cmdline().contains(&crate::board::virtio_mmio::cmdline(
                &plan.machine.virtio_mmio()
            )),
            "{}",
            plan.cmdline()
        );
        // The next step opens what it names, and there the missing kernel is found.
        let e = match super::super::open::open(plan) {
            Ok(_) => panic!("a kernel that does not exist was opened"),
            Err(e) => e,
        };
        assert!(
            matches!(
                e,
                LaunchError::Path {
                    what: "--kernel",
                    ..
                }
            ) && e.is_usage(),
            "{e}"
        );
        // The same configuration on the nested host: the nested-safe CPU model.
        let nested = HostFacts {
            kvm_pvm: true,
            ..host()
        };
        assert_eq!(
            planned(config(), &nested).unwrap().cpu_model().name,
            "nested-safe"
        );
    }

    #[test]
    fn the_plan_refuses_what_the_host_cannot_give() {
        let e = refused(
            LaunchConfig {
                cores: CoreSelection::List(vec![3, 9]),
                ..config()
            },
            &host(),
        );
        assert!(
            matches!(e, LaunchError::Cores(_)) && e.to_string().contains("9"),
            "{e}"
        );
        let e = refused(
            LaunchConfig {
                cores: CoreSelection::List(vec![1, 1]),
                ..config()
            },
            &host(),
        );
        assert!(matches!(e, LaunchError::Cores(_)) && e.is_usage(), "{e}");
        // 9 MiB of 2 MiB pages.
        let e = refused(
            LaunchConfig {
                memory: 9 << 20,
                source: MemorySource::Anonymous(Backing::Hugetlb),
                ..config()
            },
            &host(),
        );
        assert!(
            matches!(e, LaunchError::PageMultiple { .. }) && e.is_usage(),
            "{e}"
        );
        // More hugepages than are free; more than the host has; more than the cgroup allows.
        let e = refused(
            LaunchConfig {
                memory: 128 << 20,
                source: MemorySource::Anonymous(Backing::Hugetlb),
                ..config()
            },
            &host(),
        );
        assert!(
            matches!(&e, LaunchError::HostMemory(w) if w.contains("64 MiB free")),
            "{e}"
        );
        let e = refused(
            LaunchConfig {
                memory: 16 << 30,
                ..config()
            },
            &host(),
        );
        assert!(
            matches!(e, LaunchError::HostMemory(_)) && e.is_usage(),
            "{e}"
        );
        let mut capped = host();
        capped.memory.cgroup_limit = Some((32 << 20, "/sys/fs/cgroup/pod".into()));
        let e = refused(config(), &capped);
        assert!(e.to_string().contains("/sys/fs/cgroup/pod"), "{e}");
        // A core a reservation holds, outside the reservation.
        let mut held = host();
        held.reserved = Some((3, CoreHolder::Ledger));
        let e = refused(config(), &held);
        assert!(
            matches!(&e, LaunchError::Reservation(w) if w.contains("core 3")),
            "{e}"
        );
        // The mwait policy where KVM cannot disable MWAIT exits.
        let mut no_mwait = host();
        no_mwait.idle_caps.disable_exits = DisableExits::HLT;
        let e = refused(
            LaunchConfig {
                idle: IdlePolicy::Mwait,
                ..config()
            },
            &no_mwait,
        );
        assert!(matches!(e, LaunchError::Idle(_)) && e.is_usage(), "{e}");
        // A 512 GiB BAR past a 39-bit guest address width.
        let gpu = DeviceFacts {
            bars: Some(vec![PhysicalBar {
                index: 2,
                size: 512 << 30,
                io: false,
                is64: true,
                prefetchable: true,
                mmap: true,
            }]),
        };
        let narrow = HostFacts {
            devices: vec![DeviceFacts::default(), gpu],
            phys_bits: 39,
            ..host()
        };
        let e = refused(
            LaunchConfig {
                devices: [
                    config().devices,
                    vec![crate::board::spec::parse_device("vfio=0000:41:00.0").unwrap()],
                ]
                .concat(),
                ..config()
            },
            &narrow,
        );
        assert!(
            matches!(e, LaunchError::Resources(_)) && e.to_string().contains("0000:41:00.0"),
            "{e}"
        );
        // A pool launch's name is checked with the rest of the input.
        let e = refused(
            LaunchConfig {
                source: MemorySource::Pool(PoolRequest {
                    name: "-bad".into(),
                    offset: None,
                }),
                ..config()
            },
            &host(),
        );
        assert!(
            matches!(e, LaunchError::Reservation(_)) && e.is_usage(),
            "{e}"
        );
        // A command line no kernel takes.
        let e = refused(
            LaunchConfig {
                cmdline: "x".repeat(boot::layout::CMDLINE_MAX),
                ..config()
            },
            &host(),
        );
        assert!(matches!(e, LaunchError::Boot(_)) && e.is_usage(), "{e}");
    }

    #[test]
    fn facts_read_for_another_configuration_are_the_callers_fault() {
        let e = refused(
            LaunchConfig {
                cores: CoreSelection::FromCgroup,
                ..config()
            },
            &host(),
        );
        assert!(matches!(e, LaunchError::Facts(_)) && !e.is_usage(), "{e}");
        let e = refused(
            LaunchConfig {
                sandbox: SandboxRequest::On {
                    uid: None,
                    gid: None,
                },
                ..config()
            },
            &host(),
        );
        assert!(matches!(e, LaunchError::Facts(_)), "{e}");
        // From the cgroup: planned on its cores when the kubelet's checkpoint grants them;
        // refused (a usage error, nothing opened) when it does not, or from the root.
        let cgroup = crate::host::pod::CgroupCpuset {
            dir: "/sys/fs/cgroup/kubepods/pod1/c1".into(),
            v2: true,
            cores: vec![1],
            root: false,
            cpu_exclusive: false,
            partition: "member".into(),
            kubelet: Some(("/var/lib/kubelet/cpu_manager_state".into(), Ok(()))),
        };
        let from_cgroup = |cg: &crate::host::pod::CgroupCpuset| {
            planned(
                LaunchConfig {
                    cores: CoreSelection::FromCgroup,
                    ..config()
                },
                &HostFacts {
                    cgroup: Some(cg.clone()),
                    ..host()
                },
            )
        };
        let on_cgroup = from_cgroup(&cgroup).unwrap();
        assert_eq!(on_cgroup.cores(), &[1][..]);
        assert!(
            on_cgroup
                .cores_from()
                .is_some_and(|w| w.contains("the kubelet's static CPU manager")),
            "{:?}",
            on_cgroup.cores_from()
        );
        for bad in [
            crate::host::pod::CgroupCpuset {
                kubelet: Some(("/k".into(), Err("core 1 is in the shared pool".into()))),
                ..cgroup.clone()
            },
            crate::host::pod::CgroupCpuset {
                kubelet: None,
                ..cgroup.clone()
            },
            crate::host::pod::CgroupCpuset {
                root: true,
                ..cgroup.clone()
            },
        ] {
            match from_cgroup(&bad) {
                Err(e @ LaunchError::Pod(_)) => assert!(e.is_usage(), "{e}"),
                other => panic!("{bad:?}: {:?}", other.map(|p| p.cores().to_vec())),
            }
        }
        // A v2 isolated partition needs no checkpoint.
        let isolated = crate::host::pod::CgroupCpuset {
            partition: "isolated".into(),
            kubelet: None,
            ..cgroup
        };
        assert!(
            from_cgroup(&isolated)
                .unwrap()
                .cores_from()
                .is_some_and(|w| w.contains("isolated partition"))
        );
    }

    #[test]
    fn claim_errors_keep_their_meaning() {
        let e: LaunchError = ClaimError::Refused("core 3 belongs to partition \"a\"".into()).into();
        assert!(e.is_usage(), "{e}");
        assert!(e.to_string().contains("core 3"));
        let e: LaunchError = ClaimError::Ledger(crate::host::ledger::LedgerError::Io {
            path: "/x".into(),
            what: "reading",
            source: std::io::Error::other("disk on fire"),
        })
        .into();
        assert!(!e.is_usage(), "{e}");
    }
}
