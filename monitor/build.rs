//! Builds the kernel programs (`monitor-ebpf`, target bpfel-unknown-none, nightly + bpf-linker)
//! and leaves the object in OUT_DIR, where `sources::sched_probe` embeds it.
fn main() -> anyhow::Result<()> {
    // The revision, for `--version` and `gpuwatch_build_info`.
    let revision = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=GPUWATCH_REVISION={revision}");
    let head = concat!(env!("CARGO_MANIFEST_DIR"), "/../.git/HEAD");
    if std::path::Path::new(head).exists() {
        println!("cargo:rerun-if-changed={head}");
        println!(
            "cargo:rerun-if-changed={}",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../.git/refs/heads")
        );
    }
    let package = aya_build::Package {
        name: "monitor-ebpf",
        root_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../monitor-ebpf"),
        ..Default::default()
    };
    // The pinned nightly of monitor-ebpf/rust-toolchain.toml (see there why it is pinned).
    let pin = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../monitor-ebpf/rust-toolchain.toml"
    );
    println!("cargo:rerun-if-changed={pin}");
    let text = std::fs::read_to_string(pin)?;
    let channel = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("channel = "))
        .map(|c| c.trim_matches('"').to_owned())
        .ok_or_else(|| anyhow::anyhow!("{pin}: no channel"))?;
    aya_build::build_ebpf([package], aya_build::Toolchain::Custom(&channel))
}
