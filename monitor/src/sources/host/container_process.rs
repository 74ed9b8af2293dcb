//! What a container's processes see and hold, from their `/proc` entries: the `/dev/shm` mount
//! (`mountinfo`, a `statvfs` through `root/`), the memlock limit (`limits`), locked pages
//! (`status`) and the main thread's children (`task/<pid>/children`).
use super::HostReadError;
use std::path::Path;

/// Whether the process sees a `/dev/shm` mount.
pub fn shm_mounted(proc_root: &Path, pid: u32) -> Result<bool, HostReadError> {
    let path = proc_root.join(pid.to_string()).join("mountinfo");
    let text =
        std::fs::read_to_string(&path).map_err(|source| HostReadError::Read { path, source })?;
    Ok(text
        .lines()
        .any(|l| l.split(' ').nth(4) == Some("/dev/shm")))
}

/// Size and use of the `/dev/shm` the process sees, in bytes.
pub fn shm_use(proc_root: &Path, pid: u32) -> Result<(u64, u64), HostReadError> {
    let path = proc_root.join(pid.to_string()).join("root/dev/shm");
    let st = statvfs(&path).map_err(|source| HostReadError::Statvfs { path, source })?;
    let frsize = st.f_frsize;
    Ok((
        st.f_blocks.saturating_mul(frsize),
        st.f_blocks
            .saturating_sub(st.f_bfree)
            .saturating_mul(frsize),
    ))
}

fn statvfs(path: &Path) -> std::io::Result<libc::statvfs> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a NUL-terminated path and `st` is written by the call before it is read.
    if unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it filled `st`.
    Ok(unsafe { st.assume_init() })
}

/// The process's `Max locked memory` (soft, hard); `None` = unlimited.
pub fn memlock_limit(
    proc_root: &Path,
    pid: u32,
) -> Result<(Option<u64>, Option<u64>), HostReadError> {
    let path = proc_root.join(pid.to_string()).join("limits");
    let text = std::fs::read_to_string(&path).map_err(|source| HostReadError::Read {
        path: path.clone(),
        source,
    })?;
    parse_memlock(&text).ok_or(HostReadError::Unparsed {
        path,
        what: "no readable \"Max locked memory\" line",
    })
}

/// `VmLck` + `VmPin` of the process, in bytes; `None` when it is gone.
pub fn locked_bytes(proc_root: &Path, pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(proc_root.join(pid.to_string()).join("status")).ok()?;
    Some(locked_kib(&status) * 1024)
}

/// The children of the process's main thread; empty when it is gone.
pub fn main_thread_children(proc_root: &Path, pid: u32) -> Vec<u32> {
    std::fs::read_to_string(proc_root.join(format!("{pid}/task/{pid}/children")))
        .map(|t| {
            t.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// `(soft, hard)` of the `Max locked memory` line of `/proc/<pid>/limits`; `None` = unlimited.
fn parse_memlock(limits: &str) -> Option<(Option<u64>, Option<u64>)> {
    let rest = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max locked memory"))?;
    let mut it = rest.split_whitespace();
    let value = |v: &str| match v {
        "unlimited" => Some(None),
        n => n.parse::<u64>().ok().map(Some),
    };
    Some((value(it.next()?)?, value(it.next()?)?))
}

fn locked_kib(status: &str) -> u64 {
    status
        .lines()
        .filter_map(|l| {
            l.strip_prefix("VmLck:")
                .or_else(|| l.strip_prefix("VmPin:"))
        })
        .filter_map(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memlock_and_locked_pages_from_proc() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1048576              1048576              files\n\
                      Max locked memory         8388608              unlimited            bytes\n";
        assert_eq!(parse_memlock(limits), Some((Some(8 << 20), None)));
        assert_eq!(parse_memlock("Max open files 1 1 files\n"), None);
        assert_eq!(
            locked_kib("Name:\tpython\nVmLck:\t     128 kB\nVmPin:\t      64 kB\n"),
            192
        );
    }

    #[test]
    fn shm_of_a_real_process() {
        // This test process's own view: /dev/shm is a tmpfs mount on Debian and in containers.
        let me = std::process::id();
        if shm_mounted(Path::new("/proc"), me).unwrap() {
            let (size, used) = shm_use(Path::new("/proc"), me).unwrap();
            assert!(size > 0 && used <= size, "{size} {used}");
        } else {
            assert!(!std::fs::read_to_string("/proc/self/mountinfo")
                .unwrap()
                .contains(" /dev/shm "));
        }
    }
}
