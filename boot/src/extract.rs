//! Taking the ELF `vmlinux` out of a bzImage: find the compressed payload the setup header
//! points at, decompress it, check the result is an ELF.
//!
//! Why: a bzImage's own decompressor runs in guest ring 0, which the nested KVM on the
//! development hosts emulates instruction by instruction and rejects part-way; the ELF
//! inside boots directly. The kernel build appends the decompressed size to every payload
//! (`size_append`), which bounds the output and checks the result.

use std::io::{Read, Write};

/// Largest vmlinux we produce.
const MAX_OUTPUT: usize = 1 << 30;
/// Legacy LZ4 frame magic (`lz4 -l`, the kernel's format).
const LZ4_LEGACY_MAGIC: u32 = 0x184c_2102;
/// Largest block in a legacy LZ4 frame.
const LZ4_LEGACY_BLOCK: usize = 8 << 20;

/// Errors extracting a vmlinux.
#[derive(Debug, thiserror::Error)]
pub enum ExtractError {
    /// Not a bzImage, or one too old to describe its payload (protocol < 2.08).
    #[error("not a bzImage with a described payload (boot protocol 2.08+ needed): {0}")]
    NotBzImage(&'static str),
    /// The compression is one we do not decode.
    #[error("payload compression {0} is not supported (gzip, xz, zstd and lz4 are)")]
    Unsupported(&'static str),
    /// The payload did not decompress.
    #[error("decompressing the {format} payload failed: {reason}")]
    Decompress {
        /// Format name.
        format: &'static str,
        /// Decoder message.
        reason: String,
    },
    /// The result is not what the header promised.
    #[error("decompressed payload is {got} bytes, the kernel says {want}")]
    SizeMismatch {
        /// Bytes produced.
        got: usize,
        /// Bytes promised.
        want: usize,
    },
    /// The result is not an ELF.
    #[error("decompressed payload is not an ELF image")]
    NotElf,
}

/// Compression formats of a bzImage payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// gzip.
    Gzip,
    /// xz.
    Xz,
    /// zstd.
    Zstd,
    /// LZ4 legacy frame.
    Lz4,
    /// Known but not decoded here.
    Other(&'static str),
}

impl Compression {
    /// Recognises a payload by its magic bytes.
    pub fn detect(p: &[u8]) -> Option<Self> {
        Some(if p.starts_with(&[0x1f, 0x8b]) {
            Self::Gzip
        } else if p.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
            Self::Xz
        } else if p.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Self::Zstd
        } else if p.starts_with(&LZ4_LEGACY_MAGIC.to_le_bytes()) {
            Self::Lz4
        } else if p.starts_with(b"BZh") {
            Self::Other("bzip2")
        } else if p.starts_with(&[0x5d, 0, 0]) {
            Self::Other("lzma")
        } else if p.starts_with(&[0x89, b'L', b'Z', b'O']) {
            Self::Other("lzo")
        } else {
            return None;
        })
    }

    fn name(self) -> &'static str {
        match self {
            Self::Gzip => "gzip",
            Self::Xz => "xz",
            Self::Zstd => "zstd",
            Self::Lz4 => "lz4",
            Self::Other(n) => n,
        }
    }
}

