//! Confining a launch before its threads start: one seccomp filter per thread role, each
//! call that names a descriptor tied to the descriptors it may name (a vCPU's ioctls to its
//! own vCPU, the VM ioctls of PCI to the VM, pread64 to KVM's statistics, ...), the SIGSYS
//! handler, and giving up root. The devices' threads install their role's filter
//! themselves (`crate::board::device::Device::start`).
//!
//! The same [`grants`] make the filters and docs/security.md's table ([`table`]; a test
//! fails when the two differ).

use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use super::error::LaunchError;
use crate::board::device::DeviceFds;
use crate::sys::sandbox::Sandbox;
use crate::sys::seccomp::{Fds, Grants, IoctlGrant, Role};

/// The descriptors a confined launch's threads are tied to, read off the built machine.
#[derive(Clone, Debug, Default)]
pub(super) struct Descriptors {
    /// The VM.
    pub(super) vm: RawFd,
    /// Each vCPU, in order.
    pub(super) vcpus: Vec<RawFd>,
    /// KVM's statistics (each vCPU's), which the launcher and the API read.
    pub(super) stats: Vec<RawFd>,
    /// Each vCPU's own statistics, which its thread reads at the guest's marks.
    pub(super) vcpu_stats: Vec<Option<RawFd>>,
    /// What the devices' threads and the vCPUs' calls on them name (every kind's,
    /// `crate::board::device::Device::fds`).
    pub(super) devices: DeviceFds,
}

/// What `role`'s calls may name, given the machine's descriptors (`vcpu`: which vCPU, for
/// [`Role::VCPU`]): the launch's own roles' grants here, a device kind's role's from its
/// devices ([`DeviceFds::granted`]).
pub(super) fn grants(role: Role, d: &Descriptors, vcpu: usize) -> Grants {
    let fds = |what, fds: Vec<RawFd>| Fds { what, fds };
    let mut g = Grants::default();
    if role == Role::VCPU {
        g.ioctls.push(IoctlGrant {
            on: fds(
                "its own vCPU's descriptor",
                d.vcpus.get(vcpu).copied().into_iter().collect(),
            ),
            requests: crate::kvm::vcpu_thread_ioctls(),
        });
        if d.devices.pci {
            g.ioctls.push(IoctlGrant {
                on: fds("the VM's descriptor, with a PCI function", vec![d.vm]),
                requests: crate::kvm::vm_device_ioctls(),
            });
        }
        let own_stats: Vec<RawFd> = d
            .vcpu_stats
            .get(vcpu)
            .copied()
            .flatten()
            .into_iter()
            .collect();
        match d.devices.vcpu_regions.is_empty() {
            false => {
                let mut read = own_stats;
                read.extend(&d.devices.vcpu_regions);
                g.pread = Some(fds(
                    "its own KVM statistics (at the guest's marks) and, with passed-through \
                         functions, the VFIO devices' descriptors",
                    read,
                ));
                g.pwrite = Some(fds(
                    "the VFIO devices' descriptors, with passed-through functions",
                    d.devices.vcpu_regions.clone(),
                ));
            }
            true => {
                g.pread = Some(fds(
                    "its own KVM statistics (at the guest's marks) and, with a passed-through \
                         function, the VFIO device's descriptor",
                    own_stats,
                ));
            }
        }
    } else if role == Role::MAIN {
        let mut v = d.stats.clone();
        v.extend(&d.devices.irq_counts);
        g.pread = Some(fds(
            "KVM's statistics and a passed-through function's interrupt counters",
            v,
        ));
    } else if role == Role::API {
        g.pread = Some(fds("KVM's statistics", d.stats.clone()));
    }
    // A kind's own threads' calls on its own descriptors.
    g.merge(&d.devices.granted(role));
    g
}

/// The seccomp filters of a confined launch, compiled before privileges are dropped.
pub(super) struct Filters {
    /// One per vCPU (each names its own descriptor).
    pub(super) vcpu: Vec<Arc<seccompiler::BpfProgram>>,
    pub(super) api: Arc<seccompiler::BpfProgram>,
    pub(super) main: seccompiler::BpfProgram,
    /// Every device kind's thread roles' (`crate::board::spec::thread_roles`).
    pub(super) devices: Vec<(Role, Arc<seccompiler::BpfProgram>)>,
}

