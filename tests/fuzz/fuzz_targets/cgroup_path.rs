//! Cgroup path classification: any path gives a workload, and a container id it names is a
//! 64-hex id that appears in the path.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|path: &str| {
    let id = gpuwatch::sources::host::cgroup::classify(path);
    if let Some(container) = id.container_id() {
        assert_eq!(container.len(), 64, "{path:?} -> {id}");
        assert!(path.contains(container), "{path:?} -> {id}");
    }
});
