//! Builds the kernel programs (`monitor-ebpf`, target bpfel-unknown-none, nightly + bpf-linker)
//! and leaves the object in OUT_DIR, where `sources::sched_probe` embeds it.
#[path = "build/hot_code.rs"]
mod hot_code;

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
    // The build date (UTC), for `--version`: SOURCE_DATE_EPOCH where set (reproducible builds),
    // else the build's own clock.
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    let epoch = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        });
    println!("cargo:rustc-env=GPUWATCH_BUILD_DATE={}", civil_date(epoch));
    let head = concat!(env!("CARGO_MANIFEST_DIR"), "/../.git/HEAD");
    if std::path::Path::new(head).exists() {
        println!("cargo:rerun-if-changed={head}");
        println!(
            "cargo:rerun-if-changed={}",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../.git/refs/heads")
        );
    }
    link_hot_code_first()?;
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

/// Release builds link the functions `serve` runs (hot-code.txt, made by `cargo xtask
/// hot-code`) together, ahead of the rest of the code: the kernel maps an installed binary's
/// pages 64 KiB around each fault, so run code spread through the binary makes most of it
/// resident. A linker script placed before `.text` (`INSERT`, so the default layout stays)
/// gathers their sections; names the build does not have match nothing. With
/// `GPUWATCH_HOT_CODE_PROFILE=1` (set by `cargo xtask hot-code` only) each listed function is
/// put on pages of its own instead, so that the profile tells which of them ran.
fn link_hot_code_first() -> anyhow::Result<()> {
    let list = concat!(env!("CARGO_MANIFEST_DIR"), "/hot-code.txt");
    println!("cargo:rerun-if-changed={list}");
    println!("cargo:rerun-if-env-changed={}", hot_code::PROFILE_LAYOUT);
    let layout = match std::env::var(hot_code::PROFILE_LAYOUT).as_deref() {
        Ok("1") => hot_code::Layout::PagePerFunction,
        _ => hot_code::Layout::Packed,
    };
    let release = std::env::var("PROFILE").as_deref() == Ok("release");
    let linux = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux");
    if !release || !linux {
        return Ok(());
    }
    let text = match std::fs::read_to_string(list) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => anyhow::bail!("{list}: {e}"),
    };
    let script = hot_code::script(&text, layout).map_err(|e| anyhow::anyhow!("{list}:{e}"))?;
    let Some(script) = script else {
        return Ok(());
    };
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("hot-code.ld");
    std::fs::write(&out, script)?;
    println!("cargo:rustc-link-arg-bins=-Wl,-T,{}", out.display());
    Ok(())
}

/// `YYYY-MM-DD` of a Unix time (UTC), by Howard Hinnant's days-from-civil inverse.
fn civil_date(unix_seconds: u64) -> String {
    let z = (unix_seconds / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}
