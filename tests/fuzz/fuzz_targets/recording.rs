//! The recording reader (`gpuwatch plot` / `report`): any bytes give a recording or an error
//! that names the file, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = gpuwatch::recording::parse(data, Path::new("fuzz.csv")) {
        assert!(e.to_string().contains("fuzz.csv"), "{e}");
    }
});