impl Filters {
    /// The filter of a device thread's role (`crate::board::device::FilterOf`).
    pub(super) fn of(&self, role: Role) -> Option<Arc<seccompiler::BpfProgram>> {
        self.devices
            .iter()
            .find(|(r, _)| *r == role)
            .map(|(_, f)| f.clone())
    }
}

/// Gives up root: compiles every thread's filter for the machine's descriptors `d`,
/// installs the SIGSYS handler and becomes the sandbox's user. Called once everything that
/// needs root exists and before any thread is started but the vCPU threads' seats (which
/// confirm the drop themselves when handed their vCPUs); `None` with `--no-sandbox`.
pub(super) fn confine(sandbox: &Sandbox, d: &Descriptors) -> Result<Option<Filters>, LaunchError> {
    let Sandbox::On(who) = sandbox else {
        return Ok(None);
    };
    let one = |role| crate::sys::seccomp::filter(role, &grants(role, d, 0)).map(Arc::new);
    let f = Filters {
        vcpu: (0..d.vcpus.len())
            .map(|i| {
                crate::sys::seccomp::filter(Role::VCPU, &grants(Role::VCPU, d, i)).map(Arc::new)
            })
            .collect::<Result<_, _>>()?,
        api: one(Role::API)?,
        main: crate::sys::seccomp::filter(Role::MAIN, &grants(Role::MAIN, d, 0))?,
        devices: crate::board::spec::thread_roles()
            .into_iter()
            .map(|role| Ok((role, one(role)?)))
            .collect::<Result<_, crate::sys::seccomp::SeccompError>>()?,
    };
    crate::sys::seccomp::install_violation_handler()?;
    crate::sys::timeline::mark("filters");
    crate::sys::sandbox::empty_root()?;
    crate::sys::timeline::mark("private_root");
    crate::sys::sandbox::drop_privileges(who)?;
    Ok(Some(f))
}

/// docs/security.md's table of the filters, generated from [`grants`] for a machine whose
/// devices name `devices` (every kind of device, placeholder descriptors: the conditions
/// are what the table shows; `machine::devices::security_table`).
pub(super) fn table(devices: DeviceFds) -> String {
    let d = Descriptors {
        vm: 3,
        vcpus: vec![4],
        stats: vec![5],
        vcpu_stats: vec![Some(5)],
        devices,
    };
    let mut roles = vec![Role::VCPU];
    roles.extend(crate::board::spec::thread_roles());
    roles.extend([Role::API, Role::MAIN, Role::KEEPER]);
    let mut out = String::from("| thread | may call, beyond the common set* |\n|---|---|\n");
    for role in roles {
        out.push_str(&format!(
            "| {} | {} |\n",
            role.thread,
            crate::sys::seccomp::describe(role, &grants(role, &d, 0))
        ));
    }
    out.push_str(&format!(
        "\n\\* The common set, every thread: {}.\n",
        crate::sys::seccomp::describe_common()
    ));
    out
}

