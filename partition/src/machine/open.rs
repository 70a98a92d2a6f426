//! The launch's second step: what the plan names is opened and read, each once, before
//! guest memory is taken or a VM is made: the kernel (parsed, checked against the memory
//! layout, the entry protocol and the command line's length), the initrd (placed), the
//! devices' files (the disks, the console's) and the API socket's directory. [`Checked`] holds the plan and these.

use std::borrow::Cow;

use boot::kernel::{KernelError, KernelImage};
use boot::regs::BootProtocol;

use super::check::Plan;
use super::config::KernelSource;
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
    Ok(Checked {
        plan,
        opened,
        kernel,
        kernel_name,
        initrd,
        api_place,
    })
}
