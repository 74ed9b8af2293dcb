//! Least privilege once started. The probes are loaded, the sources open; from here the agent
//! needs only:
//!
//! | capability | for |
//! |---|---|
//! | `CAP_BPF` | every `bpf()` call on the probes' maps (reads, the cgroup filter): with `kernel.unprivileged_bpf_disabled` set, as distributions ship it, even a map lookup needs it |
//! | `CAP_PERFMON` | attaching the read and block programs later (adaptive read tracing) |
//! | `CAP_SYS_PTRACE` | other processes' `/proc/<pid>/root` (a container's `/dev/shm`) |
//! | `CAP_DAC_READ_SEARCH` | files of other users that root reads (cgroup and `/proc` files a runtime made private) |
//!
//! `CAP_SYS_ADMIN` stands in for the first two where the agent was given it instead (Docker
//! before 23 does not know `BPF` and `PERFMON`). Everything else is dropped — effective,
//! permitted, inheritable, ambient and bounding sets — and no-new-privileges is set.
//!
//! Optionally the agent also becomes another user (`--user`): it keeps the capabilities above
//! across the switch (`PR_SET_KEEPCAPS`), takes that user's groups, and holds no uid 0 at all,
//! so a file it opens afterwards is opened as that user (`CAP_DAC_READ_SEARCH` still reads).
//!
//! The threads that serve HTTP ([`UNPRIVILEGED_THREADS`], the name of their runtime) keep no
//! capability at all: they parse what any client on the network sends, and need none to
//! render the published round. A flaw there then yields a thread that cannot load programs,
//! read other processes' memory maps or bypass file permissions.
//!
//! Capabilities belong to each thread, and the agent's threads are running by now (the HTTP
//! and Docker runtimes, the watchdog). So the change is made in every thread, as glibc does
//! for `setuid`: each is sent a real-time signal whose handler applies it to itself; then every
//! thread's `/proc/self/task/<tid>/status` is checked, and one that missed it is asked again.
//! Credentials too belong to each thread under the raw syscalls used here, so the same signal
//! switches the user.
use crate::caps::{
    TaskCaps, CAP_BPF, CAP_DAC_READ_SEARCH, CAP_PERFMON, CAP_SYS_ADMIN, CAP_SYS_PTRACE,
};
use std::ffi::CString;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// What the agent will still do that needs a capability.
#[derive(Clone, Copy, Debug)]
pub struct Needs {
    /// The probes are loaded: their maps are read every round.
    pub bpf_maps: bool,
    /// Programs may be attached later (adaptive read tracing).
    pub attach_later: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum PrivilegeError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Syscall {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("threads {0:?} still hold capabilities beyond the kept set after 2 s")]
    Threads(Vec<u32>),
    #[error("user {0:?}: no such user in the password database")]
    NoSuchUser(String),
    #[error("user {name:?}: {source}")]
    UserLookup {
        name: String,
        source: std::io::Error,
    },
    #[error("switching to user {0:?} twice in one process")]
    SwitchedAlready(String),
}

/// A user to become: its ids and its groups, from the password and group databases.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub name: String,
    pub uid: libc::uid_t,
    pub gid: libc::gid_t,
    /// Its supplementary groups (those of `/etc/group` that list it, and its primary group).
    pub groups: Vec<libc::gid_t>,
}

impl Identity {
    /// The user named `name`, or with the numeric uid `name`.
    pub fn lookup(name: &str) -> Result<Self, PrivilegeError> {
        let lookup_error = |source| PrivilegeError::UserLookup {
            name: name.to_owned(),
            source,
        };
        let c_name = CString::new(name)
            .map_err(|_| lookup_error(std::io::Error::other("a NUL byte in the name")))?;
        let mut buf = vec![0u8; 16 * 1024];
        // SAFETY: a zeroed passwd is a valid out-parameter.
        let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        let rc = match name.parse::<libc::uid_t>() {
            // SAFETY: every pointer is valid for the call; `buf` outlives the reads of `pw`.
            Ok(uid) => unsafe {
                libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr().cast(), buf.len(), &mut found)
            },
            // SAFETY: as above, and `c_name` is a NUL-terminated string that outlives the call.
            Err(_) => unsafe {
                libc::getpwnam_r(
                    c_name.as_ptr(),
                    &mut pw,
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    &mut found,
                )
            },
        };
        if rc != 0 {
            return Err(lookup_error(std::io::Error::from_raw_os_error(rc)));
        }
        if found.is_null() {
            return Err(PrivilegeError::NoSuchUser(name.to_owned()));
        }
        // SAFETY: getpwnam_r/getpwuid_r filled `pw`; `pw_name` points into `buf`.
        let (uid, gid, user) = unsafe {
            (
                pw.pw_uid,
                pw.pw_gid,
                CString::from(std::ffi::CStr::from_ptr(pw.pw_name)),
            )
        };
        Ok(Self {
            name: name.to_owned(),
            uid,
            gid,
            groups: group_list(&user, gid).map_err(lookup_error)?,
        })
    }
}

