//! The kernel BTF reader: any bytes give the scheduler offsets or an error, never a panic or
//! a read out of bounds.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    if let Ok(btf) = gpuwatch::sources::stall_probe::kernel_btf::KernelBtf::parse(data.to_vec(), Path::new("fuzz.btf")) {
        let _ = btf.member_offset("task_struct", &["sched_info", "run_delay"]);
        let _ = btf.member_offset("rq", &["clock"]);
    }
});
