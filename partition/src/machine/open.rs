//! The launch's second step: what the plan names is opened and read, each once, before
//! guest memory is taken or a VM is made: the kernel (parsed, checked against the memory
//! layout, the entry protocol and the command line's length), the initrd (placed), the
//! disks, the console and the API socket's directory. [`Checked`] holds the plan and these.

use std::borrow::Cow;
use std::io::Write;

use boot::kernel::{KernelError, KernelImage};
use boot::regs::BootProtocol;

use super::check::Plan;
use super::config::{Console, KernelSource};
use super::error::LaunchError;

/// Largest initrd accepted.
pub(super) const MAX_INITRD: u64 = 1 << 30;

/// A launch planned, with what its plan names opened.
pub struct Checked {
    /// The plan.
    pub plan: Plan,
    /// What each device's kind opened for it, in the order asked.
    pub(super) opened: Vec<crate::board::spec::Opened>,
    pub(super) kernel: KernelImage,
    pub(super) kernel_name: String,
    pub(super) initrd: Option<Vec<u8>>,
    pub(super) console: Box<dyn Write + Send>,
    /// Where the API socket goes, its directory held open.
    pub(super) api_place: Option<crate::api::ApiPlace>,
}

impl Checked {
    /// The kernel's name for messages.
    pub fn kernel_name(&self) -> &str {
        &self.kernel_name
    }
}

/// The contents of regular file `path` (argument `what`), opened once by
/// [`crate::sys::files::open`] and read through a bound of `limit` bytes.
pub(super) fn read_limited(
    what: &'static str,
    path: &std::path::Path,
    limit: u64,
) -> Result<Vec<u8>, LaunchError> {
    use crate::sys::files::{self, FileError, How};
    let refused = |source| LaunchError::Path {
        what,
        path: path.to_path_buf(),
        source,
    };
    let f = files::open(path, How::READ).map_err(refused)?;
    let size = f.metadata().map(|m| m.len()).ok();
    files::read_file_limited(f, limit).map_err(|e| match e {
        FileError::TooLarge { limit } => LaunchError::TooLarge {
            what,
            path: path.to_path_buf(),
            size: size.unwrap_or(limit + 1),
            limit,
        },
        e => refused(e),
    })
}

/// Opens and reads what `plan` names: the kernel, the initrd, the disks, the console and
/// the API socket's directory. No guest memory is mapped and no VM is made.
pub fn open(plan: Plan) -> Result<Checked, LaunchError> {
    let (bytes, kernel_name) = match &plan.kernel {
        KernelSource::Path(p) => (
            Cow::Owned(read_limited("--kernel", p, plan.layout.size())?),
            p.display().to_string(),
        ),
        KernelSource::Builtin { name, bytes } => (Cow::Borrowed(*bytes), name.to_string()),
    };
    let refused = |source| LaunchError::Kernel {
        path: kernel_name.clone(),
        source,
    };
    let kernel = KernelImage::from_bytes(bytes).map_err(refused)?;
    kernel.check_fits(&plan.layout).map_err(refused)?;
    if plan.protocol == BootProtocol::Pvh && !kernel.has_pvh() {
        return Err(refused(KernelError::NoPvhEntry));
    }
    boot::check_cmdline(&plan.cmdline, kernel.cmdline_max())?;
    let api_place = match &plan.api_socket {
        Some(p) => Some(crate::api::ApiPlace::check(p)?),
        None => None,
    };
    let opened = crate::board::spec::DeviceSpec::open_all(&plan.devices)?;
    let initrd = match &plan.initrd {
        Some(p) => {
            let rd = read_limited("--initrd", p, MAX_INITRD.min(plan.layout.size()))?;
            let (_, kernel_end) = kernel.footprint();
            boot::place_initrd(&plan.layout, kernel_end, rd.len() as u64, u64::MAX)?;
            Some(rd)
        }
        None => None,
    };
    let console: Box<dyn Write + Send> = match &plan.console {
        Console::Stdout => Box::new(std::io::stdout()),
        Console::File(p) => Box::new(std::io::LineWriter::new(open_console(p)?)),
    };
    Ok(Checked {
        plan,
        opened,
        kernel,
        kernel_name,
        initrd,
        console,
        api_place,
    })
}

/// Opens `--console FILE` for writing without waiting (a FIFO's open would block until a
/// reader came), once, by [`crate::sys::files::open`]: a regular file (created, or
/// truncated once it is known to be one), `/dev/null` or a terminal; anything else is
/// refused.
pub(super) fn open_console(p: &std::path::Path) -> Result<std::fs::File, LaunchError> {
    use crate::sys::files::{self, FileError, How};
    use std::os::unix::fs::FileTypeExt;
    let refused = |source| LaunchError::Path {
        what: "--console",
        path: p.to_path_buf(),
        source,
    };
    let not_regular = || {
        refused(FileError::Io(std::io::Error::other(
            "not a regular file, /dev/null or a terminal",
        )))
    };
    let f = files::open(p, How::CREATE_WRITE).map_err(|e| {
        match e.io().and_then(|e| e.raw_os_error()) {
            // A FIFO without a reader: O_NONBLOCK refuses it at once.
            Some(libc::ENXIO) => not_regular(),
            _ => refused(e),
        }
    })?;
    let m = f.metadata().map_err(|e| refused(e.into()))?;
    if m.is_file() {
        f.set_len(0).map_err(|e| refused(e.into()))?;
        return Ok(f);
    }
    if m.file_type().is_char_device() && (is_dev_null(&m) || std::io::IsTerminal::is_terminal(&f)) {
        return Ok(f);
    }
    Err(not_regular())
}

/// Whether `m` is the null device (character device 1:3).
fn is_dev_null(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    libc::major(m.rdev()) == 1 && libc::minor(m.rdev()) == 3
}