/// The groups of `user` (primary group `gid` included).
fn group_list(user: &CString, gid: libc::gid_t) -> std::io::Result<Vec<libc::gid_t>> {
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    loop {
        let mut n = groups.len() as libc::c_int;
        // SAFETY: `groups` holds `n` entries; getgrouplist writes at most that many and sets `n`
        // to the count it needs when they do not fit.
        let rc = unsafe { libc::getgrouplist(user.as_ptr(), gid, groups.as_mut_ptr(), &mut n) };
        if rc >= 0 {
            groups.truncate(n.max(0) as usize);
            return Ok(groups);
        }
        if n as usize <= groups.len() || groups.len() >= 1 << 16 {
            return Err(std::io::Error::other("getgrouplist failed"));
        }
        groups.resize(n as usize, 0);
    }
}

/// Names of the capabilities in `mask`.
pub fn names(mask: u64) -> Vec<&'static str> {
    [
        (CAP_DAC_READ_SEARCH, "CAP_DAC_READ_SEARCH"),
        (CAP_SYS_PTRACE, "CAP_SYS_PTRACE"),
        (CAP_SYS_ADMIN, "CAP_SYS_ADMIN"),
        (CAP_PERFMON, "CAP_PERFMON"),
        (CAP_BPF, "CAP_BPF"),
    ]
    .into_iter()
    .filter(|(c, _)| mask & bit(*c) != 0)
    .map(|(_, n)| n)
    .collect()
}

const fn bit(cap: u32) -> u64 {
    1 << cap
}

/// The capabilities to keep, of those `permitted`, for `needs`.
pub fn kept_set(permitted: u64, needs: Needs) -> u64 {
    let mut want = bit(CAP_SYS_PTRACE) | bit(CAP_DAC_READ_SEARCH);
    if needs.bpf_maps {
        want |= bit(CAP_BPF);
    }
    if needs.attach_later {
        want |= bit(CAP_PERFMON);
    }
    // Given SYS_ADMIN in place of BPF / PERFMON: keep it, or the probes stop.
    let missing = want & !permitted & (bit(CAP_BPF) | bit(CAP_PERFMON));
    if missing != 0 {
        want |= bit(CAP_SYS_ADMIN);
    }
    want & permitted
}

