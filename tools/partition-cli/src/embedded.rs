//! Writing a program the binary embeds to a file (`partition probe-image`,
//! `partition hotpaths-binary`): shared by `partition` and `partition-bench`.

use std::process::ExitCode;

use partition::machine::outcome::status::{USAGE, VMM_ERROR};

/// Writes `bytes` to `path` with `mode` (opened by descriptor, following no link a user
/// planted: `partition::sys::files`); exit 2 when the path is refused, 1 when the write
/// fails.
pub fn write_out(path: &std::path::Path, bytes: &[u8], mode: u32) -> ExitCode {
    match partition::sys::files::write_new(path, bytes, mode) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("partition: error: {}: {e}", path.display());
            ExitCode::from(if e.is_refusal() { USAGE } else { VMM_ERROR })
        }
    }
}
