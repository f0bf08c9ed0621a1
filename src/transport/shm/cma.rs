//! Cross-memory attach (`process_vm_readv`) for single copy between processes,
//! and the ptrace policy it needs.
//!
//! Reading another process's memory is a ptrace-class permission. Where Yama
//! restricts ptrace to descendants (`ptrace_scope` = 1), a rank lets exactly its
//! peers read it, and only when CMA is wanted (unless `BRAID_CMA=0`): the one local peer's
//! pid, or the parent every local peer shares (as under `braid run`; Yama lets a
//! declared ptracer's descendants in too). Anything else, and ptrace stays as
//! strict as it was: the probe then reports CMA unavailable and plain buffers go
//! through the ring.

use std::io;

/// A local peer process, as the ptrace policy sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct PeerProc {
    pub pid: i32,
    /// Its parent, when `/proc/<pid>/stat` could be read.
    pub ppid: Option<i32>,
}

/// The pid to name in `PR_SET_PTRACER` so that exactly `peers` can read this
/// process (`me`), or `None` when no single pid covers them without also letting
/// in others (then ptrace is left alone). Peers that are this very process need
/// no permission and are ignored.
pub(super) fn ptracer_for(me: i32, peers: &[PeerProc]) -> Option<i32> {
    let others: Vec<&PeerProc> = peers.iter().filter(|p| p.pid != me && p.pid > 0).collect();
    match others.as_slice() {
        [] => None,
        [one] => Some(one.pid),
        [first, rest @ ..] => {
            let parent = first.ppid.filter(|&pp| pp > 1)?;
            rest.iter().all(|p| p.ppid == Some(parent)).then_some(parent)
        }
    }
}

/// The parent pid in the text of `/proc/<pid>/stat`: the field after the state,
/// after the last `)` (the command name in parentheses may hold anything).
pub(super) fn parse_ppid(stat: &str) -> Option<i32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let _state = fields.next()?;
    fields.next()?.parse().ok()
}

/// The parent of process `pid`, if it can be read.
pub(super) fn ppid_of(pid: i32) -> Option<i32> {
    parse_ppid(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Apply the ptrace policy for CMA with `peers` (see the module docs). Only acts
/// where Yama's `ptrace_scope` is 1: at 0 any same-user process may already read
/// us, and 2 and 3 cannot be relaxed this way.
pub(super) fn allow_ptrace_by(peers: &[PeerProc]) {
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").unwrap_or_default();
    if scope.trim() != "1" {
        return;
    }
    let Some(pid) = ptracer_for(std::process::id() as i32, peers) else {
        tracing::debug!(?peers, "shm: no single ptracer covers the local peers; CMA stays unavailable");
        return;
    };
    // SAFETY: prctl with integer arguments only.
    let r = unsafe { libc::prctl(libc::PR_SET_PTRACER, pid as libc::c_ulong, 0, 0, 0) };
    if r != 0 {
        tracing::debug!(pid, "shm: PR_SET_PTRACER failed: {}", io::Error::last_os_error());
    } else {
        tracing::debug!(pid, "shm: process {pid} (and its descendants) may read this one for CMA");
    }
}

/// Copy `dst.len()` bytes from `addr` in process `pid` with `process_vm_readv`,
/// looping over partial reads.
pub(super) fn vm_read(pid: i32, addr: usize, dst: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < dst.len() {
        let from = addr
            .checked_add(done)
            .filter(|a| *a != 0 && a.checked_add(dst.len() - done).is_some())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "peer address range wraps"))?;
        let local = libc::iovec { iov_base: dst[done..].as_mut_ptr() as *mut libc::c_void, iov_len: dst.len() - done };
        let remote = libc::iovec { iov_base: from as *mut libc::c_void, iov_len: dst.len() - done };
        // SAFETY: `local` covers exactly the writable tail of `dst`; the kernel
        // checks the remote range and fails with EFAULT rather than touching us.
        let r = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if r == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "process_vm_readv made no progress"));
        }
        done += r as usize;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pid: i32, ppid: Option<i32>) -> PeerProc {
        PeerProc { pid, ppid }
    }

    #[test]
    fn one_peer_is_named_itself() {
        assert_eq!(ptracer_for(10, &[p(11, Some(1))]), Some(11));
        // Itself (ranks as threads) needs nothing, so the other one is the only peer.
        assert_eq!(ptracer_for(10, &[p(10, Some(5)), p(12, None)]), Some(12));
    }

    #[test]
    fn siblings_are_named_by_their_common_parent_and_nothing_else_is_relaxed() {
        assert_eq!(ptracer_for(10, &[p(11, Some(7)), p(12, Some(7)), p(13, Some(7))]), Some(7));
        // Different parents, an unknown parent, or init as the parent: no single pid fits.
        assert_eq!(ptracer_for(10, &[p(11, Some(7)), p(12, Some(8))]), None);
        assert_eq!(ptracer_for(10, &[p(11, Some(7)), p(12, None)]), None);
        assert_eq!(ptracer_for(10, &[p(11, Some(1)), p(12, Some(1))]), None);
        // Nobody but ourselves, or nobody at all.
        assert_eq!(ptracer_for(10, &[p(10, Some(7))]), None);
        assert_eq!(ptracer_for(10, &[]), None);
        assert_eq!(ptracer_for(10, &[p(0, None)]), None);
    }

    #[test]
    fn parent_pid_is_read_after_the_command_name() {
        assert_eq!(parse_ppid("1234 (braid) S 99 1234 1234 0 -1"), Some(99));
        // A command name holding spaces and parentheses does not shift the fields.
        assert_eq!(parse_ppid("1234 (a) b (c) R 42 1 1"), Some(42));
        assert_eq!(parse_ppid("garbage"), None);
        assert_eq!(parse_ppid("1 (x) S"), None);
        let me = std::process::id() as i32;
        assert_eq!(ppid_of(me), Some(std::os::unix::process::parent_id() as i32));
    }
}
