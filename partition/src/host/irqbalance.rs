//! irqbalance, the IRQ balancer most distributions run: left alone it rewrites
//! `/proc/irq/*/smp_affinity` every 10 s and puts device interrupts back on the cores a
//! reservation moved them off. `reserve` bans its cores through the daemon's own control
//! socket (the one `irqbalance-ui` uses: `setup` reads the sleep interval and the banned
//! CPUs, `settings cpus LIST` replaces the banned CPUs, `settings cpus NULL` clears them;
//! only root may send, proven by SCM_CREDENTIALS), waits until the daemon has taken the
//! ban, and gives the old list back at `unreserve`. docs/operations.md.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where the daemon puts its socket (systemd's `RuntimeDirectory=irqbalance`).
pub const SOCKET_DIR: &str = "/run/irqbalance";
/// Largest reply read.
const MAX_REPLY: u64 = 64 << 10;

/// Errors talking to irqbalance.
#[derive(Debug, thiserror::Error)]
pub enum IrqbalanceError {
    /// Its socket cannot be reached.
    #[error(
        "irqbalance (pid {pid}) runs, but its control socket {} cannot be reached: {reason}",
        path.display()
    )]
    Unreachable {
        /// The daemon.
        pid: u32,
        /// The socket.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A request or its reply failed.
    #[error("irqbalance (pid {pid}): {what}: {source}")]
    Io {
        /// The daemon.
        pid: u32,
        /// The request.
        what: String,
        /// Why.
        source: std::io::Error,
    },
    /// A reply this code does not understand.
    #[error("irqbalance (pid {pid}) answered `setup` with {reply:?}, not SLEEP n ... BANNED mask")]
    Reply {
        /// The daemon.
        pid: u32,
        /// The reply.
        reply: String,
    },
    /// The daemon did not take a ban in time.
    #[error(
        "irqbalance (pid {pid}) did not take the banned CPUs {wanted} within {secs} s (it bans {now})"
    )]
    NotTaken {
        /// The daemon.
        pid: u32,
        /// What was sent.
        wanted: String,
        /// What it reports.
        now: String,
        /// How long we waited.
        secs: u64,
    },
}

/// A running irqbalance: its pid and start time (so a recycled pid is not taken for it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Daemon {
    /// Process id.
    pub pid: u32,
    /// Start time (clock ticks since boot).
    pub start: u64,
}

/// What `setup` answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setup {
    /// Seconds between two balancing rounds.
    pub sleep: u64,
    /// CPUs it keeps interrupts off, for whatever reason (our ban, its environment's
    /// IRQBALANCE_BANNED_CPULIST, isolcpus, nohz_full).
    pub banned: Vec<usize>,
}

/// The irqbalance running on this host, if any (the first found in /proc).
pub fn running() -> Option<Daemon> {
    running_in(Path::new("/proc"))
}

fn running_in(proc: &Path) -> Option<Daemon> {
    let mut pids: Vec<u32> = std::fs::read_dir(proc)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    pids.into_iter().find_map(|pid| {
        let comm = std::fs::read_to_string(proc.join(pid.to_string()).join("comm")).ok()?;
        if comm.trim_end() != "irqbalance" {
            return None;
        }
        let start = crate::host::ledger::pid_start_time(pid)?;
        Some(Daemon { pid, start })
    })
}

impl Daemon {
    /// Whether this daemon still runs (same pid, same start time).
    pub fn alive(&self) -> bool {
        crate::host::ledger::pid_start_time(self.pid) == Some(self.start)
    }

    /// Its socket's path.
    pub fn socket(&self) -> PathBuf {
        Path::new(SOCKET_DIR).join(format!("irqbalance{}.sock", self.pid))
    }

    /// Asks `setup`.
    pub fn setup(&self) -> Result<Setup, IrqbalanceError> {
        let reply = self.ask("setup")?;
        parse_setup(&reply).ok_or(IrqbalanceError::Reply {
            pid: self.pid,
            reply,
        })
    }

    /// Replaces the CPUs it bans with `cpus` (none: clears the list).
    pub fn ban(&self, cpus: &[usize]) -> Result<(), IrqbalanceError> {
        self.ask(&settings_cpus(cpus)).map(drop)
    }

