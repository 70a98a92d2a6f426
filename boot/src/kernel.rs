//! Recognising, checking and loading a kernel image: an ELF64 x86-64 executable (a Linux
//! `vmlinux`, or our probe guest) or a Linux bzImage.
//!
//! The file is hostile input: every header field is bounds-checked here before
//! linux-loader copies anything, so a bad image is a clear error, never a panic or a
//! write outside guest memory.

use std::borrow::Cow;
use std::io::Cursor;

use linux_loader::bootparam::setup_header;
use linux_loader::loader::{KernelLoader, bzimage::BzImage, elf::Elf};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use crate::layout::{HIMEM_START, MemoryLayout};

/// "HdrS", the setup header magic.
const HDRS_MAGIC: u32 = 0x5372_6448;
/// bzImage `xloadflags`: the kernel has a 64-bit entry at +0x200.
pub const XLF_KERNEL_64: u16 = 1 << 0;
/// ELF note type of the PVH 32-bit entry point.
const XEN_ELFNOTE_PHYS32_ENTRY: u32 = 18;
const PT_LOAD: u32 = 1;
const PT_NOTE: u32 = 4;
/// Most program headers we accept (vmlinux has about five).
const MAX_PHDRS: usize = 64;

/// Errors recognising or loading a kernel image.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KernelError {
    /// Neither ELF nor bzImage.
    #[error("not a kernel image: neither an ELF64 x86-64 executable nor a Linux bzImage")]
    UnknownFormat,
    /// A malformed ELF file.
    #[error("malformed ELF kernel: {0}")]
    BadElf(&'static str),
    /// A malformed bzImage.
    #[error("malformed bzImage: {0}")]
    BadBzImage(&'static str),
    /// The bzImage lacks what the 64-bit boot protocol needs.
    #[error(
        "bzImage has no 64-bit entry point (boot protocol {major}.{minor:02}, xloadflags {xloadflags:#x}); \
         protocol 2.12+ with XLF_KERNEL_64 is required"
    )]
    No64BitEntry {
        /// Protocol major.
        major: u16,
        /// Protocol minor.
        minor: u16,
        /// Header xloadflags.
        xloadflags: u16,
    },
    /// The kernel needs memory the guest does not have.
    #[error(
        "kernel needs guest memory {start:#x}..{end:#x} ({} MiB) but the guest has {} MiB \
         (usable from {:#x} below 3 GiB)",
        end.div_ceil(1 << 20), mem >> 20, HIMEM_START
    )]
    DoesNotFit {
        /// First byte the kernel needs.
        start: u64,
        /// One past the last byte.
        end: u64,
        /// Guest memory size.
        mem: u64,
    },
    /// PVH requested but the ELF has no PVH note.
    #[error(
        "kernel has no PVH entry point (no XEN_ELFNOTE_PHYS32_ENTRY note); use the Linux 64-bit boot protocol"
    )]
    NoPvhEntry,
    /// linux-loader refused the image.
    #[error("loading the kernel failed: {0}")]
    Load(String),
}

/// One loadable ELF segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Physical load address.
    pub paddr: u64,
    /// Bytes in the file.
    pub filesz: u64,
    /// Bytes in memory (the rest is zeroed).
    pub memsz: u64,
}

/// What the image is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelKind {
    /// An ELF executable.
    Elf {
        /// 64-bit entry point (physical).
        entry: u64,
        /// PVH 32-bit entry point, if the image carries the note.
        pvh_entry: Option<u64>,
        /// PT_LOAD segments with a non-zero size.
        segments: Vec<Segment>,
    },
    /// A bzImage.
    BzImage {
        /// Boot protocol version (major << 8 | minor).
        version: u16,
        /// Where the protected-mode kernel is loaded.
        load_addr: u64,
        /// Memory the kernel needs from `load_addr` while it decompresses and runs.
        init_size: u64,
        /// Header xloadflags.
        xloadflags: u16,
        /// Longest command line the kernel accepts, without the NUL.
        cmdline_size: u32,
        /// Highest address an initrd may end at.
        initrd_addr_max: u64,
    },
}

