//! `/proc/<pid>/stat` as each round reads it (the state and CPU time of GPU processes): any
//! bytes (a process names itself with prctl) give the fields or nothing, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = gpuwatch::sources::host::proc_stat::parse(data);
});
