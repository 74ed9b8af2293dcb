//! Whether a `--user` could connect to a Unix socket (Docker's), asked before the agent gives up
//! root: once it has, every new connection to the daemon is made as that user, and one it may
//! not make fails only later, at the first reconnect or pooled connection that needs it.
//!
//! The answer is found by trying: a child process becomes the user and connects, so the
//! socket's mode, ACLs, the directories above it and any security module all have their say.
//! The child runs only async-signal-safe code (raw syscalls and `_exit`) between `fork` and
//! its end, as a child of a threaded process must.
use super::privileges::Identity;
use std::path::Path;

/// What the child found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SocketAccess {
    Connected,
    /// EACCES or EPERM: the user may not connect.
    Denied,
    /// Anything else (no such socket, nobody listening): not a question of the user.
    Other(i32),
}

#[derive(Debug, thiserror::Error)]
pub enum SocketAccessError {
    #[error("socket path {0:?} is too long for a Unix address")]
    PathTooLong(String),
    #[error("fork: {0}")]
    Fork(std::io::Error),
    #[error("a child could not become user {0:?} to try the socket")]
    Become(String),
}

const DENIED: i32 = 1;
const COULD_NOT_BECOME: i32 = 2;
/// Exit codes from here up carry the connect errno, minus this.
const OTHER_BASE: i32 = 16;

/// Tries to connect to `path` as `user`, in a child process.
pub fn try_connect_as(user: &Identity, path: &Path) -> Result<SocketAccess, SocketAccessError> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: a zeroed sockaddr_un is valid; the path is copied in below.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= addr.sun_path.len() {
        return Err(SocketAccessError::PathTooLong(path.display().to_string()));
    }
    for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    let groups = user.groups.clone();
    // SAFETY: the child calls only async-signal-safe functions and always ends in `_exit`.
    match unsafe { libc::fork() } {
        -1 => Err(SocketAccessError::Fork(std::io::Error::last_os_error())),
        // SAFETY: in the child of the fork just made.
        0 => unsafe { child(user.uid, user.gid, &groups, &addr) },
        pid => {
            let mut status = 0;
            // SAFETY: waits for the child just forked.
            if unsafe { libc::waitpid(pid, &mut status, 0) } != pid {
                return Err(SocketAccessError::Fork(std::io::Error::last_os_error()));
            }
            let code = if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                COULD_NOT_BECOME
            };
            match code {
                0 => Ok(SocketAccess::Connected),
                DENIED => Ok(SocketAccess::Denied),
                c if c >= OTHER_BASE => Ok(SocketAccess::Other(c - OTHER_BASE)),
                _ => Err(SocketAccessError::Become(user.name.clone())),
            }
        }
    }
}

/// The child: becomes the user (raw syscalls: this thread only, which is all the child has)
/// and connects.
///
/// # Safety
/// Only in the child of `fork`.
unsafe fn child(
    uid: libc::uid_t,
    gid: libc::gid_t,
    groups: &[libc::gid_t],
    addr: &libc::sockaddr_un,
) -> ! {
    // SAFETY: raw syscalls on this thread's own credentials, a socket of its own and the
    // caller's `sockaddr_un`; `_exit` ends the child without running the parent's handlers.
    unsafe {
        let became = libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) == 0
            && libc::syscall(libc::SYS_setresgid, gid, gid, gid) == 0
            && libc::syscall(libc::SYS_setresuid, uid, uid, uid) == 0;
        if !became {
            libc::_exit(COULD_NOT_BECOME);
        }
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            libc::_exit(OTHER_BASE + *libc::__errno_location());
        }
        let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
        if libc::connect(fd, (addr as *const libc::sockaddr_un).cast(), len) == 0 {
            libc::_exit(0);
        }
        let errno = *libc::__errno_location();
        libc::_exit(if errno == libc::EACCES || errno == libc::EPERM {
            DENIED
        } else {
            OTHER_BASE + errno.min(200)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_user_connects_only_where_the_socket_lets_it() {
        // SAFETY: no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: becoming another user needs root");
            return;
        }
        let nobody = Identity::lookup("nobody").unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.path().join("daemon.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let mode = |m| std::fs::set_permissions(&path, std::fs::Permissions::from_mode(m));
        mode(0o660).unwrap(); // root:root, as Docker's is root:docker
        assert_eq!(
            try_connect_as(&nobody, &path).unwrap(),
            SocketAccess::Denied
        );
        mode(0o666).unwrap();
        assert_eq!(
            try_connect_as(&nobody, &path).unwrap(),
            SocketAccess::Connected
        );
        let absent = dir.path().join("absent.sock");
        assert_eq!(
            try_connect_as(&nobody, &absent).unwrap(),
            SocketAccess::Other(libc::ENOENT)
        );
    }
}