/// Drops every capability but those `needs` calls for, in every thread, and becomes `user`
/// there when one is given; returns the kept set.
pub fn keep_only(needs: Needs, user: Option<&Identity>) -> Result<u64, PrivilegeError> {
    let permitted = TaskCaps::own()
        .map_err(|source| PrivilegeError::Read {
            path: "/proc/self/status".into(),
            source,
        })?
        .permitted;
    let kept = kept_set(permitted, needs);
    let last_cap: u32 = read("/proc/sys/kernel/cap_last_cap")?
        .trim()
        .parse()
        .unwrap_or(40);
    KEEP.store(kept, Ordering::SeqCst);
    LAST_CAP.store(last_cap, Ordering::SeqCst);
    if let Some(user) = user {
        if SWITCH_TO.set(user.clone()).is_err() {
            return Err(PrivilegeError::SwitchedAlready(user.name.clone()));
        }
    }
    install_handler()?;
    let deadline = Instant::now() + Duration::from_secs(2);
    let me = gettid();
    loop {
        // This thread first: it is the one that may not be interrupted.
        let step = apply_here();
        if step != 0 {
            return Err(PrivilegeError::Syscall {
                what: STEPS[step as usize - 1],
                source: std::io::Error::last_os_error(),
            });
        }
        let behind = threads_holding_more(kept, user)?;
        if behind.is_empty() {
            return Ok(kept);
        }
        if Instant::now() > deadline {
            return Err(PrivilegeError::Threads(behind));
        }
        for tid in behind.into_iter().filter(|t| *t != me) {
            // SAFETY: tgkill(2) to a thread of this process; the handler is installed.
            unsafe {
                libc::syscall(
                    libc::SYS_tgkill,
                    libc::getpid(),
                    tid as libc::pid_t,
                    signal(),
                )
            };
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The name of the threads that keep no capability: the HTTP runtime's (its workers and its
/// blocking pool, which bcrypt runs on).
pub const UNPRIVILEGED_THREADS: &str = "gpuwatch-http";

/// The set a thread named `name` keeps of `kept`.
fn kept_by(name: &[u8], kept: u64) -> u64 {
    if name == UNPRIVILEGED_THREADS.as_bytes() {
        0
    } else {
        kept
    }
}

/// The calling thread's name (at most 15 bytes; a raw syscall, safe in a signal handler).
fn own_thread_name(buf: &mut [u8; 16]) -> &[u8] {
    // SAFETY: PR_GET_NAME writes at most 16 bytes, NUL-terminated, into the buffer given.
    if unsafe { libc::prctl(libc::PR_GET_NAME, buf.as_mut_ptr(), 0, 0, 0) } != 0 {
        return &[];
    }
    let len = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    &buf[..len]
}

static KEEP: AtomicU64 = AtomicU64::new(0);
static LAST_CAP: AtomicU32 = AtomicU32::new(40);
/// The user to become, set once before any thread is asked (the handler only reads it).
static SWITCH_TO: OnceLock<Identity> = OnceLock::new();
/// What each failing step of [`apply_here`] (its number, from 1) was.
const STEPS: [&str; 6] = [
    "capset",
    "prctl(PR_SET_NO_NEW_PRIVS)",
    "prctl(PR_SET_KEEPCAPS)",
    "setgroups",
    "setresgid",
    "setresuid",
];

fn signal() -> libc::c_int {
    // glibc keeps the first real-time signals for itself (SIGRTMIN is after them).
    libc::SIGRTMIN() + 2
}

fn install_handler() -> Result<(), PrivilegeError> {
    // SAFETY: a zeroed sigaction with a handler that makes only async-signal-safe syscalls.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = handler as *const () as usize;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(signal(), &action, std::ptr::null_mut()) != 0 {
            return Err(PrivilegeError::Syscall {
                what: "sigaction",
                source: std::io::Error::last_os_error(),
            });
        }
    }
    Ok(())
}

extern "C" fn handler(_: libc::c_int) {
    let _ = apply_here();
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAP_V3: u32 = 0x2008_0522;

/// Applies the kept set to the calling thread: bounding set (while CAP_SETPCAP is still
/// effective), ambient set, the user (keeping the permitted set across it), then
/// effective/permitted/inheritable, then no-new-privileges.
/// Raw syscalls only: it runs in a signal handler. Returns 0 or the failing step's number.
fn apply_here() -> i32 {
    let mut name = [0u8; 16];
    let keep = kept_by(own_thread_name(&mut name), KEEP.load(Ordering::SeqCst));
    let last = LAST_CAP.load(Ordering::SeqCst);
    // SAFETY: prctl and capset with valid arguments on the calling thread.
    unsafe {
        for cap in 0..=last.min(63) {
            if keep & bit(cap) == 0 {
                // EPERM without CAP_SETPCAP (a container may lack it): the bounding set then
                // stays, but permitted caps cannot come back without exec, and no-new-privs
                // stops exec from granting any.
                libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0);
            }
        }
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        );
        let switched = switch_user_here();
        if switched != 0 {
            return switched;
        }
        let mut header = CapHeader {
            version: CAP_V3,
            pid: 0,
        };
        let data = [
            CapData {
                effective: keep as u32,
                permitted: keep as u32,
                inheritable: 0,
            },
            CapData {
                effective: (keep >> 32) as u32,
                permitted: (keep >> 32) as u32,
                inheritable: 0,
            },
        ];
        if libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) != 0 {
            return 1;
        }
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return 2;
        }
    }
    0
}

/// Becomes [`SWITCH_TO`] in the calling thread, unless there is none or it already is that
/// user. Returns 0 or the failing step's number. Raw syscalls only (a signal handler), which
/// change the calling thread alone.
fn switch_user_here() -> i32 {
    let Some(user) = SWITCH_TO.get() else {
        return 0;
    };
    // SAFETY: raw credential syscalls on the calling thread, with valid arguments; `groups`
    // lives in a static that outlives the call.
    unsafe {
        // The uid changes last, so a thread already at it has switched completely.
        if libc::syscall(libc::SYS_getuid) as libc::uid_t == user.uid
            && libc::syscall(libc::SYS_geteuid) as libc::uid_t == user.uid
        {
            return 0;
        }
        if libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0 {
            return 3;
        }
        if libc::syscall(libc::SYS_setgroups, user.groups.len(), user.groups.as_ptr()) != 0 {
            return 4;
        }
        if libc::syscall(libc::SYS_setresgid, user.gid, user.gid, user.gid) != 0 {
            return 5;
        }
        if libc::syscall(libc::SYS_setresuid, user.uid, user.uid, user.uid) != 0 {
            return 6;
        }
    }
    0
}

