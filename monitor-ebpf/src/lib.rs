//! Host-side stand-in of the eBPF crate: it exists so `monitor` can list it as a build-dependency
//! (cargo then rebuilds the agent when the kernel programs change). The programs themselves are
//! the `gpuwatch-probes` and `gpuwatch-cuda-probes` binaries, built for `bpfel-unknown-none` by `monitor/build.rs`.
#![no_std]
