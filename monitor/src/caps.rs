//! Capabilities: the numbers gpuwatch names, and the sets in `/proc/<pid>/status`, to say
//! exactly what is missing when eBPF cannot load and to keep only what is needed once started.

pub const CAP_DAC_READ_SEARCH: u32 = 2;
pub const CAP_SETPCAP: u32 = 8;
pub const CAP_SYS_PTRACE: u32 = 19;
pub const CAP_SYS_ADMIN: u32 = 21;
pub const CAP_PERFMON: u32 = 38;
pub const CAP_BPF: u32 = 39;

/// Effective capability set of this process, from `/proc/self/status`.
pub fn effective() -> std::io::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    parse_cap_eff(&status)
        .ok_or_else(|| std::io::Error::other("no CapEff line in /proc/self/status"))
}

pub fn parse_cap_eff(status: &str) -> Option<u64> {
    status_set(status, "CapEff:")
}

/// A capability set of a `status` file (`CapEff:`, `CapPrm:`, `CapBnd:`), as a bit mask.
pub fn status_set(status: &str, name: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
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
        assert_eq!(
            parse_cap_eff("Name:\tx\nCapEff:\t000001ffffffffff\n"),
            Some(0x1ff_ffff_ffff)
        );
    }
}