/// A recognised, validated kernel image held in memory: read from a file (owned), or a
/// built-in image borrowed where the binary holds it (no copy: the launch's resident set
/// does not carry the image twice).
#[derive(Clone, Debug)]
pub struct KernelImage {
    bytes: Cow<'static, [u8]>,
    kind: KernelKind,
}

/// Where a kernel ended up.
#[derive(Clone, Copy, Debug)]
pub struct LoadedKernel {
    /// First byte occupied.
    pub start: u64,
    /// One past the last byte the kernel claims (ELF: end of bss; bzImage: load + init_size).
    pub end: u64,
    /// 64-bit entry point.
    pub entry64: Option<u64>,
    /// PVH entry point.
    pub pvh_entry: Option<u64>,
    /// bzImage setup header (to copy into the zero page).
    pub setup_header: Option<setup_header>,
}

fn u16_at(b: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?))
}

impl KernelImage {
    /// Recognises and validates `bytes` (a `Vec<u8>` or a `&'static [u8]`).
    pub fn from_bytes(bytes: impl Into<Cow<'static, [u8]>>) -> Result<Self, KernelError> {
        let bytes = bytes.into();
        let kind = if bytes.starts_with(b"\x7fELF") {
            parse_elf(&bytes)?
        } else if u32_at(&bytes, 0x202) == Some(HDRS_MAGIC) && u16_at(&bytes, 0x1fe) == Some(0xaa55)
        {
            parse_bzimage(&bytes)?
        } else {
            return Err(KernelError::UnknownFormat);
        };
        Ok(Self { bytes, kind })
    }

    /// The parsed header information.
    pub fn kind(&self) -> &KernelKind {
        &self.kind
    }

    /// The raw image.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Whether the image can be entered through PVH.
    pub fn has_pvh(&self) -> bool {
        matches!(
            self.kind,
            KernelKind::Elf {
                pvh_entry: Some(_),
                ..
            }
        )
    }

    /// Guest-physical range the kernel occupies once loaded (and, for a bzImage, while it
    /// decompresses).
    pub fn footprint(&self) -> (u64, u64) {
        match &self.kind {
            KernelKind::Elf { segments, .. } => {
                let start = segments.iter().map(|s| s.paddr).min().unwrap_or(0);
                // Cannot overflow: parse_elf checked paddr + memsz.
                let end = segments
                    .iter()
                    .map(|s| s.paddr + s.memsz)
                    .max()
                    .unwrap_or(0);
                (start, end)
            }
            KernelKind::BzImage {
                load_addr,
                init_size,
                ..
            } => {
                let payload = self.bytes.len() as u64 - setup_size(&self.bytes) as u64;
                // Cannot overflow: parse_bzimage checked it.
                (
                    *load_addr,
                    load_addr.saturating_add((*init_size).max(payload)),
                )
            }
        }
    }

    /// Longest command line the kernel accepts (without the terminating NUL).
    pub fn cmdline_max(&self) -> usize {
        match &self.kind {
            KernelKind::BzImage { cmdline_size, .. } => {
                (*cmdline_size as usize).min(crate::layout::CMDLINE_MAX - 1)
            }
            KernelKind::Elf { .. } => crate::layout::CMDLINE_MAX - 1,
        }
    }

    /// Checks the kernel fits in `layout`'s RAM, above the low firmware area.
    pub fn check_fits(&self, layout: &MemoryLayout) -> Result<(), KernelError> {
        let (start, end) = self.footprint();
        if start < HIMEM_START || !layout.contains(start, end - start) {
            return Err(KernelError::DoesNotFit {
                start,
                end,
                mem: layout.size(),
            });
        }
        Ok(())
    }

