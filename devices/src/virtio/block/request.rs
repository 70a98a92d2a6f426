//! Parsing a virtio-blk request out of a descriptor chain. Pure: no I/O happens here.
//!
//! A request is a 16-byte header the device reads (type, reserved, sector), data
//! descriptors, and a status byte the device writes, last. Everything is checked: the
//! header's size and direction, every data buffer's direction and that it lies in guest
//! memory, that sectors and lengths stay inside the disk with checked arithmetic, that a
//! read-only disk is not written. What fails becomes a status code for the guest; only a
//! chain without a usable status byte cannot be answered (it is returned with length 0).

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use virtio_bindings::virtio_blk as vb;

use crate::virtio::queue::{Chain, Desc, host_range};

/// Sector size of the virtio-blk interface.
pub const SECTOR: u64 = 512;
/// Read.
pub const T_IN: u32 = vb::VIRTIO_BLK_T_IN;
/// Write.
pub const T_OUT: u32 = vb::VIRTIO_BLK_T_OUT;
/// Flush.
pub const T_FLUSH: u32 = vb::VIRTIO_BLK_T_FLUSH;
/// Device ID string.
pub const T_GET_ID: u32 = vb::VIRTIO_BLK_T_GET_ID;
/// Discard.
pub const T_DISCARD: u32 = vb::VIRTIO_BLK_T_DISCARD;
/// Write zeroes.
pub const T_WRITE_ZEROES: u32 = vb::VIRTIO_BLK_T_WRITE_ZEROES;
/// Success.
pub const S_OK: u8 = vb::VIRTIO_BLK_S_OK as u8;
/// I/O error (also: any malformed request).
pub const S_IOERR: u8 = vb::VIRTIO_BLK_S_IOERR as u8;
/// Unsupported request type.
pub const S_UNSUPP: u8 = vb::VIRTIO_BLK_S_UNSUPP as u8;
/// Length of the device ID.
pub const ID_BYTES: u32 = vb::VIRTIO_BLK_ID_BYTES;
/// `VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP`.
const WZ_UNMAP: u32 = vb::VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP;

/// Limits of the disk, as the config space advertises them.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Disk size in sectors.
    pub capacity: u64,
    /// Writes refused.
    pub read_only: bool,
    /// Most data descriptors in one request (`seg_max`).
    pub seg_max: u32,
    /// Most discard / write-zeroes segments in one request.
    pub max_segments: u32,
    /// Largest discard / write-zeroes segment, in sectors.
    pub max_segment_sectors: u32,
}

/// A guest buffer resolved to host memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buf {
    /// Guest address.
    pub addr: u64,
    /// Host address (stable for the partition's lifetime).
    pub host: *mut u8,
    /// Length.
    pub len: u32,
}

// SAFETY: `host` points into guest memory, which outlives the workers that use it.
unsafe impl Send for Buf {}

/// A discard or write-zeroes range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// First sector.
    pub sector: u64,
    /// Sectors.
    pub sectors: u32,
    /// Write zeroes may deallocate.
    pub unmap: bool,
}

/// What to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Read into `bufs` from `sector`.
    Read {
        /// First sector.
        sector: u64,
        /// Destinations.
        bufs: Vec<Buf>,
    },
    /// Write `bufs` at `sector`.
    Write {
        /// First sector.
        sector: u64,
        /// Sources.
        bufs: Vec<Buf>,
    },
    /// Make writes durable.
    Flush,
    /// Copy the device ID into `buf`.
    GetId {
        /// Destination.
        buf: Buf,
    },
    /// Deallocate ranges.
    Discard(Vec<Segment>),
    /// Zero ranges.
    WriteZeroes(Vec<Segment>),
}

/// A valid request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// Chain head.
    pub head: u16,
    /// The operation.
    pub op: Op,
    /// Guest address of the status byte.
    pub status: u64,
}

