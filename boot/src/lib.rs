//! Everything a guest finds in memory at its first instruction, and the registers it finds
//! them with.
//!
//! `boot` writes guest structures and returns register state; it never talks to KVM.
//! The pure parts ([`layout`], [`e820`], [`gdt`], [`mptable`], [`acpi`]) build without
//! `std` (`--no-default-features`); loading kernels and writing guest memory need it.
#![cfg_attr(not(feature = "std"), no_std)]

pub mod acpi;
pub mod e820;
pub mod gdt;
pub mod layout;
pub mod mptable;

#[cfg(feature = "std")]
pub mod extract;
#[cfg(feature = "std")]
#[doc(hidden)]
pub mod fuzzing;
#[cfg(feature = "std")]
pub mod kernel;
#[cfg(feature = "std")]
pub mod paging;
#[cfg(feature = "std")]
pub mod params;
#[cfg(feature = "std")]
pub mod regs;

#[cfg(feature = "std")]
pub use setup::*;

#[cfg(feature = "std")]
mod setup {
    use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

    use crate::e820::{self, E820Entry};
    use crate::kernel::{KernelError, KernelImage, LoadedKernel};
    use crate::layout::{self, HIMEM_START, MemoryLayout, PAGE_SIZE};
    use crate::params::{self, LinuxParams};
    use crate::regs::{BootProtocol, EntryState};
    use crate::{acpi, gdt, mptable, paging};

