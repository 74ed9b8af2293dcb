//! `cargo xtask gpu-bundle`: packs into `.device/` what a GPU machine without cargo, Docker or a
//! registry needs to run the checks in `tests/gpu/`:
//!
//! - `gpuwatch`, stripped (150 MB with debug info, 13 MB without), and the `sample_cost`
//!   example (a round's CPU time, per NVML call with `--per-call`), and the `probe_cost`
//!   example (what `xtask bench-probes` runs: the stall probes' cost to a loader);
//! - this `xtask`, stripped, for `xtask bench-vs-nvitop` there;
//! - `docker.tar.xz`: Debian's docker.io, containerd, runc and tini binaries, stripped, with the
//!   shared libraries dockerd and runc need that a stock GPU image lacks (`tests/gpu/docker_up.sh`
//!   starts it);
//! - `wheels/`: nvitop, for the side-by-side benchmark, and `tokenizers` (a native tokenizer
//!   with threads of its own, for `tests/gpu/real_loops.sh`).
use crate::{cargo, workspace_root};
use anyhow::{Context, Result};
use std::path::Path;
use std::process::Command;

/// Libraries dockerd and runc link that the H200 machine's image lacks (found there with ldd).
const DOCKER_LIBS: [&str; 12] = [
    "libdevmapper.so.1.02.1",
    "libsystemd.so.0",
    "libcap.so.2",
    "libgcrypt.so.20",
    "liblzma.so.5",
    "libzstd.so.1",
    "liblz4.so.1",
    "libselinux.so.1",
    "libudev.so.1",
    "libgpg-error.so.0",
    "libpcre2-8.so.0",
    "libseccomp.so.2",
];
/// (package, path in it, name in the bundle's bin/).
const DOCKER_BINS: [(&str, &str, &str); 8] = [
    ("docker.io", "usr/sbin/dockerd", "dockerd"),
    ("docker.io", "usr/bin/docker", "docker"),
    ("docker.io", "usr/sbin/docker-proxy", "docker-proxy"),
    ("containerd", "usr/bin/containerd", "containerd"),
    (
        "containerd",
        "usr/bin/containerd-shim-runc-v2",
        "containerd-shim-runc-v2",
    ),
    ("runc", "usr/sbin/runc", "runc"),
    ("tini", "usr/bin/tini-static", "docker-init"),
    ("tini", "usr/bin/tini-static", "tini-static"),
];
const NVITOP: &str = "nvitop==1.7.2";
/// A tokenizer written in Rust that encodes batches on threads of its own (abi3, any CPython
/// from 3.9: the GPU image has 3.12).
const TOKENIZERS: &str = "tokenizers==0.22.1";

/// Says what it does, then does it (failing with the command line).
fn run(cmd: &mut Command, what: &str) -> Result<()> {
    eprintln!("[gpu-bundle] {what}");
    crate::setup::run_cmd(cmd, what)
}

fn strip_to(from: &Path, to: &Path) -> Result<()> {
    run(
        Command::new("strip").arg("-o").arg(to).arg(from),
        &format!("strip {} -> {}", from.display(), to.display()),
    )
}

pub fn run_bundle() -> Result<()> {
    let root = workspace_root();
    let out = root.join(".device");
    std::fs::create_dir_all(&out)?;
    // The agent alone first, as `cargo xtask release` builds it: built with the examples, its
    // dependencies would take the examples' features too, and the code would differ.
    cargo(&["build", "--release", "-p", "gpuwatch", "--bins"])?;
    strip_to(&root.join("target/release/gpuwatch"), &out.join("gpuwatch"))?;
    cargo(&[
        "build",
        "--release",
        "-p",
        "gpuwatch",
        "--example",
        "sample_cost",
        "--example",
        "probe_cost",
    ])?;
    strip_to(
        &root.join("target/release/examples/sample_cost"),
        &out.join("sample_cost"),
    )?;
    strip_to(
        &root.join("target/release/examples/probe_cost"),
        &out.join("probe_cost"),
    )?;
    let me = std::env::current_exe().context("locating the xtask binary")?;
    strip_to(&me, &out.join("xtask"))?;
    docker_bundle(&out.join("docker.tar.xz"))?;
    let wheels = out.join("wheels");
    std::fs::create_dir_all(&wheels)?;
    download_wheel(
        &wheels,
        NVITOP,
        &[],
        "pure Python; its needs are on the GPU image",
    )?;
    download_wheel(
        &wheels,
        TOKENIZERS,
        &["--platform", "manylinux_2_17_x86_64"],
        "no registry on the GPU machine",
    )?;
    let size: u64 = std::fs::read_dir(&out)?
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum();
    eprintln!(
        "[gpu-bundle] {} ready: {:.1} MiB (plus wheels/)",
        out.display(),
        size as f64 / (1u64 << 20) as f64
    );
    Ok(())
}

/// A wheel for the GPU image's Python (3.12), without its dependencies, into `dir`.
fn download_wheel(dir: &Path, spec: &str, platform: &[&str], why: &str) -> Result<()> {
    run(
        Command::new("python3")
            .args([
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--only-binary=:all:",
                "--python-version",
                "3.12",
            ])
            .args(platform)
            .arg("-d")
            .arg(dir)
            .arg(spec),
        &format!("downloading {spec} ({why})"),
    )
}

/// Debian 12's Docker, unpacked from its packages (no registry or engine needed here), stripped.
fn docker_bundle(dest: &Path) -> Result<()> {
    let tmp = std::env::temp_dir().join(format!("gpuwatch-docker-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let (debs, tree, bundle) = (tmp.join("debs"), tmp.join("tree"), tmp.join("bundle"));
    for d in [&debs, &tree, &bundle.join("bin"), &bundle.join("lib")] {
        std::fs::create_dir_all(d)?;
    }
    run(
        Command::new("apt-get")
            .args(["download", "docker.io", "containerd", "runc", "tini"])
            .current_dir(&debs),
        "apt-get download docker.io containerd runc tini",
    )?;
    for deb in std::fs::read_dir(&debs)?.flatten() {
        run(
            Command::new("dpkg").arg("-x").arg(deb.path()).arg(&tree),
            &format!("unpacking {}", deb.file_name().to_string_lossy()),
        )?;
    }
    for (_, path, name) in DOCKER_BINS {
        strip_to(&tree.join(path), &bundle.join("bin").join(name))?;
    }
    for lib in DOCKER_LIBS {
        let from = Path::new("/lib/x86_64-linux-gnu").join(lib);
        // Follow the symlink: the bundle carries the file itself under the name the loader asks for.
        std::fs::copy(&from, bundle.join("lib").join(lib)).with_context(|| {
            format!("copying {} (is docker.io installed here?)", from.display())
        })?;
    }
    run(
        Command::new("tar")
            .arg("-C")
            .arg(&bundle)
            .args(["-cJf"])
            .arg(dest)
            .args(["bin", "lib"])
            .env("XZ_OPT", "-9"),
        &format!("packing {}", dest.display()),
    )?;
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}