impl Request {
    /// Bytes the device writes into the guest on success (for the used ring), status byte
    /// included.
    /// A chain of overlapping buffers can describe more than 4 GiB: the sum is taken in
    /// 64 bits and saturates at `u32::MAX` (the used ring's field).
    pub fn used_len(&self) -> u32 {
        let data: u64 = match &self.op {
            Op::Read { bufs, .. } => bufs.iter().map(|b| u64::from(b.len)).sum(),
            Op::GetId { buf } => u64::from(buf.len.min(ID_BYTES)),
            _ => 0,
        };
        u32::try_from(data.saturating_add(1)).unwrap_or(u32::MAX)
    }
}

/// The outcome of parsing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Parsed {
    /// Ready to execute.
    Ok(Request),
    /// Refused: answer `code` at `status` (or, without a usable status byte, return the chain
    /// with length 0).
    Fail {
        /// Chain head.
        head: u16,
        /// Status byte address, if usable.
        status: Option<u64>,
        /// Status code.
        code: u8,
        /// Why, for logs.
        why: &'static str,
    },
}

fn buf(mem: &GuestMemoryMmap, d: &Desc) -> Option<Buf> {
    let host = host_range(mem, d.addr, d.len as u64)?;
    Some(Buf {
        addr: d.addr,
        host,
        len: d.len,
    })
}

fn in_disk(sector: u64, bytes: u64, capacity: u64) -> bool {
    bytes % SECTOR == 0
        && sector
            .checked_add(bytes / SECTOR)
            .is_some_and(|end| end <= capacity)
}

