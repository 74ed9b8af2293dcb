//! What building against an older glibc needs: zig (the C toolchain and the glibc stubs of any
//! version) and cargo-zigbuild (which hands cargo's link step to it). zig comes from PyPI's
//! `ziglang` wheel, the one package registry these machines reach that ships it; the wheel is
//! pinned by its SHA-256.
use crate::setup::{download_verified, run_cmd};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

const ZIG_VERSION: &str = "0.13.0";
const ZIG_WHEEL: &str = "https://files.pythonhosted.org/packages/0c/b7/ecfdce6368cc3664d301f7f52db4fe1004aa7da7a12c4a9bf1de534ff6ab/ziglang-0.13.0-py3-none-manylinux_2_12_x86_64.manylinux2010_x86_64.musllinux_1_1_x86_64.whl";
const ZIG_WHEEL_SHA256: &str = "3ce0c9f16547e5d61b32e0d226926e9a2552ef4b91fccf7ab5ea1a623a77824b";
const CARGO_ZIGBUILD_VERSION: &str = "0.24.1";

fn say(msg: &str) {
    eprintln!("[setup] {msg}");
}

/// Installs what is missing; returns the folder holding `zig`, for PATH.
pub fn ensure() -> Result<PathBuf> {
    if std::env::consts::ARCH != "x86_64" {
        bail!(
            "building for an older glibc is set up for x86_64 hosts only (this is {})",
            std::env::consts::ARCH
        );
    }
    let zig_dir = zig()?;
    cargo_zigbuild()?;
    Ok(zig_dir)
}

fn zig() -> Result<PathBuf> {
    let home = std::env::var_os("HOME").context("HOME is not set")?;
    let dir = Path::new(&home).join(format!(".cache/gpuwatch/zig-{ZIG_VERSION}"));
    let zig_dir = dir.join("ziglang");
    if zig_dir.join("zig").is_file() {
        say(&format!("zig {ZIG_VERSION}: present"));
        return Ok(zig_dir);
    }
    say(&format!(
        "fetching zig {ZIG_VERSION} (PyPI's ziglang wheel)"
    ));
    std::fs::create_dir_all(&dir)?;
    let wheel = dir.join("ziglang.whl");
    download_verified(ZIG_WHEEL, &wheel, ZIG_WHEEL_SHA256)?;
    run_cmd(
        Command::new("unzip")
            .args(["-q", "-o"])
            .arg(&wheel)
            .arg("ziglang/*")
            .arg("-d")
            .arg(&dir),
        "unpacking the ziglang wheel",
    )?;
    let _ = std::fs::remove_file(&wheel);
    let zig = zig_dir.join("zig");
    run_cmd(
        Command::new("chmod").arg("+x").arg(&zig),
        "making zig executable",
    )?;
    Ok(zig_dir)
}

fn cargo_zigbuild() -> Result<()> {
    let version = Command::new("cargo-zigbuild")
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    if version.is_some_and(|v| v.contains(CARGO_ZIGBUILD_VERSION)) {
        say(&format!("cargo-zigbuild {CARGO_ZIGBUILD_VERSION}: present"));
        return Ok(());
    }
    say(&format!(
        "building cargo-zigbuild {CARGO_ZIGBUILD_VERSION} (about two minutes)"
    ));
    run_cmd(
        Command::new("cargo").args([
            "install",
            "--locked",
            "cargo-zigbuild",
            "--version",
            CARGO_ZIGBUILD_VERSION,
        ]),
        "building cargo-zigbuild",
    )
}
