//! Anonymous guest memory, 4 KiB or 2 MiB hugetlb pages.

use crate::GuestRam;

/// Errors mapping anonymous memory.
#[derive(Debug, thiserror::Error)]
pub enum AnonError {
    /// Size not a multiple of the page size.
    #[error("{size} bytes is not a multiple of the {page} byte page size")]
    Alignment {
        /// Requested size.
        size: usize,
        /// Page size.
        page: usize,
    },
    /// mmap failed.
    #[error("mapping {size} bytes of {backing} memory failed: {source}")]
    Mmap {
        /// Requested size.
        size: usize,
        /// Backing name.
        backing: &'static str,
        /// OS error.
        source: std::io::Error,
    },
}

/// Kind of anonymous memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    /// 4 KiB pages, faulted in on first touch.
    Anonymous,
    /// 4 KiB pages, faulted in at map time (MAP_POPULATE).
    AnonymousPopulated,
    /// 2 MiB hugetlb pages from the kernel's free hugepage pool (MAP_HUGETLB | MAP_POPULATE).
    Hugetlb,
}

impl Backing {
    /// Page size of this backing.
    pub fn page_size(self) -> usize {
        match self {
            Self::Anonymous | Self::AnonymousPopulated => 4096,
            Self::Hugetlb => 2 << 20,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Anonymous => "anonymous",
            Self::AnonymousPopulated => "anonymous (prefaulted)",
            Self::Hugetlb => "hugetlb 2M",
        }
    }
}

/// Anonymous memory, unmapped on drop.
#[derive(Debug)]
pub struct AnonRam {
    ptr: *mut u8,
    len: usize,
    backing: Backing,
}

// SAFETY: the mapping is plain memory; the pointer is only an address, and GuestRam users
// synchronise their own accesses to the guest memory it backs.
unsafe impl Send for AnonRam {}
// SAFETY: as above.
unsafe impl Sync for AnonRam {}

impl AnonRam {
    /// Maps `len` bytes.
    pub fn new(len: usize, backing: Backing) -> Result<Self, AnonError> {
        let page = backing.page_size();
        if len == 0 || len % page != 0 {
            return Err(AnonError::Alignment { size: len, page });
        }
        let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        match backing {
            Backing::Anonymous => {}
            Backing::AnonymousPopulated => flags |= libc::MAP_POPULATE,
            Backing::Hugetlb => flags |= libc::MAP_HUGETLB | libc::MAP_POPULATE,
        }
        // SAFETY: a fresh anonymous mapping; no existing memory is affected.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(AnonError::Mmap {
                size: len,
                backing: backing.name(),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(Self {
            ptr: ptr.cast(),
            len,
            backing,
        })
    }
}

impl Drop for AnonRam {
    fn drop(&mut self) {
        // SAFETY: ptr/len came from our own successful mmap and are unmapped once.
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}

// SAFETY: ptr..ptr+len is our mapping, alive until drop.
unsafe impl GuestRam for AnonRam {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn describe(&self) -> String {
        self.backing.name().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_zeroed_memory() {
        let r = AnonRam::new(1 << 20, Backing::Anonymous).unwrap();
        assert_eq!(r.len(), 1 << 20);
        // SAFETY: inside our fresh mapping.
        let s = unsafe { std::slice::from_raw_parts_mut(r.as_ptr(), r.len()) };
        assert!(s.iter().all(|&b| b == 0));
        s[12345] = 7;
        assert_eq!(s[12345], 7);
    }

    #[test]
    fn rejects_bad_sizes() {
        assert!(matches!(
            AnonRam::new(4095, Backing::Anonymous),
            Err(AnonError::Alignment { .. })
        ));
        assert!(matches!(
            AnonRam::new(4096, Backing::Hugetlb),
            Err(AnonError::Alignment { .. })
        ));
        assert!(AnonRam::new(0, Backing::Anonymous).is_err());
    }
}
