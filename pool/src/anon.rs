//! Anonymous guest memory: 4 KiB pages, prefaulted or not, or 2 MiB hugetlb pages.

/// Kind of anonymous memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    /// 4 KiB pages, faulted in on first touch.
    Anonymous,
    /// 4 KiB pages, faulted in at map time (MAP_POPULATE).
    AnonymousPopulated,
    /// 2 MiB hugetlb pages from the kernel's free hugepage pool (MAP_HUGETLB | MAP_POPULATE,
    /// reserved at map time: too few free hugepages fail the mmap instead of a later touch).
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

    /// The `mmap` flags that give this backing.
    pub fn mmap_flags(self) -> i32 {
        let base = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        match self {
            Self::Anonymous => base | libc::MAP_NORESERVE,
            Self::AnonymousPopulated => base | libc::MAP_NORESERVE | libc::MAP_POPULATE,
            // No MAP_NORESERVE here: with it, a short hugepage pool maps fine, MAP_POPULATE
            // quietly stops, and the first touch of an unbacked page is a SIGBUS.
            Self::Hugetlb => base | libc::MAP_HUGETLB | libc::MAP_POPULATE,
        }
    }

    /// Name for logs and reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Anonymous => "anonymous",
            Self::AnonymousPopulated => "anonymous (prefaulted)",
            Self::Hugetlb => "hugetlb 2M",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_follow_the_backing() {
        let f = Backing::Anonymous.mmap_flags();
        assert_eq!(f & (libc::MAP_POPULATE | libc::MAP_HUGETLB), 0);
        assert_ne!(f & libc::MAP_PRIVATE, 0);
        assert_ne!(
            Backing::AnonymousPopulated.mmap_flags() & libc::MAP_POPULATE,
            0
        );
        let h = Backing::Hugetlb.mmap_flags();
        assert_eq!(
            h & (libc::MAP_POPULATE | libc::MAP_HUGETLB),
            libc::MAP_POPULATE | libc::MAP_HUGETLB
        );
        assert_eq!(
            h & libc::MAP_NORESERVE,
            0,
            "hugepages are reserved at map time"
        );
        assert_eq!(Backing::Hugetlb.page_size(), 2 << 20);
    }
}
