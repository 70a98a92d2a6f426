//! Core lists: "0", "0,1", "2-5,8". Parsed strictly: no duplicates, ascending ranges,
//! nothing but digits, commas and dashes.

/// Most cores in one list (and the highest core number accepted).
pub const MAX_CORE: usize = 4095;

/// Errors parsing or checking a core list.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CoreError {
    /// Empty list.
    #[error("core list is empty")]
    Empty,
    /// Not a number or a range.
    #[error("core list {list:?}: {item:?} is not a core number or a range like 2-5")]
    Syntax {
        /// The whole list.
        list: String,
        /// The bad item.
        item: String,
    },
    /// Range written backwards.
    #[error("core list {list:?}: range {item:?} runs backwards")]
    Backwards {
        /// The whole list.
        list: String,
        /// The bad item.
        item: String,
    },
    /// A core appears twice.
    #[error("core {0} is listed more than once")]
    Duplicate(usize),
    /// A core the host does not have (or does not let us use).
    #[error(
        "core {core} does not exist or is not available to this process (available: {available})"
    )]
    NotAvailable {
        /// The core.
        core: usize,
        /// What is available, as a list.
        available: String,
    },
}

/// Parses a core list, keeping the order given (vCPU i runs on the i-th core).
pub fn parse(list: &str) -> Result<Vec<usize>, CoreError> {
    let syntax = |item: &str| CoreError::Syntax {
        list: list.to_string(),
        item: item.to_string(),
    };
    let num = |s: &str, item: &str| -> Result<usize, CoreError> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(syntax(item));
        }
        s.parse::<usize>()
            .ok()
            .filter(|&n| n <= MAX_CORE)
            .ok_or_else(|| syntax(item))
    };
    let mut out = Vec::new();
    if list.trim().is_empty() {
        return Err(CoreError::Empty);
    }
    for item in list.split(',') {
        let item = item.trim();
        let (a, b) = match item.split_once('-') {
            Some((a, b)) => (num(a, item)?, num(b, item)?),
            None => {
                let n = num(item, item)?;
                (n, n)
            }
        };
        if b < a {
            return Err(CoreError::Backwards {
                list: list.to_string(),
                item: item.to_string(),
            });
        }
        for c in a..=b {
            if out.contains(&c) {
                return Err(CoreError::Duplicate(c));
            }
            out.push(c);
        }
    }
    Ok(out)
}

/// A list built elsewhere (not by [`parse`]) holds no core twice, and is not empty.
pub fn check_distinct(cores: &[usize]) -> Result<(), CoreError> {
    if cores.is_empty() {
        return Err(CoreError::Empty);
    }
    let mut seen = std::collections::BTreeSet::new();
    match cores.iter().find(|c| !seen.insert(**c)) {
        Some(c) => Err(CoreError::Duplicate(*c)),
        None => Ok(()),
    }
}

/// Formats cores as a compact list ("0-3,5").
pub fn format(cores: &[usize]) -> String {
    let mut sorted = cores.to_vec();
    sorted.sort_unstable();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let mut j = i;
        while j + 1 < sorted.len() && sorted[j + 1] == sorted[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            sorted[i].to_string()
        } else {
            format!("{}-{}", sorted[i], sorted[j])
        });
        i = j + 1;
    }
    parts.join(",")
}

/// The host's online cores (sysfs), or, failing that, the cores this process may use.
///
/// Not this process's affinity: once `reserve` has isolated cores, every ordinary process
/// (this one included) is confined to the housekeeping cores, yet the reserved cores are
/// very much there.
pub fn available() -> Vec<usize> {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|s| parse(s.trim()).ok())
        .unwrap_or_else(|| {
            core_affinity::get_core_ids()
                .unwrap_or_default()
                .into_iter()
                .map(|c| c.id)
                .collect()
        })
}

/// Checks every core in `cores` is in `available`.
pub fn check_available(cores: &[usize], available: &[usize]) -> Result<(), CoreError> {
    for &c in cores {
        if !available.contains(&c) {
            return Err(CoreError::NotAvailable {
                core: c,
                available: format(available),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lists_and_ranges() {
        assert_eq!(parse("0").unwrap(), vec![0]);
        assert_eq!(parse("1,0").unwrap(), vec![1, 0]);
        assert_eq!(parse("2-4,7").unwrap(), vec![2, 3, 4, 7]);
        assert_eq!(parse(" 3 , 5-5 ").unwrap(), vec![3, 5]);
    }

    #[test]
    fn rejects_bad_lists() {
        assert_eq!(parse(""), Err(CoreError::Empty));
        assert_eq!(parse("0,0"), Err(CoreError::Duplicate(0)));
        assert_eq!(parse("0-2,1"), Err(CoreError::Duplicate(1)));
        assert!(matches!(parse("3-1"), Err(CoreError::Backwards { .. })));
        for bad in ["a", "1,", "-1", "1-", "1-2-3", "0x1", "+1", "99999", "1 2"] {
            assert!(matches!(parse(bad), Err(CoreError::Syntax { .. })), "{bad}");
        }
    }

    #[test]
    fn availability_and_format() {
        assert_eq!(format(&[3, 0, 1, 2, 7]), "0-3,7");
        assert_eq!(format(&[]), "");
        check_available(&[0, 1], &[0, 1]).unwrap();
        assert_eq!(
            check_available(&[0, 9], &[0, 1]),
            Err(CoreError::NotAvailable {
                core: 9,
                available: "0-1".into()
            })
        );
        assert!(!available().is_empty());
    }
}