    /// Loads the image into `mem` with linux-loader. Call [`Self::check_fits`] first. An ELF
    /// segment's bss is zeroed unless `mem` is known to hold only zeros (`zeroed`).
    pub fn load<M: GuestMemoryBackend>(
        &self,
        mem: &M,
        zeroed: bool,
    ) -> Result<LoadedKernel, KernelError> {
        let (start, end) = self.footprint();
        let mut cursor = Cursor::new(&*self.bytes);
        match &self.kind {
            KernelKind::Elf {
                entry,
                pvh_entry,
                segments,
            } => {
                let r = Elf::load(mem, None, &mut cursor, Some(GuestAddress(HIMEM_START)))
                    .map_err(|e| KernelError::Load(e.to_string()))?;
                // linux-loader copies p_filesz bytes; the rest of each segment is bss,
                // already zero in fresh memory.
                if !zeroed {
                    for s in segments {
                        let zero_len = s.memsz - s.filesz;
                        if zero_len > 0 {
                            zero(mem, s.paddr + s.filesz, zero_len)?;
                        }
                    }
                }
                Ok(LoadedKernel {
                    start,
                    end: end.max(r.kernel_end),
                    entry64: Some(*entry),
                    pvh_entry: *pvh_entry,
                    setup_header: None,
                })
            }
            KernelKind::BzImage {
                load_addr,
                xloadflags,
                ..
            } => {
                let r = BzImage::load(
                    mem,
                    Some(GuestAddress(*load_addr)),
                    &mut cursor,
                    Some(GuestAddress(HIMEM_START)),
                )
                .map_err(|e| KernelError::Load(e.to_string()))?;
                let entry64 = (xloadflags & XLF_KERNEL_64 != 0).then_some(load_addr + 0x200);
                Ok(LoadedKernel {
                    start,
                    end,
                    entry64,
                    pvh_entry: None,
                    setup_header: r.setup_header,
                })
            }
        }
    }
}

/// Writes `len` zero bytes at `addr`.
pub(crate) fn zero<M: GuestMemoryBackend>(mem: &M, addr: u64, len: u64) -> Result<(), KernelError> {
    const CHUNK: [u8; 4096] = [0; 4096];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(CHUNK.len() as u64);
        mem.write_slice(&CHUNK[..n as usize], GuestAddress(addr + done))
            .map_err(|e| KernelError::Load(format!("zeroing bss at {:#x}: {e}", addr + done)))?;
        done += n;
    }
    Ok(())
}

fn setup_size(b: &[u8]) -> usize {
    let sects = match b.get(0x1f1).copied().unwrap_or(0) {
        0 => 4,
        n => n as usize,
    };
    (sects + 1) * 512
}

