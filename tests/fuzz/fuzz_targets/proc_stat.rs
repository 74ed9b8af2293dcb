//! `/proc/<pid>/stat`: any bytes (a process names itself with prctl) give the name and start
//! time or nothing, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = gpuwatch::sampler::attribution::parse_stat(data);
});
