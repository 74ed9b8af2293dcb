//! Builds the kernel programs (`monitor-ebpf`, target bpfel-unknown-none, nightly + bpf-linker)
//! and leaves the object in OUT_DIR, where `sources::sched_probe` embeds it.
fn main() -> anyhow::Result<()> {
    let package = aya_build::Package {
        name: "monitor-ebpf",
        root_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../monitor-ebpf"),
        ..Default::default()
    };
    aya_build::build_ebpf([package], aya_build::Toolchain::default())
}
