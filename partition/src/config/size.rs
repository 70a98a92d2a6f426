//! Byte sizes as people write them: "128M", "1G", "1GiB", "512MiB", "4096".
//! Suffixes are binary (K = 1024).

/// Errors parsing a size.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SizeError {
    /// Not a size.
    #[error("{0:?} is not a size (examples: 128M, 1G, 2GiB, 4096)")]
    Syntax(String),
    /// Too large to represent.
    #[error("{0:?} is too large")]
    Overflow(String),
}

/// Parses a size in bytes.
pub fn parse(s: &str) -> Result<u64, SizeError> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, suffix) = t.split_at(split);
    if digits.is_empty() {
        return Err(SizeError::Syntax(s.to_string()));
    }
    let shift = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(SizeError::Syntax(s.to_string())),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| SizeError::Overflow(s.to_string()))?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| SizeError::Overflow(s.to_string()))
}

/// Formats bytes for people ("128 MiB", "1.5 GiB", "4097 B").
pub fn format(bytes: u64) -> String {
    const UNITS: [(u64, &str); 4] = [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")];
    for (shift, unit) in UNITS {
        let u = 1u64 << shift;
        if bytes >= u {
            return if bytes % u == 0 {
                format!("{} {unit}", bytes >> shift)
            } else {
                format!("{:.1} {unit}", bytes as f64 / u as f64)
            };
        }
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses() {
        assert_eq!(parse("4096"), Ok(4096));
        assert_eq!(parse("128M"), Ok(128 << 20));
        assert_eq!(parse("128MiB"), Ok(128 << 20));
        assert_eq!(parse("1g"), Ok(1 << 30));
        assert_eq!(parse("2GB"), Ok(2 << 30));
        assert_eq!(parse("8K"), Ok(8192));
    }

    #[test]
    fn rejects() {
        for bad in ["", "M", "1.5G", "-1", "12Q", "1 G G", "0x100"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert!(matches!(
            parse("99999999999999999999"),
            Err(SizeError::Overflow(_))
        ));
        assert!(matches!(parse("17179869184T"), Err(SizeError::Overflow(_))));
    }

    #[test]
    fn formats() {
        assert_eq!(format(128 << 20), "128 MiB");
        assert_eq!(format(3 << 29), "1.5 GiB");
        assert_eq!(format(100), "100 B");
    }
}
