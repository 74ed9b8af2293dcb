//! `cargo xtask image`: the agent's container image, built offline. There is no registry to pull
//! `deploy/Dockerfile`'s base from, so the base is made here from Debian's own packages
//! (debootstrap, minbase) and tagged with the Dockerfile's `FROM`; against a registry the same
//! Dockerfile builds on the published base.
use crate::setup::{apt_install, is_root, run_cmd};
use crate::{cargo, workspace_root};
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::{Command, Stdio};

fn say(msg: &str) {
    eprintln!("[image] {msg}");
}

/// The Dockerfile's `FROM`.
pub const BASE: &str = "debian:bookworm-slim";
const SUITE: &str = "bookworm";
const MIRROR: &str = "http://deb.debian.org/debian";

/// Builds the release binary and `gpuwatch:<version>` and `gpuwatch:latest` on it.
pub fn run() -> Result<()> {
    base()?;
    cargo(&["build", "--release", "-p", "gpuwatch", "--bin", "gpuwatch"])?;
    let root = workspace_root();
    let context = root.join("target/image");
    std::fs::create_dir_all(&context).context("creating target/image")?;
    let bin = context.join("gpuwatch");
    std::fs::copy(root.join("target/release/gpuwatch"), &bin)
        .context("copying the release binary into target/image")?;
    run_cmd(Command::new("strip").arg(&bin), "strip gpuwatch")?;
    let version = env!("CARGO_PKG_VERSION");
    build(
        &context,
        &[&format!("gpuwatch:{version}"), "gpuwatch:latest"],
    )?;
    say(&format!("built gpuwatch:{version} and gpuwatch:latest"));
    Ok(())
}

/// `docker build` of deploy/Dockerfile on `context` (a folder with the `gpuwatch` binary).
pub fn build(context: &Path, tags: &[&str]) -> Result<()> {
    let mut cmd = Command::new("docker");
    cmd.arg("build")
        .arg("-f")
        .arg(workspace_root().join("deploy/Dockerfile"));
    for t in tags {
        cmd.args(["-t", t]);
    }
    run_cmd(cmd.arg(context), "docker build")
}

/// Makes the base image from Debian's packages unless the engine has it already.
pub fn base() -> Result<()> {
    if present(BASE) {
        say(&format!("{BASE}: present"));
        return Ok(());
    }
    if !is_root() {
        bail!("making {BASE} with debootstrap needs root; run `sudo cargo xtask image`");
    }
    if Command::new("sh")
        .args(["-c", "command -v debootstrap"])
        .stdout(Stdio::null())
        .status()
        .map_or(true, |s| !s.success())
    {
        say("installing debootstrap with apt-get");
        apt_install(&["debootstrap"])?;
    }
    let dir = std::env::temp_dir().join(format!("gpuwatch-base-{}", std::process::id()));
    let made = make_base(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    made?;
    say(&format!("{BASE}: made from Debian's packages and tagged"));
    Ok(())
}

/// debootstrap into `dir`, then `docker import` of it as [`BASE`].
fn make_base(dir: &Path) -> Result<()> {
    say(&format!(
        "no registry here: making {BASE} locally (debootstrap --variant=minbase {SUITE} from {MIRROR})"
    ));
    run_cmd(
        Command::new("debootstrap")
            .args(["--variant=minbase", SUITE])
            .arg(dir)
            .arg(MIRROR)
            .stdout(Stdio::null()),
        "debootstrap",
    )?;
    // What a slim image leaves out: package caches and lists.
    for d in ["var/cache/apt/archives", "var/lib/apt/lists"] {
        for e in std::fs::read_dir(dir.join(d))
            .into_iter()
            .flatten()
            .flatten()
        {
            if e.path().is_file() {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    let mut tar = Command::new("tar")
        .arg("-C")
        .arg(dir)
        .args(["-c", "."])
        .stdout(Stdio::piped())
        .spawn()
        .context("starting tar")?;
    let stdout = tar.stdout.take().context("tar's output")?;
    run_cmd(
        Command::new("docker")
            .args(["import", "--change", "CMD [\"bash\"]", "-", BASE])
            .stdin(stdout),
        "docker import",
    )?;
    let status = tar.wait().context("waiting for tar")?;
    if !status.success() {
        bail!("tar of the base's root failed ({status})");
    }
    Ok(())
}

fn present(image: &str) -> bool {
    Command::new("docker")
        .args(["image", "inspect", image])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
