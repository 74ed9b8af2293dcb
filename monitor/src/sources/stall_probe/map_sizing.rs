//! How many entries the per-CPU task maps get. Each entry of an LRU per-CPU hash holds one value
//! per *possible* CPU, preallocated at load: at 8,192 entries the three task maps
//! (`TASK_TIMES`, `READ_STATS`, `DISK_STATS`) would take ~440 MB of kernel memory on a
//! 128-CPU host and ~880 MB at 256. So the entry count is the most that fits a fixed budget, up
//! to [`TASK_MAP_ENTRIES`]; what does not fit is evicted (LRU) and counted as
//! `probe_entries_evicted` when a counter goes backwards.
use monitor_common::{IoStats, TaskKey, TaskTimes, TASK_MAP_ENTRIES};

/// Kernel memory the three per-CPU task maps may take together.
pub const PER_CPU_MAPS_BUDGET_BYTES: u64 = 64 << 20;
/// Below this the maps would not hold one busy job's processes; the budget gives way.
pub const MIN_TASK_ENTRIES: u32 = 256;
/// The kernel's per-element overhead in a preallocated LRU hash: the element header
/// (`htab_elem`: list node, hash, LRU node and the per-CPU pointer) before the key.
const ELEMENT_HEADER_BYTES: u64 = 80;

const fn round8(n: usize) -> u64 {
    n.div_ceil(8) as u64 * 8
}

/// Kernel bytes of the three task maps at `entries` each on `possible_cpus` CPUs.
pub fn task_maps_bytes(entries: u32, possible_cpus: u32) -> u64 {
    let element = ELEMENT_HEADER_BYTES + round8(size_of::<TaskKey>());
    let per_cpu = round8(size_of::<TaskTimes>()) + 2 * round8(size_of::<IoStats>());
    u64::from(entries) * (3 * element + per_cpu * u64::from(possible_cpus))
}

/// Entries per task map on a host with `possible_cpus` possible CPUs.
pub fn task_entries(possible_cpus: u32) -> u32 {
    let one = task_maps_bytes(1, possible_cpus.max(1));
    let fit = PER_CPU_MAPS_BUDGET_BYTES / one;
    u32::try_from(fit)
        .unwrap_or(u32::MAX)
        .clamp(MIN_TASK_ENTRIES, TASK_MAP_ENTRIES)
}

/// Entries per task map on this host (one CPU assumed where the possible CPUs cannot be read).
pub fn task_entries_here() -> u32 {
    let cpus = super::batch::possible_cpus().and_then(|c| u32::try_from(c).ok());
    task_entries(cpus.unwrap_or(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_hosts_keep_every_entry_and_large_ones_stay_within_the_budget() {
        // This VM (2) and the H200 host (16): the full maps fit.
        assert_eq!(task_entries(2), TASK_MAP_ENTRIES);
        assert_eq!(task_entries(16), TASK_MAP_ENTRIES);
        for cpus in [64, 128, 256, 512] {
            let n = task_entries(cpus);
            assert!(n < TASK_MAP_ENTRIES, "{cpus} CPUs: {n}");
            assert!(
                task_maps_bytes(n, cpus) <= PER_CPU_MAPS_BUDGET_BYTES,
                "{cpus} CPUs: {n}"
            );
            assert!(
                task_maps_bytes(n + 1, cpus) > PER_CPU_MAPS_BUDGET_BYTES,
                "{cpus}: {n}"
            );
        }
        // The full maps at 128 CPUs: what the budget saves.
        let full = task_maps_bytes(TASK_MAP_ENTRIES, 128);
        assert!((400 << 20..500 << 20).contains(&full), "{full}");
        // The floor wins over the budget only on enormous hosts.
        assert_eq!(task_entries(8192), MIN_TASK_ENTRIES);
    }
}