/// The descriptor of anything that has one (for [`Descriptors`]).
pub(super) fn raw(f: &impl AsRawFd) -> RawFd {
    f.as_raw_fd()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device kind's thread role, and another's.
    const KIND_THREAD: Role = Role {
        name: "kind",
        thread: "`kind`",
        calls: &[],
    };
    const OTHER_KIND_THREAD: Role = Role {
        name: "other",
        thread: "`other`",
        calls: &[],
    };

    #[test]
    fn each_thread_names_only_its_own_descriptors() {
        let d = Descriptors {
            vm: 10,
            vcpus: vec![11, 12],
            stats: vec![13, 14],
            vcpu_stats: vec![Some(13), Some(14)],
            devices: DeviceFds {
                irq_counts: vec![15],
                pci: false,
                vcpu_regions: Vec::new(),
                roles: Vec::new(),
            },
        };
        // vCPU 1's ioctls name descriptor 12 only; no VM ioctl without a PCI function; it
        // reads its own statistics (14) and nothing else, and writes nothing, without
        // passthrough.
        let g = grants(Role::VCPU, &d, 1);
        assert_eq!(g.ioctls.len(), 1);
        assert_eq!(g.ioctls[0].on.fds, vec![12]);
        assert_eq!(g.pread.as_ref().unwrap().fds, vec![14]);
        assert!(g.pwrite.is_none());
        let g = grants(
            Role::VCPU,
            &Descriptors {
                devices: DeviceFds {
                    pci: true,
                    vcpu_regions: vec![20],
                    ..d.devices.clone()
                },
                ..d.clone()
            },
            0,
        );
        assert_eq!(g.ioctls[1].on.fds, vec![10]);
        assert_eq!(g.pread.as_ref().unwrap().fds, vec![13, 20]);
        assert_eq!(g.pwrite.as_ref().unwrap().fds, vec![20]);
        // The launcher reads statistics and counters, the API statistics only.
        assert_eq!(
            grants(Role::MAIN, &d, 0).pread.unwrap().fds,
            vec![13, 14, 15]
        );
        assert_eq!(grants(Role::API, &d, 0).pread.unwrap().fds, vec![13, 14]);
        // A kind's own role's ioctls go to that role alone, on the kind's descriptors.
        assert!(grants(Role::MAIN, &d, 0).ioctls.is_empty());
        assert!(grants(KIND_THREAD, &d, 0).ioctls.is_empty());
        let own = IoctlGrant {
            on: Fds {
                what: "a kind's descriptor",
                fds: vec![20],
            },
            requests: vec![("AN_IOCTL", 0x3b6a)],
        };
        let with = Descriptors {
            devices: DeviceFds {
                roles: vec![(
                    KIND_THREAD,
                    Grants {
                        ioctls: vec![own],
                        pwrite: Some(Fds {
                            what: "a kind's descriptor",
                            fds: vec![21],
                        }),
                        ..Grants::default()
                    },
                )],
                ..d.devices.clone()
            },
            ..d
        };
        let g = grants(KIND_THREAD, &with, 0);
        assert_eq!(g.pwrite.unwrap().fds, vec![21]);
        assert_eq!(
            g.ioctls
                .iter()
                .map(|i| i.on.fds.clone())
                .collect::<Vec<_>>(),
            vec![vec![20]]
        );
        for role in [Role::VCPU, Role::MAIN, Role::API, OTHER_KIND_THREAD] {
            assert!(
                grants(role, &with, 0)
                    .ioctls
                    .iter()
                    .all(|i| i.on.fds != vec![20]),
                "{role:?}"
            );
        }
    }

    #[test]
    fn every_thread_role_has_a_name_of_its_own_and_a_filter() {
        // The launch's roles and every kind's (the list's `Kind::THREADS`): a filter each,
        // found by its role, and no two with one name (the name is what a SIGSYS message
        // and the test hook go by).
        let kinds = crate::board::spec::thread_roles();
        assert!(kinds.len() >= 3, "{kinds:?}");
        let mut names: Vec<&str> = [Role::VCPU, Role::API, Role::MAIN, Role::KEEPER]
            .iter()
            .chain(&kinds)
            .map(|r| r.name)
            .collect();
        let all = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all, "{names:?}");
        let d = Descriptors {
            vcpus: vec![4],
            stats: vec![5],
            vcpu_stats: vec![None],
            devices: crate::board::spec::example_fds(),
            ..Descriptors::default()
        };
        let f = Filters {
            vcpu: Vec::new(),
            api: Arc::new(Vec::new()),
            main: Vec::new(),
            devices: kinds
                .iter()
                .map(|&r| {
                    let p = crate::sys::seccomp::filter(r, &grants(r, &d, 0)).unwrap();
                    (r, Arc::new(p))
                })
                .collect(),
        };
        for r in &kinds {
            assert!(f.of(*r).is_some_and(|p| !p.is_empty()), "{r:?}");
        }
        assert!(f.of(Role::MAIN).is_none());
    }
}