/// Parses `chain`.
pub fn parse(chain: &Chain, mem: &GuestMemoryMmap, lim: &Limits) -> Parsed {
    let head = chain.head;
    let d = &chain.descs;
    let fail_nostatus = |why| Parsed::Fail {
        head,
        status: None,
        code: S_IOERR,
        why,
    };
    let Some(st) = d.last() else {
        return fail_nostatus("empty chain");
    };
    // The status byte is the last byte of the last descriptor: that byte must be in guest
    // memory (the descriptor's first byte being there says nothing about its last).
    let status = (u64::from(st.len))
        .checked_sub(1)
        .and_then(|l| st.addr.checked_add(l));
    let Some(status) =
        status.filter(|&s| d.len() >= 2 && st.write && host_range(mem, s, 1).is_some())
    else {
        return fail_nostatus("no device-writable status byte at the end of the chain");
    };
    let fail = |code, why| Parsed::Fail {
        head,
        status: Some(status),
        code,
        why,
    };
    let hdr = &d[0];
    if hdr.write || hdr.len < 16 || host_range(mem, hdr.addr, 16).is_none() {
        return fail(
            S_IOERR,
            "the header is not a 16-byte device-readable buffer in guest memory",
        );
    }
    let (Ok(kind), Ok(sector)) = (
        mem.read_obj::<u32>(GuestAddress(hdr.addr)),
        mem.read_obj::<u64>(GuestAddress(hdr.addr + 8)),
    ) else {
        return fail(S_IOERR, "the header cannot be read");
    };
    // Data descriptors sit between the header and the status. A status descriptor longer
    // than one byte also carries data in front of the status (IN requests may do this).
    let mut data: Vec<Desc> = d[1..d.len() - 1].to_vec();
    if st.len > 1 {
        data.push(Desc {
            addr: st.addr,
            len: st.len - 1,
            write: true,
        });
    }
    if data.len() as u32 > lim.seg_max {
        return fail(S_IOERR, "more data descriptors than seg_max");
    }
    let resolve = |want_write: bool| -> Result<Vec<Buf>, &'static str> {
        let mut out = Vec::with_capacity(data.len());
        for x in &data {
            if x.write != want_write {
                return Err(if want_write {
                    "a read request has a device-readable data buffer"
                } else {
                    "a write request has a device-writable data buffer"
                });
            }
            out.push(buf(mem, x).ok_or("a data buffer lies outside guest memory")?);
        }
        Ok(out)
    };
    let total: u64 = data.iter().map(|x| x.len as u64).sum();
    let op = match kind {
        T_IN | T_OUT => {
            let write = kind == T_OUT;
            if write && lim.read_only {
                return fail(S_IOERR, "write to a read-only disk");
            }
            let bufs = match resolve(!write) {
                Ok(b) => b,
                Err(why) => return fail(S_IOERR, why),
            };
            if !in_disk(sector, total, lim.capacity) {
                return fail(
                    S_IOERR,
                    "sector range not a whole number of sectors inside the disk",
                );
            }
            if write {
                Op::Write { sector, bufs }
            } else {
                Op::Read { sector, bufs }
            }
        }
        T_FLUSH => Op::Flush,
        T_GET_ID => match resolve(true) {
            Ok(b) if b.len() == 1 => Op::GetId { buf: b[0] },
            Ok(_) => return fail(S_IOERR, "GET_ID needs exactly one device-writable buffer"),
            Err(why) => return fail(S_IOERR, why),
        },
        T_DISCARD | T_WRITE_ZEROES => {
            if lim.read_only {
                return fail(S_IOERR, "discard or write-zeroes on a read-only disk");
            }
            let bufs = match resolve(false) {
                Ok(b) => b,
                Err(why) => return fail(S_IOERR, why),
            };
            if total == 0 || total % 16 != 0 || total / 16 > lim.max_segments as u64 {
                return fail(
                    S_IOERR,
                    "segment list is empty, not a multiple of 16 bytes, or too long",
                );
            }
            let mut segs = Vec::new();
            for b in &bufs {
                let mut off = 0u64;
                while off + 16 <= b.len as u64 {
                    let at = GuestAddress(b.addr + off);
                    let (Ok(s), Ok(n), Ok(flags)) = (
                        mem.read_obj::<u64>(at),
                        mem.read_obj::<u32>(GuestAddress(at.0 + 8)),
                        mem.read_obj::<u32>(GuestAddress(at.0 + 12)),
                    ) else {
                        return fail(S_IOERR, "a segment cannot be read");
                    };
                    if n == 0
                        || n > lim.max_segment_sectors
                        || !in_disk(s, n as u64 * SECTOR, lim.capacity)
                    {
                        return fail(S_IOERR, "a segment is empty, too large or outside the disk");
                    }
                    segs.push(Segment {
                        sector: s,
                        sectors: n,
                        unmap: kind == T_DISCARD || flags & WZ_UNMAP != 0,
                    });
                    off += 16;
                }
                if b.len % 16 != 0 {
                    return fail(S_IOERR, "a segment straddles two descriptors");
                }
            }
            if kind == T_DISCARD {
                Op::Discard(segs)
            } else {
                Op::WriteZeroes(segs)
            }
        }
        _ => return fail(S_UNSUPP, "unsupported request type"),
    };
    Parsed::Ok(Request { head, op, status })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtio::queue::tests::mem;

    /// End of the test guest memory (`mem()`: 1 MiB from 0).
    const MEM_END: u64 = 1 << 20;

    const LIM: Limits = Limits {
        capacity: 2048,
        read_only: false,
        seg_max: 8,
        max_segments: 4,
        max_segment_sectors: 1024,
    };

    fn chain(descs: &[(u64, u32, bool)]) -> Chain {
        Chain {
            head: 7,
            descs: descs
                .iter()
                .map(|&(addr, len, write)| Desc { addr, len, write })
                .collect(),
        }
    }

    fn header(m: &GuestMemoryMmap, kind: u32, sector: u64) {
        m.write_obj(kind, GuestAddress(0x8000)).unwrap();
        m.write_obj(sector, GuestAddress(0x8008)).unwrap();
    }

    fn code(p: &Parsed) -> Option<u8> {
        match p {
            Parsed::Ok(_) => None,
            Parsed::Fail { code, .. } => Some(*code),
        }
    }

    #[test]
    fn reads_and_writes() {
        let m = mem();
        header(&m, T_IN, 10);
        let p = parse(
            &chain(&[(0x8000, 16, false), (0x9000, 1024, true), (0xa000, 1, true)]),
            &m,
            &LIM,
        );
        let Parsed::Ok(r) = p else { panic!("{p:?}") };
        assert_eq!(r.status, 0xa000);
        assert_eq!(r.used_len(), 1025);
        assert!(
            matches!(r.op, Op::Read { sector: 10, ref bufs } if bufs.len() == 1 && bufs[0].len == 1024)
        );
        header(&m, T_OUT, 0);
        let p = parse(
            &chain(&[(0x8000, 16, false), (0x9000, 512, false), (0xa000, 1, true)]),
            &m,
            &LIM,
        );
        assert!(matches!(
            p,
            Parsed::Ok(Request {
                op: Op::Write { .. },
                ..
            })
        ));
        // Data and status in one descriptor: the status is its last byte.
        header(&m, T_IN, 0);
        let p = parse(
            &chain(&[(0x8000, 16, false), (0x9000, 513, true)]),
            &m,
            &LIM,
        );
        let Parsed::Ok(r) = p else { panic!("{p:?}") };
        assert_eq!(r.status, 0x9000 + 512);
    }

    #[test]
    fn hostile_requests_get_status_codes() {
        let m = mem();
        let ok_hdr = (0x8000, 16, false);
        let st = (0xa000, 1, true);
        // Wrong direction either way.
        header(&m, T_IN, 0);
        assert_eq!(
            code(&parse(
                &chain(&[ok_hdr, (0x9000, 512, false), st]),
                &m,
                &LIM
            )),
            Some(S_IOERR)
        );
        header(&m, T_OUT, 0);
        assert_eq!(
            code(&parse(&chain(&[ok_hdr, (0x9000, 512, true), st]), &m, &LIM)),
            Some(S_IOERR)
        );
        // Past the end of the disk, overflowing sector arithmetic, partial sectors.
        for (sector, len) in [(2047, 1024), (u64::MAX - 1, 1024), (0, 100)] {
            header(&m, T_IN, sector);
            assert_eq!(
                code(&parse(&chain(&[ok_hdr, (0x9000, len, true), st]), &m, &LIM)),
                Some(S_IOERR),
                "{sector} {len}"
            );
        }
        // A buffer outside guest memory, and one wrapping the address space.
        header(&m, T_IN, 0);
        for addr in [(1 << 20) - 100, u64::MAX - 10] {
            assert_eq!(
                code(&parse(&chain(&[ok_hdr, (addr, 512, true), st]), &m, &LIM)),
                Some(S_IOERR)
            );
        }
        // Header too short, writable, or outside memory.
        for h in [
            (0x8000, 8, false),
            (0x8000, 16, true),
            (u64::MAX - 4, 16, false),
        ] {
            assert_eq!(
                code(&parse(&chain(&[h, (0x9000, 512, true), st]), &m, &LIM)),
                Some(S_IOERR)
            );
        }
        // Unknown type.
        header(&m, 99, 0);
        assert_eq!(
            code(&parse(&chain(&[ok_hdr, st]), &m, &LIM)),
            Some(S_UNSUPP)
        );
        // Writes to a read-only disk.
        let ro = Limits {
            read_only: true,
            ..LIM
        };
        header(&m, T_OUT, 0);
        assert_eq!(
            code(&parse(&chain(&[ok_hdr, (0x9000, 512, false), st]), &m, &ro)),
            Some(S_IOERR)
        );
        // More descriptors than seg_max.
        let mut many = vec![ok_hdr];
        many.extend(std::iter::repeat_n((0x9000, 512, true), 9));
        many.push(st);
        header(&m, T_IN, 0);
        assert_eq!(code(&parse(&chain(&many), &m, &LIM)), Some(S_IOERR));
        // No usable status byte: cannot be answered.
        for bad in [
            vec![ok_hdr],
            vec![ok_hdr, (0xa000, 1, false)],
            vec![ok_hdr, (0xa000, 0, true)],
            vec![ok_hdr, (u64::MAX, 1, true)],
            // Its first byte is in guest memory, its last (the status byte) is not.
            vec![ok_hdr, (MEM_END - 16, 32, true)],
            // Its last byte would be past the end of the address space.
            vec![ok_hdr, (u64::MAX - 4, 16, true)],
            vec![],
        ] {
            assert!(
                matches!(
                    parse(&chain(&bad), &m, &LIM),
                    Parsed::Fail { status: None, .. }
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_read_of_overlapping_buffers_past_4_gib_saturates_its_used_length() {
        let big = |len| Buf {
            addr: 0x9000,
            host: std::ptr::null_mut(),
            len,
        };
        let r = Request {
            head: 0,
            op: Op::Read {
                sector: 0,
                bufs: vec![big(u32::MAX), big(u32::MAX), big(7)],
            },
            status: 0xa000,
        };
        assert_eq!(r.used_len(), u32::MAX);
    }

    #[test]
    fn get_id_flush_discard_write_zeroes() {
        let m = mem();
        let ok_hdr = (0x8000, 16, false);
        let st = (0xa000, 1, true);
        header(&m, T_GET_ID, 0);
        let Parsed::Ok(r) = parse(&chain(&[ok_hdr, (0x9000, 20, true), st]), &m, &LIM) else {
            panic!()
        };
        assert_eq!(r.used_len(), 21);
        header(&m, T_FLUSH, 0);
        assert!(matches!(
            parse(&chain(&[ok_hdr, st]), &m, &LIM),
            Parsed::Ok(Request { op: Op::Flush, .. })
        ));
        let seg = |at: u64, s: u64, n: u32, f: u32| {
            m.write_obj(s, GuestAddress(at)).unwrap();
            m.write_obj(n, GuestAddress(at + 8)).unwrap();
            m.write_obj(f, GuestAddress(at + 12)).unwrap();
        };
        seg(0x9000, 8, 16, 0);
        seg(0x9010, 100, 4, 1);
        header(&m, T_WRITE_ZEROES, 0);
        let p = parse(&chain(&[ok_hdr, (0x9000, 32, false), st]), &m, &LIM);
        assert_eq!(
            p,
            Parsed::Ok(Request {
                head: 7,
                op: Op::WriteZeroes(vec![
                    Segment {
                        sector: 8,
                        sectors: 16,
                        unmap: false
                    },
                    Segment {
                        sector: 100,
                        sectors: 4,
                        unmap: true
                    }
                ]),
                status: 0xa000,
            })
        );
        header(&m, T_DISCARD, 0);
        assert!(matches!(
            parse(&chain(&[ok_hdr, (0x9000, 16, false), st]), &m, &LIM),
            Parsed::Ok(Request {
                op: Op::Discard(_),
                ..
            })
        ));
        // A segment past the end, an empty one, a list not a multiple of 16, too many.
        seg(0x9000, 2040, 16, 0);
        assert_eq!(
            code(&parse(&chain(&[ok_hdr, (0x9000, 16, false), st]), &m, &LIM)),
            Some(S_IOERR)
        );
        seg(0x9000, 0, 0, 0);
        assert_eq!(
            code(&parse(&chain(&[ok_hdr, (0x9000, 16, false), st]), &m, &LIM)),
            Some(S_IOERR)
        );
        assert_eq!(
            code(&parse(&chain(&[ok_hdr, (0x9000, 20, false), st]), &m, &LIM)),
            Some(S_IOERR)
        );
        assert_eq!(
            code(&parse(&chain(&[ok_hdr, (0x9000, 80, false), st]), &m, &LIM)),
            Some(S_IOERR)
        );
    }
}