    /// Bans `cpus` and waits until `setup` reports at least them banned: the daemon takes a
    /// new list at its next round, so up to two of its intervals and a second.
    pub fn ban_and_wait(&self, cpus: &[usize]) -> Result<Setup, IrqbalanceError> {
        let sleep = self.setup()?.sleep.clamp(1, 60);
        self.ban(cpus)?;
        let limit = Duration::from_secs(2 * sleep + 1);
        let start = Instant::now();
        loop {
            let now = self.setup()?;
            if cpus.iter().all(|c| now.banned.contains(c)) {
                return Ok(now);
            }
            if start.elapsed() >= limit {
                return Err(IrqbalanceError::NotTaken {
                    pid: self.pid,
                    wanted: crate::config::cores::format(cpus),
                    now: crate::config::cores::format(&now.banned),
                    secs: limit.as_secs(),
                });
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// One request on a new connection; the reply is what the daemon writes before it
    /// closes the connection (nothing, for `settings`).
    fn ask(&self, msg: &str) -> Result<String, IrqbalanceError> {
        let path = self.socket();
        let unreachable = |reason: String| IrqbalanceError::Unreachable {
            pid: self.pid,
            path: path.clone(),
            reason,
        };
        // Only a directory root owns and nobody else may write is followed: a socket there
        // is the daemon's, not one a local user put in the way.
        let dir = std::fs::symlink_metadata(SOCKET_DIR).map_err(|e| {
            unreachable(format!(
                "{SOCKET_DIR}: {e} (irqbalance makes its socket there only when the \
                 directory exists, as systemd's RuntimeDirectory= makes it)"
            ))
        })?;
        if !dir.is_dir() || dir.uid() != 0 || dir.mode() & 0o022 != 0 {
            return Err(unreachable(format!(
                "{SOCKET_DIR} is not a directory root owns and nobody else may write"
            )));
        }
        let s = UnixStream::connect(&path).map_err(|e| unreachable(e.to_string()))?;
        let io = |source| IrqbalanceError::Io {
            pid: self.pid,
            what: format!("{msg:?}"),
            source,
        };
        s.set_read_timeout(Some(Duration::from_secs(2)))
            .map_err(io)?;
        s.set_write_timeout(Some(Duration::from_secs(2)))
            .map_err(io)?;
        send_with_credentials(&s, msg.as_bytes()).map_err(io)?;
        let mut reply = Vec::new();
        match (&s).take(MAX_REPLY).read_to_end(&mut reply) {
            Ok(_) => {}
            // A `settings` request is answered by nothing; a daemon that keeps the
            // connection open past the timeout has said all it will.
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(e) => return Err(io(e)),
        }
        Ok(String::from_utf8_lossy(&reply).into_owned())
    }
}

/// The request that makes irqbalance ban exactly `cpus`.
pub fn settings_cpus(cpus: &[usize]) -> String {
    if cpus.is_empty() {
        "settings cpus NULL".into()
    } else {
        format!("settings cpus {}", crate::config::cores::format(cpus))
    }
}

/// `SLEEP n [IRQ i j ...] BANNED mask`, the mask in /proc's hex format (32-bit groups,
/// comma-separated, most significant first).
pub fn parse_setup(reply: &str) -> Option<Setup> {
    let words: Vec<&str> = reply.split_whitespace().collect();
    let at = |key: &str| words.iter().position(|w| *w == key);
    let sleep = words.get(at("SLEEP")? + 1)?.parse().ok()?;
    let banned = parse_mask(words.get(at("BANNED")? + 1)?)?;
    Some(Setup { sleep, banned })
}

/// The CPUs set in a /proc-style hex mask ("00000002", "1,00000000").
pub fn parse_mask(mask: &str) -> Option<Vec<usize>> {
    let hex: String = mask.chars().filter(|c| *c != ',').collect();
    if hex.is_empty() || hex.len() > 4096 {
        return None;
    }
    let mut cpus = Vec::new();
    for (i, c) in hex.chars().rev().enumerate() {
        let d = c.to_digit(16)? as usize;
        for b in 0..4 {
            if d & (1 << b) != 0 {
                cpus.push(i * 4 + b);
            }
        }
    }
    Some(cpus)
}

/// Sends `msg` with this process's credentials attached (irqbalance takes requests only
/// from uid 0, and checks the SCM_CREDENTIALS message for it).
fn send_with_credentials(s: &UnixStream, msg: &[u8]) -> std::io::Result<()> {
    let creds = libc::ucred {
        // SAFETY: getpid, getuid and getgid have no preconditions.
        pid: unsafe { libc::getpid() },
        // SAFETY: as above.
        uid: unsafe { libc::getuid() },
        // SAFETY: as above.
        gid: unsafe { libc::getgid() },
    };
    let creds_len = std::mem::size_of::<libc::ucred>() as u32;
    // SAFETY: CMSG_SPACE computes a size from a length; no pointers.
    let space = unsafe { libc::CMSG_SPACE(creds_len) } as usize;
    // u64 words keep the control buffer aligned for cmsghdr.
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: msg.as_ptr() as *mut libc::c_void,
        iov_len: msg.len(),
    };
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
    hdr.msg_iov = &mut iov;
    hdr.msg_iovlen = 1;
    hdr.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    hdr.msg_controllen = space;
    // SAFETY: `hdr` points at `control`, which holds `space` bytes, room for one cmsghdr
    // with a ucred (CMSG_SPACE); CMSG_FIRSTHDR returns a pointer to its start (non-null,
    // since msg_controllen >= sizeof(cmsghdr)).
    let c = unsafe { libc::CMSG_FIRSTHDR(&hdr) };
    let header = libc::cmsghdr {
        // SAFETY: CMSG_LEN computes a size from a length; no pointers.
        cmsg_len: unsafe { libc::CMSG_LEN(creds_len) } as usize,
        cmsg_level: libc::SOL_SOCKET,
        cmsg_type: libc::SCM_CREDENTIALS,
    };
    // SAFETY: `c` is the start of `control`, aligned for cmsghdr (u64 words) and large
    // enough for one (above).
    unsafe { c.write(header) };
    // SAFETY: CMSG_DATA gives the data area after that header, inside `control`.
    let data = unsafe { libc::CMSG_DATA(c) } as *mut libc::ucred;
    // SAFETY: CMSG_SPACE(sizeof ucred) left room for a ucred at `data`; unaligned write, as
    // the kernel's own layout does not promise its alignment.
    unsafe { data.write_unaligned(creds) };
    // SAFETY: `hdr` and what it points at (`iov` over `msg`, `control`) live across the
    // call; sendmsg only reads them.
    let n = unsafe { libc::sendmsg(s.as_raw_fd(), &hdr, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if n as usize != msg.len() {
        return Err(std::io::Error::other(format!(
            "sent {n} of {} bytes",
            msg.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setup_replies_and_masks_parse() {
        let s = parse_setup("SLEEP 10 BANNED 00000000").unwrap();
        assert_eq!(s.sleep, 10);
        assert!(s.banned.is_empty());
        let s = parse_setup("SLEEP 1 IRQ 36 40 BANNED 00000002").unwrap();
        assert_eq!((s.sleep, s.banned), (1, vec![1]));
        assert_eq!(parse_mask("1,00000005").unwrap(), vec![0, 2, 32]);
        assert_eq!(parse_mask("f0").unwrap(), vec![4, 5, 6, 7]);
        for bad in [
            "",
            "SLEEP x BANNED 0",
            "SLEEP 1",
            "SLEEP 1 BANNED zz",
            "BANNED 1",
        ] {
            assert_eq!(parse_setup(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_request_names_the_cpus_or_clears_them() {
        assert_eq!(settings_cpus(&[]), "settings cpus NULL");
        assert_eq!(settings_cpus(&[1]), "settings cpus 1");
        assert_eq!(settings_cpus(&[1, 2, 3, 6]), "settings cpus 1-3,6");
    }

    #[test]
    fn a_daemon_is_found_by_its_command_name() {
        let dir = std::env::temp_dir().join(format!("irqb-proc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        // Our own pid under the name irqbalance (so its start time reads), another not.
        let me = std::process::id();
        for (pid, comm) in [(me, "irqbalance\n"), (1, "init\n")] {
            std::fs::create_dir_all(dir.join(pid.to_string())).unwrap();
            std::fs::write(dir.join(pid.to_string()).join("comm"), comm).unwrap();
        }
        std::fs::create_dir_all(dir.join("self")).unwrap();
        let d = running_in(&dir).expect("found");
        assert_eq!(d.pid, me);
        assert!(d.alive());
        std::fs::write(dir.join(me.to_string()).join("comm"), "irqbalancer\n").unwrap();
        assert_eq!(running_in(&dir), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
