//! The host's own facts from `/proc/sys`.

/// The host's name, empty where it cannot be read.
pub fn hostname() -> String {
    read_trimmed("/proc/sys/kernel/hostname")
}

/// The running kernel's release, empty where it cannot be read.
pub fn kernel_release() -> String {
    read_trimmed("/proc/sys/kernel/osrelease")
}

/// The host's online CPUs (not the agent's own affinity or quota); `None` where the count
/// cannot be had.
pub fn online_cpus() -> Option<u32> {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    u32::try_from(n).ok().filter(|n| *n > 0)
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// Hands the allocator's free pages back to the kernel (glibc keeps them otherwise).
pub fn trim_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: no preconditions; only returns free heap pages to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    /// The count is the kernel's list of online CPUs (`0-1,4-7` counts 6), whatever this
    /// process's affinity.
    #[test]
    fn online_cpus_counts_the_kernels_online_list() {
        let list = std::fs::read_to_string("/sys/devices/system/cpu/online").expect("sysfs");
        let mut expected = 0u32;
        for range in list.trim().split(',') {
            let (a, b) = range.split_once('-').unwrap_or((range, range));
            let (a, b): (u32, u32) = (a.parse().expect("a CPU"), b.parse().expect("a CPU"));
            expected += b - a + 1;
        }
        assert_eq!(super::online_cpus(), Some(expected));
    }
}
