//! `/proc/self/mountinfo`: any text gives a cgroup layout, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let layout = gpuwatch::sources::host::cgroup::CgroupLayout::from_mountinfo(text);
    let _ = layout.v1_mount("cpu");
});