fn gettid() -> u32 {
    // SAFETY: no preconditions.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

fn read(path: &str) -> Result<String, PrivilegeError> {
    std::fs::read_to_string(path).map_err(|source| PrivilegeError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Threads whose effective or permitted set holds more than `kept` (nothing, for
/// [`UNPRIVILEGED_THREADS`]), without no-new-privileges, or (with a `user`) with any other uid
/// or gid.
fn threads_holding_more(kept: u64, user: Option<&Identity>) -> Result<Vec<u32>, PrivilegeError> {
    let tasks = procfs::process::Process::myself()
        .and_then(|p| p.tasks())
        .map_err(|e| PrivilegeError::Read {
            path: "/proc/self/task".into(),
            source: std::io::Error::other(e.to_string()),
        })?;
    let mut behind = Vec::new();
    for task in tasks.flatten() {
        // A thread that ended meanwhile holds nothing.
        let Ok(status) = task.status() else {
            continue;
        };
        let caps = TaskCaps::of(&status);
        let kept = kept_by(status.name.as_bytes(), kept);
        let over = |set: u64| set & !kept != 0;
        let other_user = user.is_some_and(|u| {
            [status.ruid, status.euid, status.suid, status.fuid] != [u.uid; 4]
                || [status.rgid, status.egid, status.sgid, status.fgid] != [u.gid; 4]
        });
        if over(caps.effective) || over(caps.permitted) || !caps.no_new_privs || other_user {
            behind.push(task.tid as u32);
        }
    }
    Ok(behind)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: u64 = (1 << 41) - 1;

    #[test]
    fn the_http_threads_keep_nothing_and_the_others_the_kept_set() {
        let kept = bit(CAP_BPF) | bit(CAP_SYS_PTRACE);
        assert_eq!(kept_by(b"gpuwatch-http", kept), 0);
        assert_eq!(kept_by(b"gpuwatch", kept), kept);
        assert_eq!(kept_by(b"gpuwatch-docker", kept), kept);
        assert_eq!(kept_by(b"", kept), kept);
    }

    #[test]
    fn keeps_what_the_agent_still_uses_of_what_it_has() {
        let probes = Needs {
            bpf_maps: true,
            attach_later: true,
        };
        let four = bit(CAP_BPF) | bit(CAP_PERFMON) | bit(CAP_SYS_PTRACE) | bit(CAP_DAC_READ_SEARCH);
        assert_eq!(kept_set(ALL, probes), four, "root: the four, no SYS_ADMIN");
        let no_attach = Needs {
            attach_later: false,
            ..probes
        };
        assert_eq!(kept_set(ALL, no_attach), four & !bit(CAP_PERFMON));
        let none = Needs {
            bpf_maps: false,
            attach_later: false,
        };
        assert_eq!(
            kept_set(ALL, none),
            bit(CAP_SYS_PTRACE) | bit(CAP_DAC_READ_SEARCH)
        );
        // Docker 20.10's `--cap-add SYS_ADMIN`: no BPF or PERFMON to keep, so SYS_ADMIN stays.
        let docker20 = bit(CAP_SYS_ADMIN) | bit(crate::caps::CAP_SETPCAP);
        assert_eq!(kept_set(docker20, probes), bit(CAP_SYS_ADMIN));
        assert_eq!(kept_set(docker20, none), 0);
        assert_eq!(
            names(four),
            [
                "CAP_DAC_READ_SEARCH",
                "CAP_SYS_PTRACE",
                "CAP_PERFMON",
                "CAP_BPF"
            ]
        );
    }

    #[test]
    fn looks_a_user_up_by_name_or_uid() {
        let root = Identity::lookup("root").unwrap();
        assert_eq!((root.uid, root.gid), (0, 0));
        assert!(root.groups.contains(&0), "{root:?}");
        let by_uid = Identity::lookup("0").unwrap();
        assert_eq!((by_uid.uid, by_uid.gid, by_uid.groups), (0, 0, root.groups));
        let e = Identity::lookup("no-such-user-gpuwatch").unwrap_err();
        assert!(matches!(e, PrivilegeError::NoSuchUser(_)), "{e}");
        assert!(e.to_string().contains("no-such-user-gpuwatch"), "{e}");
        let e = Identity::lookup("a\0b").unwrap_err();
        assert!(e.to_string().contains("NUL"), "{e}");
    }
}
