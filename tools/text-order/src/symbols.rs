//! A program's function entry points, as `nm --defined-only` lists them.

use std::path::Path;
use std::process::Command;

/// Why the symbol table could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SymbolsError {
    /// `nm` could not be run.
    #[error("running nm on {path}: {why}")]
    Nm { path: String, why: String },
    /// The program has no function symbols (stripped).
    #[error("{0} lists no function symbols: is it stripped?")]
    Stripped(String),
}

/// One function: its link-time address and its (mangled) name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Function {
    /// Address in the file's own numbering (a PIE's are offsets from its load address).
    pub addr: u64,
    /// The symbol as the linker sees it: what a linker script names.
    pub name: String,
}

/// One line of `nm` (`ADDR TYPE NAME`) if it names a defined function: text symbols (`t`,
/// `T`), weak ones (`w`, `W`) and ifunc resolvers (`i`); an address of 0 is no entry.
pub fn parse_nm_line(line: &str) -> Option<Function> {
    let mut it = line.split_whitespace();
    let addr = u64::from_str_radix(it.next()?, 16).ok()?;
    let kind = it.next()?;
    let name = it.next()?;
    if it.next().is_some() || addr == 0 || !matches!(kind, "t" | "T" | "w" | "W" | "i") {
        return None;
    }
    Some(Function {
        addr,
        name: name.to_string(),
    })
}

/// `nm ARGS PATH`'s standard output.
fn nm(args: &[&str], path: &Path) -> Result<String, SymbolsError> {
    let shown = path.display().to_string();
    let out = Command::new("nm")
        .args(args)
        .arg(path)
        .output()
        .map_err(|e| SymbolsError::Nm {
            path: shown.clone(),
            why: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(SymbolsError::Nm {
            path: shown,
            why: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The functions of `path`, sorted by address, one per address (the first name `nm` gives).
pub fn functions(path: &Path) -> Result<Vec<Function>, SymbolsError> {
    let mut fns: Vec<Function> = nm(&["--defined-only", "-n"], path)?
        .lines()
        .filter_map(parse_nm_line)
        .collect();
    fns.sort_by_key(|f| f.addr);
    fns.dedup_by_key(|f| f.addr);
    if fns.is_empty() {
        return Err(SymbolsError::Stripped(path.display().to_string()));
    }
    Ok(fns)
}

/// The functions a static archive defines: (name, member), in the archive's order.
pub fn archive_members(path: &Path) -> Result<Vec<(String, String)>, SymbolsError> {
    Ok(nm(&["-A", "--defined-only"], path)?
        .lines()
        .filter_map(parse_archive_line)
        .collect())
}

/// Which archive member defines each global function, from `nm -A --defined-only ARCHIVE`
/// lines (`ARCHIVE:MEMBER:ADDR TYPE NAME`): (name, member).
pub fn parse_archive_line(line: &str) -> Option<(String, String)> {
    let (head, rest) = line.rsplit_once(' ')?;
    let name = rest.to_string();
    let (head, kind) = head.rsplit_once(' ')?;
    if !matches!(kind, "t" | "T" | "w" | "W" | "i") {
        return None;
    }
    let mut parts = head.rsplitn(3, ':');
    let _addr = parts.next()?;
    let member = parts.next()?;
    parts.next()?;
    Some((name, member.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nm_lines_give_functions_and_nothing_else() {
        assert_eq!(
            parse_nm_line("0000000000393080 T _ZN9partition4main17hd8b580c17f5fb7dcE"),
            Some(Function {
                addr: 0x393080,
                name: "_ZN9partition4main17hd8b580c17f5fb7dcE".into()
            })
        );
        assert_eq!(
            parse_nm_line("00000000000011a0 i memcpy").map(|f| f.addr),
            Some(0x11a0)
        );
        assert_eq!(parse_nm_line("0000000000953980 D some_data"), None);
        assert_eq!(parse_nm_line("0000000000953980 b bss"), None);
        assert_eq!(parse_nm_line("                 w __gmon_start__"), None);
        assert_eq!(parse_nm_line("0000000000000000 T at_zero"), None);
        assert_eq!(parse_nm_line("zzzz T bad_address"), None);
        assert_eq!(parse_nm_line("0000000000001000 T two words"), None);
        assert_eq!(parse_nm_line(""), None);
    }

    #[test]
    fn archive_lines_name_the_member() {
        assert_eq!(
            parse_archive_line(
                "/usr/lib/x86_64-linux-gnu/libc.a:ioctl.o:0000000000000000 T __ioctl"
            ),
            Some(("__ioctl".into(), "ioctl.o".into()))
        );
        assert_eq!(
            parse_archive_line("/usr/lib/x86_64-linux-gnu/libc.a:errno.o:0000000000000000 B errno"),
            None
        );
        assert_eq!(parse_archive_line("garbage"), None);
    }

    #[test]
    fn this_test_program_has_its_own_functions() {
        let me = std::env::current_exe().unwrap();
        let fns = functions(&me).unwrap();
        assert!(fns.windows(2).all(|w| w[0].addr < w[1].addr));
        assert!(
            fns.iter().any(|f| f.name.contains("parse_nm_line")),
            "{} functions, none named parse_nm_line",
            fns.len()
        );
    }

    #[test]
    fn a_missing_program_is_a_clear_error() {
        let e = functions(Path::new("/nonexistent/program")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/program"), "{e}");
        let e = archive_members(Path::new("/nonexistent/lib.a")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/lib.a"), "{e}");
    }
}