fn parse_elf(b: &[u8]) -> Result<KernelKind, KernelError> {
    use KernelError::BadElf;
    if b.len() < 64 {
        return Err(BadElf("shorter than an ELF header"));
    }
    if b[4] != 2 || b[5] != 1 {
        return Err(BadElf("not a little-endian 64-bit ELF"));
    }
    if u16_at(b, 18) != Some(62) {
        return Err(BadElf("not an x86-64 image (e_machine != EM_X86_64)"));
    }
    if u16_at(b, 16) != Some(2) {
        return Err(BadElf("not an executable (e_type != ET_EXEC)"));
    }
    let entry = u64_at(b, 24).ok_or(BadElf("truncated header"))?;
    let phoff = u64_at(b, 32).ok_or(BadElf("truncated header"))? as usize;
    let phentsize = u16_at(b, 54).ok_or(BadElf("truncated header"))? as usize;
    let phnum = u16_at(b, 56).ok_or(BadElf("truncated header"))? as usize;
    if phentsize != 56 {
        return Err(BadElf("program header size is not 56"));
    }
    if phnum == 0 || phnum > MAX_PHDRS {
        return Err(BadElf("no program headers, or too many"));
    }
    let ph_end = phnum
        .checked_mul(56)
        .and_then(|n| n.checked_add(phoff))
        .ok_or(BadElf("program headers overflow"))?;
    if ph_end > b.len() {
        return Err(BadElf("program headers beyond the end of the file"));
    }
    let mut segments = Vec::new();
    let mut pvh_entry = None;
    for i in 0..phnum {
        let p = phoff + i * 56;
        let p_type = u32_at(b, p).ok_or(BadElf("truncated program header"))?;
        let offset = u64_at(b, p + 8).ok_or(BadElf("truncated program header"))?;
        let paddr = u64_at(b, p + 24).ok_or(BadElf("truncated program header"))?;
        let filesz = u64_at(b, p + 32).ok_or(BadElf("truncated program header"))?;
        let memsz = u64_at(b, p + 40).ok_or(BadElf("truncated program header"))?;
        let file_end = offset
            .checked_add(filesz)
            .ok_or(BadElf("segment offset overflows"))?;
        if file_end > b.len() as u64 {
            return Err(BadElf("segment extends beyond the end of the file"));
        }
        match p_type {
            PT_LOAD if memsz > 0 => {
                if filesz > memsz {
                    return Err(BadElf("segment file size exceeds its memory size"));
                }
                paddr
                    .checked_add(memsz)
                    .ok_or(BadElf("segment address overflows"))?;
                segments.push(Segment {
                    paddr,
                    filesz,
                    memsz,
                });
            }
            PT_NOTE => {
                if let Some(e) = find_pvh_note(&b[offset as usize..file_end as usize])? {
                    pvh_entry = Some(e);
                }
            }
            _ => {}
        }
    }
    if segments.is_empty() {
        return Err(BadElf("no loadable segments"));
    }
    if !segments
        .iter()
        .any(|s| entry >= s.paddr && entry < s.paddr + s.memsz)
    {
        return Err(BadElf("entry point is outside every loadable segment"));
    }
    Ok(KernelKind::Elf {
        entry,
        pvh_entry,
        segments,
    })
}

fn find_pvh_note(notes: &[u8]) -> Result<Option<u64>, KernelError> {
    let mut o = 0usize;
    while o + 12 <= notes.len() {
        let namesz = u32_at(notes, o).unwrap_or(0) as usize;
        let descsz = u32_at(notes, o + 4).unwrap_or(0) as usize;
        let ntype = u32_at(notes, o + 8).unwrap_or(0);
        let name_at = o + 12;
        let desc_at = name_at
            .checked_add(namesz.next_multiple_of(4))
            .ok_or(KernelError::BadElf("note overflows"))?;
        let next = desc_at
            .checked_add(descsz.next_multiple_of(4))
            .ok_or(KernelError::BadElf("note overflows"))?;
        if next > notes.len() {
            return Err(KernelError::BadElf("note extends beyond its segment"));
        }
        if ntype == XEN_ELFNOTE_PHYS32_ENTRY && notes[name_at..name_at + namesz] == *b"Xen\0" {
            return match descsz {
                4 => Ok(u32_at(notes, desc_at).map(u64::from)),
                8 => Ok(u64_at(notes, desc_at)),
                _ => Err(KernelError::BadElf(
                    "PVH note descriptor is not 4 or 8 bytes",
                )),
            };
        }
        o = next;
    }
    Ok(None)
}