    /// Errors building a guest's boot state.
    #[derive(Debug, thiserror::Error)]
    pub enum BootError {
        /// The kernel image was refused.
        #[error(transparent)]
        Kernel(#[from] KernelError),
        /// The command line was refused.
        #[error("command line: {0}")]
        Cmdline(String),
        /// The initrd does not fit.
        #[error(
            "initrd of {size} bytes does not fit between the kernel end ({kernel_end:#x}) and {limit:#x}"
        )]
        InitrdDoesNotFit {
            /// Initrd size.
            size: u64,
            /// End of the kernel.
            kernel_end: u64,
            /// Highest end address allowed.
            limit: u64,
        },
        /// The vCPU count cannot be described.
        #[error("{0}")]
        Tables(String),
        /// The kernel cannot be entered with the protocol asked for.
        #[error("kernel has no 64-bit Linux entry point")]
        No64BitEntry,
        /// Writing guest memory failed (a layout bug, never guest input).
        #[error("writing {what} at {addr:#x}: {source}")]
        GuestMemory {
            /// What was being written.
            what: &'static str,
            /// Where.
            addr: u64,
            /// Why.
            source: vm_memory::GuestMemoryError,
        },
    }

    /// What to boot.
    #[derive(Clone, Copy, Debug)]
    pub struct BootConfig<'a> {
        /// The kernel.
        pub kernel: &'a KernelImage,
        /// Initial ramdisk contents.
        pub initrd: Option<&'a [u8]>,
        /// Kernel command line.
        pub cmdline: &'a str,
        /// Number of vCPUs (APIC IDs 0..cpus).
        pub cpus: usize,
        /// Entry protocol.
        pub protocol: BootProtocol,
        /// virtio-mmio devices, described in the ACPI DSDT.
        pub virtio_mmio: &'a [acpi::MmioDevice],
        /// Legacy port-I/O devices, described in the ACPI DSDT.
        pub isa: &'a [acpi::IsaDevice],
        /// The power device's sleep control port (the FADT's sleep control register).
        pub sleep_port: u16,
        /// A PCI host bridge (MCFG, `PNP0A08`, ECAM reserved in e820), when there is PCI.
        pub pci: Option<acpi::PciHostBridge>,
        /// Guest memory holds only zeros (fresh from the kernel, or a pool extent, which is
        /// scrubbed when it is given back): an ELF segment's bss is then not written, as
        /// linux-loader leaves it. Otherwise it is zeroed here.
        pub memory_zeroed: bool,
    }

    /// What was built, for the VMM to report and to load into the boot vCPU.
    #[derive(Clone, Debug)]
    pub struct BootInfo {
        /// Boot vCPU registers.
        pub entry: EntryState,
        /// Entry point used.
        pub entry_addr: u64,
        /// Where the kernel went.
        pub kernel: LoadedKernel,
        /// Where the initrd went (address, size).
        pub initrd: Option<(u64, u64)>,
        /// The memory map handed to the guest.
        pub e820: Vec<E820Entry>,
        /// Guest address of the ACPI RSDP.
        pub rsdp: u64,
        /// Guest address of the MP floating pointer.
        pub mptable: u64,
    }

    fn write<M: GuestMemoryBackend>(
        mem: &M,
        what: &'static str,
        addr: u64,
        bytes: &[u8],
    ) -> Result<(), BootError> {
        mem.write_slice(bytes, GuestAddress(addr))
            .map_err(|source| BootError::GuestMemory { what, addr, source })
    }

    fn cmdline_error(e: linux_loader::cmdline::Error, len: usize, max: usize) -> BootError {
        use linux_loader::cmdline::Error as E;
        BootError::Cmdline(match e {
            E::TooLarge => format!("{len} bytes long; the kernel accepts at most {max}"),
            E::InvalidAscii => {
                "contains a control character or one that is not printable ASCII".into()
            }
            other => other.to_string(),
        })
    }

    /// Checks a command line with linux-loader's `Cmdline`: printable ASCII only, and
    /// short enough for the kernel (`max` bytes without the terminating NUL).
    pub fn check_cmdline(cmdline: &str, max: usize) -> Result<(), BootError> {
        let mut c = linux_loader::cmdline::Cmdline::new(max.saturating_add(1))
            .map_err(|e| cmdline_error(e, cmdline.len(), max))?;
        c.insert_str(cmdline)
            .map_err(|e| cmdline_error(e, cmdline.len(), max))
    }

    /// The kernel command line a VMM gives: `first` (the words it puts before the user's,
    /// so the user's can override them, and the user's own line), then `ours` (words the
    /// VMM adds for its devices and policies), built with linux-loader's `Cmdline`. What
    /// `first` has after ` -- ` is for init and stays last, so the VMM's words are never
    /// passed to init by mistake. At most `max` bytes (without the NUL).
    pub fn compose_cmdline(first: &str, ours: &[&str], max: usize) -> Result<String, BootError> {
        let (kernel, init) = match first.split_once(" -- ") {
            Some((k, i)) => (k, Some(i)),
            None => (first, None),
        };
        let total = first.len() + ours.iter().map(|w| w.len() + 1).sum::<usize>();
        let err = |e| cmdline_error(e, total, max);
        let mut c = linux_loader::cmdline::Cmdline::new(max.saturating_add(1)).map_err(err)?;
        for part in std::iter::once(kernel).chain(ours.iter().copied()) {
            if !part.trim().is_empty() {
                c.insert_str(part).map_err(err)?;
            }
        }
        if let Some(i) = init.filter(|i| !i.trim().is_empty()) {
            c.insert_init_args(i).map_err(err)?;
        }
        let line = c.as_cstring().map_err(err)?;
        Ok(line.to_string_lossy().into_owned())
    }

    /// Where the initrd goes: page-aligned, as high as allowed, above the kernel.
    pub fn place_initrd(
        layout: &MemoryLayout,
        kernel_end: u64,
        size: u64,
        addr_max: u64,
    ) -> Result<u64, BootError> {
        let limit = layout.low_end().min(addr_max.saturating_add(1));
        let err = BootError::InitrdDoesNotFit {
            size,
            kernel_end,
            limit,
        };
        let start = limit.checked_sub(size).ok_or(err)? & !(PAGE_SIZE - 1);
        let floor = kernel_end.max(HIMEM_START).next_multiple_of(PAGE_SIZE);
        if start < floor || size == 0 {
            return Err(BootError::InitrdDoesNotFit {
                size,
                kernel_end,
                limit,
            });
        }
        Ok(start)
    }

    /// Loads the kernel and initrd and writes every boot structure into `mem`.
    ///
    /// Checks come first (cmdline, fit, protocol), so a refused boot writes nothing.
    pub fn setup<M: GuestMemoryBackend>(
        mem: &M,
        layout: &MemoryLayout,
        cfg: &BootConfig<'_>,
    ) -> Result<BootInfo, BootError> {
        check_cmdline(cfg.cmdline, cfg.kernel.cmdline_max())?;
        cfg.kernel.check_fits(layout)?;
        if cfg.protocol == BootProtocol::Pvh && !cfg.kernel.has_pvh() {
            return Err(KernelError::NoPvhEntry.into());
        }
        if cfg.cpus == 0 || cfg.cpus > mptable::MAX_CPUS {
            return Err(BootError::Tables(format!(
                "{} vCPUs: between 1 and {} are supported",
                cfg.cpus,
                mptable::MAX_CPUS
            )));
        }
        let (_, kernel_end) = cfg.kernel.footprint();
        let initrd_addr_max = match cfg.kernel.kind() {
            crate::kernel::KernelKind::BzImage {
                initrd_addr_max, ..
            } => *initrd_addr_max,
            crate::kernel::KernelKind::Elf { .. } => layout::MMIO_HOLE_START - 1,
        };
        let initrd_addr = match cfg.initrd {
            Some(rd) => Some(place_initrd(
                layout,
                kernel_end,
                rd.len() as u64,
                initrd_addr_max,
            )?),
            None => None,
        };

        let kernel = cfg.kernel.load(mem, cfg.memory_zeroed)?;
        let initrd = match (cfg.initrd, initrd_addr) {
            (Some(rd), Some(addr)) => {
                write(mem, "initrd", addr, rd)?;
                Some((addr, rd.len() as u64))
            }
            _ => None,
        };

        let mut cmdline = cfg.cmdline.as_bytes().to_vec();
        cmdline.push(0);
        write(mem, "command line", layout::CMDLINE_ADDR, &cmdline)?;

        // GDT, TSS and identity page tables.
        let gdt_bytes: Vec<u8> = gdt::boot_gdt()
            .iter()
            .flat_map(|e| e.to_le_bytes())
            .collect();
        write(mem, "GDT", layout::GDT_ADDR, &gdt_bytes)?;
        write(mem, "TSS", layout::TSS_ADDR, &[0u8; 0x68])?;
        for (addr, page) in paging::identity_tables() {
            let bytes: Vec<u8> = page.iter().flat_map(|e| e.to_le_bytes()).collect();
            write(mem, "page table", addr, &bytes)?;
        }

        // Firmware-style tables: MP table and ACPI.
        let mut buf = vec![0u8; layout::MPTABLE_MAX];
        let n = mptable::write(&mut buf, layout::MPTABLE_ADDR, cfg.cpus)
            .map_err(|e| BootError::Tables(e.to_string()))?;
        write(mem, "MP table", layout::MPTABLE_ADDR, &buf[..n])?;
        let mut buf = vec![0u8; layout::ACPI_MAX];
        let acpi_cfg = acpi::AcpiConfig {
            cpus: cfg.cpus,
            virtio_mmio: cfg.virtio_mmio,
            isa: cfg.isa,
            sleep_port: cfg.sleep_port,
            pci: cfg.pci,
        };
        let n = acpi::write(&mut buf, layout::ACPI_ADDR, &acpi_cfg)
            .map_err(|e| BootError::Tables(e.to_string()))?;
        write(mem, "ACPI tables", layout::ACPI_ADDR, &buf[..n])?;

        let reserved: Vec<(u64, u64)> = cfg
            .pci
            .iter()
            .map(|p| (p.ecam_base, layout::PCI_ECAM_SIZE))
            .collect();
        let e820: Vec<E820Entry> = e820::build_with(layout, &reserved)
            .map_err(|e| BootError::Tables(e.to_string()))?
            .to_vec();
        let entry_addr = match cfg.protocol {
            BootProtocol::Linux64 => {
                let bp = params::linux_boot_params(&LinuxParams {
                    setup_header: kernel.setup_header,
                    cmdline_addr: layout::CMDLINE_ADDR,
                    cmdline_len: cfg.cmdline.len(),
                    initrd,
                    e820: &e820,
                    rsdp: layout::ACPI_ADDR,
                });
                mem.write_obj(bp, GuestAddress(layout::ZERO_PAGE_ADDR))
                    .map_err(|source| BootError::GuestMemory {
                        what: "zero page",
                        addr: layout::ZERO_PAGE_ADDR,
                        source,
                    })?;
                kernel.entry64.ok_or(BootError::No64BitEntry)?
            }
            BootProtocol::Pvh => {
                let modlist_addr = layout::PVH_MEMMAP_ADDR + 24 * e820.len() as u64;
                let info = params::pvh_start_info(
                    layout::CMDLINE_ADDR,
                    &e820,
                    layout::ACPI_ADDR,
                    initrd,
                    layout::PVH_MEMMAP_ADDR,
                    modlist_addr,
                );
                write(
                    mem,
                    "PVH start info",
                    layout::PVH_INFO_ADDR,
                    &info.start_info_bytes(),
                )?;
                write(
                    mem,
                    "PVH memory map",
                    layout::PVH_MEMMAP_ADDR,
                    &info.memmap_bytes(),
                )?;
                write(mem, "PVH module list", modlist_addr, &info.modlist_bytes())?;
                // has_pvh() was checked above.
                kernel.pvh_entry.ok_or(KernelError::NoPvhEntry)?
            }
        };

        Ok(BootInfo {
            entry: EntryState::new(cfg.protocol, entry_addr),
            entry_addr,
            kernel,
            initrd,
            e820,
            rsdp: layout::ACPI_ADDR,
            mptable: layout::MPTABLE_ADDR,
        })
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use crate::kernel::tests::{tiny_bzimage, tiny_elf};
        use linux_loader::bootparam::boot_params;
        use vm_memory::GuestMemoryMmap;

        fn guest(size: u64) -> (MemoryLayout, GuestMemoryMmap) {
            let layout = MemoryLayout::new(size).unwrap();
            let ranges: Vec<_> = layout
                .ram_ranges()
                .iter()
                .map(|r| (GuestAddress(r.guest_addr), r.len as usize))
                .collect();
            (layout, GuestMemoryMmap::from_ranges(&ranges).unwrap())
        }

        #[test]
        fn elf_linux64_end_to_end() {
            let (layout, mem) = guest(32 << 20);
            // Dirty the bss area first: setup must zero it.
            mem.write_slice(&[0xee; 64], GuestAddress(0x200010))
                .unwrap();
            let k = KernelImage::from_bytes(tiny_elf(0x200000, &[0xf4; 16], 8192, None)).unwrap();
            let rd = vec![0x5a; 10_000];
            let info = setup(
                &mem,
                &layout,
                &BootConfig {
                    kernel: &k,
                    initrd: Some(&rd),
                    cmdline: "console=ttyS0 hello",
                    cpus: 2,
                    protocol: BootProtocol::Linux64,
                    virtio_mmio: &[],
                    isa: &[],
                    sleep_port: 0x600,
                    pci: None,
                    memory_zeroed: false,
                },
            )
            .unwrap();
            assert_eq!(info.entry_addr, 0x200000);
            assert_eq!(info.entry.regs.rsi, layout::ZERO_PAGE_ADDR);
            let code: [u8; 16] = mem.read_obj(GuestAddress(0x200000)).unwrap();
            assert_eq!(code, [0xf4; 16]);
            let mut bss = [0xffu8; 64];
            mem.read_slice(&mut bss, GuestAddress(0x200010)).unwrap();
            assert_eq!(bss, [0; 64]);
            let bp: boot_params = mem.read_obj(GuestAddress(layout::ZERO_PAGE_ADDR)).unwrap();
            let ptr = bp.hdr.cmd_line_ptr;
            let mut cl = [0u8; 20];
            mem.read_slice(&mut cl, GuestAddress(ptr as u64)).unwrap();
            assert_eq!(&cl, b"console=ttyS0 hello\0");
            let (rd_addr, rd_size) = (bp.hdr.ramdisk_image as u64, bp.hdr.ramdisk_size as u64);
            assert_eq!(Some((rd_addr, rd_size)), info.initrd);
            assert_eq!(rd_addr % 4096, 0);
            assert!(rd_addr + rd_size <= 32 << 20);
            let mut back = vec![0u8; rd.len()];
            mem.read_slice(&mut back, GuestAddress(rd_addr)).unwrap();
            assert_eq!(back, rd);
            // e820 in the zero page = what we report = the memory, exactly.
            assert_eq!(bp.e820_entries as usize, info.e820.len());
            assert_eq!(e820::total(&info.e820), 32 << 20);
            let sig: [u8; 8] = mem.read_obj(GuestAddress(layout::ACPI_ADDR)).unwrap();
            assert_eq!(&sig, b"RSD PTR ");
            let mp: [u8; 4] = mem.read_obj(GuestAddress(layout::MPTABLE_ADDR)).unwrap();
            assert_eq!(&mp, b"_MP_");
        }

        #[test]
        fn pvh_end_to_end() {
            let (layout, mem) = guest(16 << 20);
            let k = KernelImage::from_bytes(tiny_elf(0x200000, &[0x90; 64], 0, Some(0x200020)))
                .unwrap();
            let cfg = BootConfig {
                protocol: BootProtocol::Pvh,
                ..plain(&k)
            };
            let info = setup(&mem, &layout, &cfg).unwrap();
            assert_eq!(info.entry_addr, 0x200020);
            assert_eq!(info.entry.regs.rbx, layout::PVH_INFO_ADDR);
            let magic: u32 = mem.read_obj(GuestAddress(layout::PVH_INFO_ADDR)).unwrap();
            assert_eq!(magic, 0x336e_c578);
            let entries: u32 = mem
                .read_obj(GuestAddress(layout::PVH_INFO_ADDR + 48))
                .unwrap();
            assert_eq!(entries as usize, info.e820.len());
        }

        /// One vCPU, no devices, Linux's 64-bit entry: what a test changes it from.
        fn plain(k: &KernelImage) -> BootConfig<'_> {
            BootConfig {
                kernel: k,
                initrd: None,
                cmdline: "x",
                cpus: 1,
                protocol: BootProtocol::Linux64,
                virtio_mmio: &[],
                isa: &[],
                sleep_port: 0x600,
                pci: None,
                memory_zeroed: false,
            }
        }

        #[test]
        fn bss_is_left_alone_only_in_memory_known_to_be_zero() {
            for memory_zeroed in [false, true] {
                let (layout, mem) = guest(32 << 20);
                // Something in the bss that only a zeroing loader would clear.
                mem.write_slice(&[0xee; 64], GuestAddress(0x200010))
                    .unwrap();
                let k =
                    KernelImage::from_bytes(tiny_elf(0x200000, &[0xf4; 16], 8192, None)).unwrap();
                let cfg = BootConfig {
                    memory_zeroed,
                    ..plain(&k)
                };
                setup(&mem, &layout, &cfg).unwrap();
                let code: [u8; 16] = mem.read_obj(GuestAddress(0x200000)).unwrap();
                assert_eq!(code, [0xf4; 16], "the code is loaded either way");
                let mut bss = [0u8; 64];
                mem.read_slice(&mut bss, GuestAddress(0x200010)).unwrap();
                let want = if memory_zeroed { [0xee; 64] } else { [0; 64] };
                assert_eq!(bss, want, "memory_zeroed={memory_zeroed}");
            }
        }

        #[test]
        fn refusals_write_nothing() {
            let (layout, mem) = guest(16 << 20);
            let k = KernelImage::from_bytes(tiny_elf(0x200000, &[0x90; 64], 0, None)).unwrap();
            let base = BootConfig {
                cmdline: "ok",
                ..plain(&k)
            };
            let long = "a".repeat(5000);
            let huge_rd = vec![0u8; 15 << 20];
            for (cfg, what) in [
                (
                    BootConfig {
                        protocol: BootProtocol::Pvh,
                        virtio_mmio: &[],
                        isa: &[],
                        sleep_port: 0x600,
                        ..base
                    },
                    "no PVH note",
                ),
                (
                    BootConfig {
                        cmdline: &long,
                        ..base
                    },
                    "cmdline too long",
                ),
                (
                    BootConfig {
                        cmdline: "a\nb",
                        ..base
                    },
                    "control char",
                ),
                (BootConfig { cpus: 0, ..base }, "zero cpus"),
                (
                    BootConfig {
                        initrd: Some(&huge_rd),
                        ..base
                    },
                    "initrd too big",
                ),
            ] {
                assert!(setup(&mem, &layout, &cfg).is_err(), "{what}");
                let mut b = [0xffu8; 64];
                mem.read_slice(&mut b, GuestAddress(0x200000)).unwrap();
                assert_eq!(b, [0; 64], "{what} wrote the kernel");
                let z: [u8; 8] = mem.read_obj(GuestAddress(layout::ACPI_ADDR)).unwrap();
                assert_eq!(z, [0; 8], "{what} wrote tables");
            }
        }

        #[test]
        fn bzimage_boot_params() {
            let (layout, mem) = guest(64 << 20);
            let payload = vec![0xcc; 4096];
            let k = KernelImage::from_bytes(tiny_bzimage(0x020f, 0x7f, &payload)).unwrap();
            let info = setup(
                &mem,
                &layout,
                &BootConfig {
                    kernel: &k,
                    initrd: None,
                    cmdline: "console=ttyS0",
                    cpus: 1,
                    protocol: BootProtocol::Linux64,
                    virtio_mmio: &[],
                    isa: &[],
                    sleep_port: 0x600,
                    pci: None,
                    memory_zeroed: false,
                },
            )
            .unwrap();
            // Protected-mode code at the preferred address, entered at +0x200.
            assert_eq!(info.entry_addr, 0x100_0200);
            let b: [u8; 16] = mem.read_obj(GuestAddress(0x100_0000)).unwrap();
            assert_eq!(b, [0xcc; 16]);
            let bp: boot_params = mem.read_obj(GuestAddress(layout::ZERO_PAGE_ADDR)).unwrap();
            let (ver, code32, tol) = (bp.hdr.version, bp.hdr.code32_start, bp.hdr.type_of_loader);
            assert_eq!((ver, code32, tol), (0x020f, 0x100_0000, 0xff));
            let cl = bp.hdr.cmd_line_ptr;
            assert_eq!(cl as u64, layout::CMDLINE_ADDR);
        }

        #[test]
        fn the_command_line_is_composed_and_checked_by_linux_loader() {
            let c = compose_cmdline(
                "clearcpuid=1 console=ttyS0",
                &["idle=poll", "", "virtio_mmio.device=4K@0xd0000000:5"],
                2047,
            )
            .unwrap();
            assert_eq!(
                c,
                "clearcpuid=1 console=ttyS0 idle=poll virtio_mmio.device=4K@0xd0000000:5"
            );
            // What the user meant for init stays after ` -- `, after the VMM's words.
            let c = compose_cmdline("console=ttyS0 -- single", &["idle=poll"], 2047).unwrap();
            assert_eq!(c, "console=ttyS0 idle=poll -- single");
            // Too long counts every part; not printable ASCII is refused.
            let e = compose_cmdline(&"a".repeat(40), &["b".repeat(10).as_str()], 50).unwrap_err();
            assert!(e.to_string().contains("at most 50"), "{e}");
            assert!(compose_cmdline(&"a".repeat(40), &["b".repeat(9).as_str()], 50).is_ok());
            for bad in ["a\tb", "caf\u{e9}", "a\0b"] {
                let e = compose_cmdline(bad, &[], 2047).unwrap_err();
                assert!(
                    e.to_string().contains("not printable ASCII"),
                    "{bad:?}: {e}"
                );
                assert!(check_cmdline(bad, 2047).is_err());
            }
            assert!(check_cmdline(&"x".repeat(2047), 2047).is_ok());
            assert!(check_cmdline(&"x".repeat(2048), 2047).is_err());
        }

        #[test]
        fn initrd_placement() {
            let layout = MemoryLayout::new(64 << 20).unwrap();
            let a = place_initrd(&layout, 0x300_0000, 4097, u64::MAX).unwrap();
            assert_eq!(a, ((64 << 20) - 4097) & !4095);
            assert!(place_initrd(&layout, 0x3ff_f000, 8192, u64::MAX).is_err());
            // Limited by initrd_addr_max.
            let a = place_initrd(&layout, 0x20_0000, 4096, 0x1ff_ffff).unwrap();
            assert_eq!(a, 0x200_0000 - 4096);
        }
    }
}