/// The compressed payload of `bz` and its format.
pub fn payload(bz: &[u8]) -> Result<(&[u8], Compression), ExtractError> {
    let u16_at = |o: usize| bz.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |o: usize| {
        bz.get(o..o + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    if u32_at(0x202) != Some(0x5372_6448) {
        return Err(ExtractError::NotBzImage("no HdrS magic"));
    }
    if u16_at(0x206).unwrap_or(0) < 0x0208 {
        return Err(ExtractError::NotBzImage("boot protocol older than 2.08"));
    }
    let sects = match bz[0x1f1] {
        0 => 4,
        n => n as usize,
    };
    let setup = (sects + 1) * 512;
    let off = u32_at(0x248).ok_or(ExtractError::NotBzImage("truncated header"))? as usize;
    let len = u32_at(0x24c).ok_or(ExtractError::NotBzImage("truncated header"))? as usize;
    let start = setup
        .checked_add(off)
        .ok_or(ExtractError::NotBzImage("payload offset overflows"))?;
    let p = start
        .checked_add(len)
        .and_then(|end| bz.get(start..end))
        .ok_or(ExtractError::NotBzImage(
            "payload beyond the end of the file",
        ))?;
    let c = Compression::detect(p).ok_or(ExtractError::Unsupported("unknown"))?;
    Ok((p, c))
}

/// Extracts the vmlinux ELF from bzImage `bz`.
pub fn extract_vmlinux(bz: &[u8]) -> Result<Vec<u8>, ExtractError> {
    let (p, c) = payload(bz)?;
    if p.len() < 8 {
        return Err(ExtractError::NotBzImage("payload too short"));
    }
    let (data, size_tail) = p.split_at(p.len() - 4);
    let want =
        u32::from_le_bytes([size_tail[0], size_tail[1], size_tail[2], size_tail[3]]) as usize;
    if want == 0 || want > MAX_OUTPUT {
        return Err(ExtractError::NotBzImage(
            "appended decompressed size is zero or over 1 GiB",
        ));
    }
    let err = |reason: String| ExtractError::Decompress {
        format: c.name(),
        reason,
    };
    let out = match c {
        Compression::Gzip => read_bounded(flate2::read::GzDecoder::new(data), want).map_err(err)?,
        Compression::Xz => {
            let mut out = BoundedWriter::new(want);
            lzma_rs::xz_decompress(&mut std::io::BufReader::new(data), &mut out)
                .map_err(|e| err(e.to_string()))?;
            out.buf
        }
        Compression::Zstd => {
            let mut input = data;
            let dec = ruzstd::decoding::StreamingDecoder::new(&mut input)
                .map_err(|e| err(e.to_string()))?;
            read_bounded(dec, want).map_err(err)?
        }
        Compression::Lz4 => unlz4_legacy(data, want).map_err(err)?,
        Compression::Other(n) => return Err(ExtractError::Unsupported(n)),
    };
    if out.len() != want {
        return Err(ExtractError::SizeMismatch {
            got: out.len(),
            want,
        });
    }
    if !out.starts_with(b"\x7fELF") {
        return Err(ExtractError::NotElf);
    }
    Ok(out)
}

fn read_bounded<R: Read>(r: R, want: usize) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(want);
    r.take(want as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| e.to_string())?;
    Ok(out)
}

/// A writer that refuses to grow past a bound (decompression bombs).
struct BoundedWriter {
    buf: Vec<u8>,
    max: usize,
}

impl BoundedWriter {
    fn new(max: usize) -> Self {
        Self {
            buf: Vec::with_capacity(max),
            max,
        }
    }
}

impl Write for BoundedWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if self.buf.len() + b.len() > self.max {
            return Err(std::io::Error::other("output larger than the kernel said"));
        }
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Decodes a legacy LZ4 frame: magic, then (u32 compressed size, block) pairs; a repeated
/// magic starts a new frame.
fn unlz4_legacy(mut data: &[u8], want: usize) -> Result<Vec<u8>, String> {
    let mut out = vec![0u8; want];
    let mut pos = 0;
    let mut first = true;
    while data.len() >= 4 {
        let word = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
        data = &data[4..];
        if word == LZ4_LEGACY_MAGIC {
            first = false;
            continue;
        }
        if first {
            return Err("missing legacy frame magic".into());
        }
        let n = word as usize;
        if n > data.len() {
            return Err(format!("block of {n} bytes but {} remain", data.len()));
        }
        let room = (want - pos).min(LZ4_LEGACY_BLOCK);
        let got = lz4_flex::block::decompress_into(&data[..n], &mut out[pos..pos + room])
            .map_err(|e| e.to_string())?;
        pos += got;
        data = &data[n..];
        if pos == want {
            break;
        }
    }
    out.truncate(pos);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::tests::tiny_bzimage;

    fn fake_vmlinux(n: usize) -> Vec<u8> {
        let mut v = b"\x7fELF".to_vec();
        v.extend((0..n).map(|i| (i * 7 % 251) as u8));
        v
    }

    fn bz_with(payload: &[u8]) -> Vec<u8> {
        let mut bz = tiny_bzimage(0x020f, 0x7f, payload);
        bz[0x248..0x24c].copy_from_slice(&0u32.to_le_bytes());
        bz[0x24c..0x250].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        bz
    }

    fn with_size(mut p: Vec<u8>, n: usize) -> Vec<u8> {
        p.extend_from_slice(&(n as u32).to_le_bytes());
        p
    }

    #[test]
    fn gzip_round_trip() {
        let elf = fake_vmlinux(100_000);
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(&elf).unwrap();
        let p = with_size(enc.finish().unwrap(), elf.len());
        assert_eq!(extract_vmlinux(&bz_with(&p)).unwrap(), elf);
    }

    #[test]
    fn lz4_legacy_round_trip() {
        let elf = fake_vmlinux(300_000);
        let mut p = LZ4_LEGACY_MAGIC.to_le_bytes().to_vec();
        for chunk in elf.chunks(100_000) {
            let c = lz4_flex::block::compress(chunk);
            p.extend_from_slice(&(c.len() as u32).to_le_bytes());
            p.extend_from_slice(&c);
        }
        let p = with_size(p, elf.len());
        assert_eq!(extract_vmlinux(&bz_with(&p)).unwrap(), elf);
    }

    #[test]
    fn lies_and_garbage_are_errors() {
        let elf = fake_vmlinux(10_000);
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(&elf).unwrap();
        let gz = enc.finish().unwrap();
        // Claimed size smaller than the real output.
        let p = with_size(gz.clone(), 100);
        assert!(matches!(
            extract_vmlinux(&bz_with(&p)),
            Err(ExtractError::SizeMismatch { .. })
        ));
        // Truncated stream.
        let p = with_size(gz[..gz.len() / 2].to_vec(), elf.len());
        assert!(extract_vmlinux(&bz_with(&p)).is_err());
        // Not an ELF inside.
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(b"plain text, not a kernel").unwrap();
        let p = with_size(enc.finish().unwrap(), 24);
        assert!(matches!(
            extract_vmlinux(&bz_with(&p)),
            Err(ExtractError::NotElf)
        ));
        // Unknown compression, and not a bzImage at all.
        assert!(matches!(
            extract_vmlinux(&bz_with(&with_size(b"BZh91AY&SY".to_vec(), 5))),
            Err(ExtractError::Unsupported("bzip2"))
        ));
        assert!(matches!(
            extract_vmlinux(&[0u8; 4096]),
            Err(ExtractError::NotBzImage(_))
        ));
        // LZ4 block size pointing past the end.
        let mut p = LZ4_LEGACY_MAGIC.to_le_bytes().to_vec();
        p.extend_from_slice(&1_000_000u32.to_le_bytes());
        p.extend_from_slice(&[0; 16]);
        assert!(extract_vmlinux(&bz_with(&with_size(p, 100))).is_err());
    }
}
