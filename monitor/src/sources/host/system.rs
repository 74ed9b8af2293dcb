//! The host's own facts from `/proc/sys`.

/// The host's name, empty where it cannot be read.
pub fn hostname() -> String {
    read_trimmed("/proc/sys/kernel/hostname")
}

/// The running kernel's release, empty where it cannot be read.
pub fn kernel_release() -> String {
    read_trimmed("/proc/sys/kernel/osrelease")
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
