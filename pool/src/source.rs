//! What a guest's RAM is mapped from. The mapping itself is made and owned by the VMM's
//! guest memory (vm-memory regions), so every clone of that memory — the vCPUs', the
//! transports', the block workers' — keeps the pages mapped; this only says what to map.

use std::fs::File;
use std::sync::Arc;

use crate::anon::Backing;
use crate::poolfile::ExtentFile;

/// Where a guest's RAM comes from.
#[derive(Clone, Debug)]
pub enum RamSource {
    /// Anonymous memory, gone with the mapping.
    Anonymous(Backing),
    /// An extent of the reserved pool's hugetlbfs file, mapped shared.
    Extent(ExtentFile),
}

/// How to map `len` bytes at `offset` into a [`RamSource`].
#[derive(Clone, Debug)]
pub struct Mapping {
    /// `mmap` flags.
    pub flags: i32,
    /// The file and the byte offset in it, for a file-backed source.
    pub file: Option<(Arc<File>, u64)>,
}

impl RamSource {
    /// The page size every mapped range must be a multiple of.
    pub fn page_size(&self) -> u64 {
        match self {
            Self::Anonymous(b) => b.page_size() as u64,
            Self::Extent(e) => e.page_size(),
        }
    }

    /// The source's size, when it has one (an extent); anonymous memory has any size.
    pub fn fixed_len(&self) -> Option<u64> {
        match self {
            Self::Anonymous(_) => None,
            Self::Extent(e) => Some(e.extent().len),
        }
    }

    /// How to map the bytes starting `offset` bytes into the source.
    pub fn mapping(&self, offset: u64) -> Mapping {
        match self {
            Self::Anonymous(b) => Mapping {
                flags: b.mmap_flags(),
                file: None,
            },
            Self::Extent(e) => Mapping {
                flags: libc::MAP_SHARED | libc::MAP_POPULATE,
                file: Some((Arc::clone(e.file()), e.extent().offset + offset)),
            },
        }
    }

    /// Lets the file go once its extent is mapped: the descriptor becomes /dev/null in
    /// place (`dup3`), so every holder of the `File` (vm-memory's regions keep one) holds
    /// nothing that reaches the pool, and closes a harmless descriptor later. The mappings
    /// keep the extent's pages. Anonymous memory has no file: nothing to do.
    pub fn release_file(&self) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        let Self::Extent(e) = self else {
            return Ok(());
        };
        let null = std::fs::File::open("/dev/null")?;
        // SAFETY: dup3 onto a descriptor this process owns (the pool file's, alive in the
        // Arc): it is atomically replaced, never left closed for another open to take.
        let r = unsafe { libc::dup3(null.as_raw_fd(), e.file().as_raw_fd(), libc::O_CLOEXEC) };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Short description for logs and status ("anonymous", "hugetlb 2M", "pool extent ...").
    pub fn describe(&self) -> String {
        match self {
            Self::Anonymous(b) => b.name().to_string(),
            Self::Extent(e) => format!(
                "pool extent {:#x}+{:#x} ({} KiB pages)",
                e.extent().offset,
                e.extent().len,
                e.page_size() >> 10
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extent::Extent;
    use crate::poolfile::PoolFile;

    #[test]
    fn an_extent_maps_its_own_offset_of_the_file_shared() {
        let dir = std::env::temp_dir().join(format!("ramsource-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pf = PoolFile::create(&dir.join("pool"), 1 << 20, 4096, &mut |_, _| {}).unwrap();
        let e = Extent {
            offset: 0x3000,
            len: 0x4000,
        };
        let src = RamSource::Extent(pf.extent(e).unwrap());
        assert_eq!((src.page_size(), src.fixed_len()), (4096, Some(0x4000)));
        let m = src.mapping(0x1000);
        assert_eq!(m.file.as_ref().map(|f| f.1), Some(0x4000));
        assert_ne!(m.flags & libc::MAP_SHARED, 0);
        assert!(
            src.describe().contains("0x3000+0x4000"),
            "{}",
            src.describe()
        );
        let anon = RamSource::Anonymous(Backing::Hugetlb);
        assert_eq!((anon.page_size(), anon.fixed_len()), (2 << 20, None));
        assert!(anon.mapping(0).file.is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