fn parse_bzimage(b: &[u8]) -> Result<KernelKind, KernelError> {
    use KernelError::BadBzImage;
    let field16 = |o| u16_at(b, o).ok_or(BadBzImage("truncated setup header"));
    let field32 = |o| u32_at(b, o).ok_or(BadBzImage("truncated setup header"));
    let version = field16(0x206)?;
    if version < 0x0200 {
        return Err(BadBzImage("boot protocol older than 2.00"));
    }
    let loadflags = *b.get(0x211).ok_or(BadBzImage("truncated setup header"))?;
    if loadflags & 1 == 0 {
        return Err(BadBzImage("not loaded high (LOADED_HIGH unset): a zImage"));
    }
    let setup = setup_size(b);
    if setup >= b.len() {
        return Err(BadBzImage(
            "setup sectors extend beyond the end of the file",
        ));
    }
    let xloadflags = if version >= 0x020c {
        field16(0x236)?
    } else {
        0
    };
    if version < 0x020c || xloadflags & XLF_KERNEL_64 == 0 {
        return Err(KernelError::No64BitEntry {
            major: version >> 8,
            minor: version & 0xff,
            xloadflags,
        });
    }
    let cmdline_size = if version >= 0x0206 {
        field32(0x238)?
    } else {
        255
    };
    let initrd_addr_max = if version >= 0x0203 {
        field32(0x22c)? as u64
    } else {
        0x37ff_ffff
    };
    let (load_addr, init_size) = if version >= 0x020a {
        let pref = u64_at(b, 0x258).ok_or(BadBzImage("truncated setup header"))?;
        (pref, field32(0x260)? as u64)
    } else {
        (HIMEM_START, (b.len() - setup) as u64 * 4)
    };
    // The kernel occupies [load_addr, load_addr + max(init_size, payload)) (`footprint`):
    // that end must not overflow (a fuzzed header found `footprint` adding past u64::MAX).
    let payload = (b.len() - setup) as u64;
    if load_addr < HIMEM_START || load_addr.checked_add(init_size.max(payload)).is_none() {
        return Err(BadBzImage(
            "preferred load address below 1 MiB or overflowing",
        ));
    }
    Ok(KernelKind::BzImage {
        version,
        load_addr,
        init_size,
        xloadflags,
        cmdline_size,
        initrd_addr_max,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A minimal ELF64 executable: one PT_LOAD of `code` at `paddr` with `bss` extra bytes,
    /// and optionally a PVH note.
    pub(crate) fn tiny_elf(paddr: u64, code: &[u8], bss: u64, pvh: Option<u32>) -> Vec<u8> {
        let phnum: u16 = if pvh.is_some() { 2 } else { 1 };
        let data_off = 64 + 56 * phnum as u64;
        let note: Vec<u8> = match pvh {
            Some(e) => {
                let mut n = Vec::new();
                n.extend_from_slice(&4u32.to_le_bytes());
                n.extend_from_slice(&4u32.to_le_bytes());
                n.extend_from_slice(&18u32.to_le_bytes());
                n.extend_from_slice(b"Xen\0");
                n.extend_from_slice(&e.to_le_bytes());
                n
            }
            None => Vec::new(),
        };
        let code_off = data_off + note.len() as u64;
        let mut b = vec![0u8; 64];
        b[0..4].copy_from_slice(b"\x7fELF");
        b[4] = 2;
        b[5] = 1;
        b[6] = 1;
        b[16..18].copy_from_slice(&2u16.to_le_bytes());
        b[18..20].copy_from_slice(&62u16.to_le_bytes());
        b[20..24].copy_from_slice(&1u32.to_le_bytes());
        b[24..32].copy_from_slice(&paddr.to_le_bytes());
        b[32..40].copy_from_slice(&64u64.to_le_bytes());
        b[52..54].copy_from_slice(&64u16.to_le_bytes());
        b[54..56].copy_from_slice(&56u16.to_le_bytes());
        b[56..58].copy_from_slice(&phnum.to_le_bytes());
        let mut ph = |t: u32, off: u64, addr: u64, filesz: u64, memsz: u64| {
            let mut p = vec![0u8; 56];
            p[0..4].copy_from_slice(&t.to_le_bytes());
            p[4..8].copy_from_slice(&7u32.to_le_bytes());
            p[8..16].copy_from_slice(&off.to_le_bytes());
            p[16..24].copy_from_slice(&addr.to_le_bytes());
            p[24..32].copy_from_slice(&addr.to_le_bytes());
            p[32..40].copy_from_slice(&filesz.to_le_bytes());
            p[40..48].copy_from_slice(&memsz.to_le_bytes());
            b.extend_from_slice(&p);
        };
        ph(
            1,
            code_off,
            paddr,
            code.len() as u64,
            code.len() as u64 + bss,
        );
        if pvh.is_some() {
            ph(4, data_off, 0, note.len() as u64, note.len() as u64);
        }
        b.extend_from_slice(&note);
        b.extend_from_slice(code);
        b
    }

    /// A minimal bzImage: a setup header and `payload` bytes of "compressed kernel".
    pub(crate) fn tiny_bzimage(version: u16, xloadflags: u16, payload: &[u8]) -> Vec<u8> {
        let setup_sects = 4u8;
        let mut b = vec![0u8; (setup_sects as usize + 1) * 512];
        b[0x1f1] = setup_sects;
        b[0x1fe..0x200].copy_from_slice(&0xaa55u16.to_le_bytes());
        b[0x202..0x206].copy_from_slice(&HDRS_MAGIC.to_le_bytes());
        b[0x206..0x208].copy_from_slice(&version.to_le_bytes());
        b[0x211] = 1; // LOADED_HIGH
        b[0x214..0x218].copy_from_slice(&0x100000u32.to_le_bytes()); // code32_start
        b[0x22c..0x230].copy_from_slice(&0x7fff_ffffu32.to_le_bytes());
        b[0x230..0x234].copy_from_slice(&0x200000u32.to_le_bytes()); // kernel_alignment
        b[0x236..0x238].copy_from_slice(&xloadflags.to_le_bytes());
        b[0x238..0x23c].copy_from_slice(&2047u32.to_le_bytes());
        b[0x258..0x260].copy_from_slice(&0x1000000u64.to_le_bytes()); // pref_address
        b[0x260..0x264].copy_from_slice(&0x800000u32.to_le_bytes()); // init_size
        b.extend_from_slice(payload);
        b
    }

    #[test]
    fn every_truncated_bzimage_is_an_error_not_a_panic() {
        // A 0x208-byte file with both magics once indexed past its end (0x211).
        let full = tiny_bzimage(0x020f, XLF_KERNEL_64, &[0u8; 64]);
        assert!(KernelImage::from_bytes(full.clone()).is_ok());
        let setup = setup_size(&full);
        for len in 0..full.len() {
            let r = std::panic::catch_unwind(|| KernelImage::from_bytes(full[..len].to_vec()));
            let r = r.unwrap_or_else(|_| panic!("panicked on {len} bytes"));
            // Cut inside the header or the setup sectors: refused. After them it is a
            // bzImage with a shorter payload (its decompressor would find out).
            assert!(len > setup || r.is_err(), "{len} bytes parsed");
        }
    }

    #[test]
    fn a_bzimage_whose_end_overflows_is_refused() {
        // Found by the `kernel` fuzz target: a preferred address whose sum with init_size
        // fits but whose sum with the (larger) payload does not made `footprint` add past
        // u64::MAX.
        let mut b = tiny_bzimage(0x020f, XLF_KERNEL_64, &[0u8; 4096]);
        b[0x258..0x260].copy_from_slice(&(u64::MAX - 100).to_le_bytes());
        b[0x260..0x264].copy_from_slice(&16u32.to_le_bytes());
        assert!(matches!(
            KernelImage::from_bytes(b),
            Err(KernelError::BadBzImage(_))
        ));
    }

    #[test]
    fn recognises_elf_and_pvh_note() {
        let img =
            KernelImage::from_bytes(tiny_elf(0x200000, &[0x90; 16], 4096, Some(0x200008))).unwrap();
        assert!(img.has_pvh());
        assert_eq!(img.footprint(), (0x200000, 0x200000 + 16 + 4096));
        match img.kind() {
            KernelKind::Elf {
                entry, pvh_entry, ..
            } => {
                assert_eq!(*entry, 0x200000);
                assert_eq!(*pvh_entry, Some(0x200008));
            }
            k => panic!("{k:?}"),
        }
        let plain = KernelImage::from_bytes(tiny_elf(0x200000, &[0x90; 16], 0, None)).unwrap();
        assert!(!plain.has_pvh());
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(
            KernelImage::from_bytes(b"hello world".to_vec()).unwrap_err(),
            KernelError::UnknownFormat
        );
        assert_eq!(
            KernelImage::from_bytes(Vec::new()).unwrap_err(),
            KernelError::UnknownFormat
        );
        // Truncated ELF.
        assert!(matches!(
            KernelImage::from_bytes(b"\x7fELF\x02\x01".to_vec()),
            Err(KernelError::BadElf(_))
        ));
        // Segment running past the end of the file.
        let mut e = tiny_elf(0x200000, &[0x90; 16], 0, None);
        let filesz_at = 64 + 32;
        e[filesz_at..filesz_at + 8].copy_from_slice(&0xffff_ffffu64.to_le_bytes());
        assert!(matches!(
            KernelImage::from_bytes(e),
            Err(KernelError::BadElf(_))
        ));
        // Address overflow.
        let mut e = tiny_elf(0x200000, &[0x90; 16], 0, None);
        let paddr_at = 64 + 24;
        e[paddr_at..paddr_at + 8].copy_from_slice(&(u64::MAX - 4).to_le_bytes());
        assert!(matches!(
            KernelImage::from_bytes(e),
            Err(KernelError::BadElf(_))
        ));
        // Wrong machine.
        let mut e = tiny_elf(0x200000, &[0x90; 16], 0, None);
        e[18] = 3;
        assert!(matches!(
            KernelImage::from_bytes(e),
            Err(KernelError::BadElf(_))
        ));
    }

    #[test]
    fn fit_checks() {
        let layout = MemoryLayout::new(16 << 20).unwrap();
        let img = KernelImage::from_bytes(tiny_elf(0x200000, &[0x90; 16], 0, None)).unwrap();
        img.check_fits(&layout).unwrap();
        let big = KernelImage::from_bytes(tiny_elf(0x200000, &[0x90; 16], 32 << 20, None)).unwrap();
        assert!(matches!(
            big.check_fits(&layout),
            Err(KernelError::DoesNotFit { .. })
        ));
        let low = KernelImage::from_bytes(tiny_elf(0x1000, &[0x90; 16], 0, None)).unwrap();
        assert!(matches!(
            low.check_fits(&layout),
            Err(KernelError::DoesNotFit { .. })
        ));
    }

    #[test]
    fn bzimage_header_fields() {
        let img = KernelImage::from_bytes(tiny_bzimage(0x020f, 0x7f, &[0xaa; 1000])).unwrap();
        match img.kind() {
            KernelKind::BzImage {
                load_addr,
                init_size,
                cmdline_size,
                ..
            } => {
                assert_eq!(*load_addr, 0x1000000);
                assert_eq!(*init_size, 0x800000);
                assert_eq!(*cmdline_size, 2047);
            }
            k => panic!("{k:?}"),
        }
        assert_eq!(img.footprint(), (0x1000000, 0x1800000));
        assert_eq!(img.cmdline_max(), 2047);
        assert!(!img.has_pvh());
        assert!(matches!(
            KernelImage::from_bytes(tiny_bzimage(0x020b, 0, &[0; 16])),
            Err(KernelError::No64BitEntry { .. })
        ));
        assert!(matches!(
            KernelImage::from_bytes(tiny_bzimage(0x020f, 0, &[0; 16])),
            Err(KernelError::No64BitEntry { .. })
        ));
    }
}
