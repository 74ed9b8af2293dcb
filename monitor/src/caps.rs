//! Capabilities: the numbers gpuwatch names, and the sets in `/proc/<pid>/status`, to say
//! exactly what is missing when eBPF cannot load and to keep only what is needed once started.

pub const CAP_DAC_READ_SEARCH: u32 = 2;
pub const CAP_SETPCAP: u32 = 8;
pub const CAP_SYS_PTRACE: u32 = 19;
pub const CAP_SYS_ADMIN: u32 = 21;
pub const CAP_PERFMON: u32 = 38;
pub const CAP_BPF: u32 = 39;

/// The capability sets of a task and its no-new-privileges bit, from its `status` (through
/// procfs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskCaps {
    pub effective: u64,
    pub permitted: u64,
    pub no_new_privs: bool,
}

impl TaskCaps {
    pub fn of(status: &procfs::process::Status) -> Self {
        Self {
            effective: status.capeff,
            permitted: status.capprm,
            no_new_privs: status.nonewprivs == Some(1),
        }
    }

    /// This process's (its main thread's) sets.
    pub fn own() -> std::io::Result<Self> {
        let status = procfs::process::Process::myself()
            .and_then(|p| p.status())
            .map_err(|e| std::io::Error::other(format!("/proc/self/status: {e}")))?;
        Ok(Self::of(&status))
    }
}

/// Effective capability set of this process.
pub fn effective() -> std::io::Result<u64> {
    TaskCaps::own().map(|c| c.effective)
}

/// Names of the capabilities that loading and attaching tracepoint programs needs but `caps`
/// lacks: CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN which implies both.
pub fn missing_for_tracing(caps: u64) -> Vec<&'static str> {
    let has = |c: u32| caps & (1 << c) != 0;
    if has(CAP_SYS_ADMIN) {
        return Vec::new();
    }
    let mut missing = Vec::new();
    if !has(CAP_BPF) {
        missing.push("CAP_BPF");
    }
    if !has(CAP_PERFMON) {
        missing.push("CAP_PERFMON");
    }
    missing
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_what_is_missing() {
        assert!(missing_for_tracing(1 << CAP_SYS_ADMIN).is_empty());
        assert!(missing_for_tracing((1 << CAP_BPF) | (1 << CAP_PERFMON)).is_empty());
        assert_eq!(missing_for_tracing(1 << CAP_BPF), vec!["CAP_PERFMON"]);
        assert_eq!(missing_for_tracing(0), vec!["CAP_BPF", "CAP_PERFMON"]);
    }

    #[test]
    fn this_process_sets_are_its_status_lines() {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = |name: &str| {
            let v = status.lines().find_map(|l| l.strip_prefix(name)).unwrap();
            u64::from_str_radix(v.trim(), 16).unwrap()
        };
        let own = TaskCaps::own().unwrap();
        assert_eq!(own.effective, line("CapEff:"));
        assert_eq!(own.permitted, line("CapPrm:"));
        assert_eq!(effective().unwrap(), line("CapEff:"));
    }
}
