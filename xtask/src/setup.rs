//! `cargo xtask setup`: each step checks first and acts only when needed.
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// cargo-deny release the dependency checks (deny.toml) are written for.
pub(crate) const CARGO_DENY_VERSION: &str = "0.20.2";
/// bpf-linker release known to build here against the pinned nightly's LLVM (21–23 only).
const BPF_LINKER_VERSION: &str = "0.13.0";
const DOCKER_SOCKET: &str = "/var/run/docker.sock";

/// What the machine is being set up for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// Building and running gpuwatch: the toolchains, bpf-linker, a C compiler, tracefs.
    Run,
    /// Also the tests' own dependencies: Docker (installed and started), busybox-static,
    /// Prometheus, tmux, kubectl, Helm, VictoriaMetrics, cargo-deny.
    Test,
}

pub fn run(purpose: Purpose) -> Result<()> {
    debian_packages("build tools", BUILD_PACKAGES)?;
    userspace_components()?;
    rust_src()?;
    bpf_linker()?;
    tracefs()?;
    if purpose == Purpose::Test {
        debian_packages("test dependencies", TEST_PACKAGES)?;
        crate::helm_tool::ensure()?;
        cargo_deny()?;
        dockerd()?;
    }
    say("ready");
    Ok(())
}

/// A running Docker engine (installed from Debian when missing), for the image build.
pub fn docker() -> Result<()> {
    debian_packages("Docker", &[("dockerd", "docker.io")])?;
    dockerd()
}

/// A running Docker engine and busybox-static, for the demo's containers.
pub fn demo() -> Result<()> {
    debian_packages(
        "the demo",
        &[("dockerd", "docker.io"), ("busybox", "busybox-static")],
    )?;
    dockerd()
}

/// (command, Debian package): what building needs — bpf-linker and the agent link with cc.
const BUILD_PACKAGES: &[(&str, &str)] = &[("cc", "gcc"), ("pkg-config", "pkg-config")];

/// (command, Debian package): dockerd for the end-to-end tests; busybox-static for the offline
/// test image; Prometheus (and its promtool) to scrape `gpuwatch serve` and check deploy/'s
/// rules; tmux to drive `gpuwatch top`; kubectl to render deploy/kubernetes; VictoriaMetrics
/// for the fleet test's remote_write; Podman, whose Docker-compatible service the agent must
/// name as Podman; headless Chromium to load `serve`'s web page as a browser does; containerd
/// (and its `ctr`) to run a task as Kubernetes' CRI plugin does; Compose v1 (`docker-compose`)
/// to start the agent from deploy/compose.docker20.yaml.
const TEST_PACKAGES: &[(&str, &str)] = &[
    ("dockerd", "docker.io"),
    ("busybox", "busybox-static"),
    ("prometheus", "prometheus"),
    ("promtool", "prometheus"),
    ("tmux", "tmux"),
    ("kubectl", "kubernetes-client"),
    ("victoria-metrics", "victoria-metrics"),
    ("podman", "podman"),
    ("chromium-headless-shell", "chromium-headless-shell"),
    ("containerd", "containerd"),
    ("ctr", "containerd"),
    ("docker-compose", "docker-compose"),
];

fn say(msg: &str) {
    eprintln!("[setup] {msg}");
}

pub(crate) fn is_root() -> bool {
    // SAFETY: no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn output(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd)
        .args(args)
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

pub(crate) fn run_cmd(cmd: &mut Command, what: &str) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("{what}: cannot start {cmd:?}"))?;
    if !status.success() {
        bail!("{what} failed ({status}): {cmd:?}");
    }
    Ok(())
}

/// The toolchain in rust-toolchain.toml is installed by rustup at the first `cargo` call, with
/// its components; one installed before without them gets them here (fmt and clippy run in the
/// tests).
fn userspace_components() -> Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let channel = channel_of(&root.join("rust-toolchain.toml"))?;
    let installed = output(
        "rustup",
        &["component", "list", "--toolchain", &channel, "--installed"],
    )
    .unwrap_or_default();
    let missing: Vec<&str> = ["clippy", "rustfmt"]
        .into_iter()
        .filter(|c| !installed.lines().any(|l| l.starts_with(c)))
        .collect();
    if missing.is_empty() {
        say(&format!("{channel} clippy, rustfmt: present"));
        return Ok(());
    }
    say(&format!("adding {} to {channel}", missing.join(", ")));
    run_cmd(
        Command::new("rustup")
            .args(["component", "add", "--toolchain", &channel])
            .args(&missing),
        "adding toolchain components",
    )
}

/// The kernel programs' toolchain: the dated nightly pinned in monitor-ebpf/rust-toolchain.toml.
pub(crate) fn ebpf_toolchain() -> Result<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    channel_of(&root.join("monitor-ebpf/rust-toolchain.toml"))
}

fn channel_of(file: &Path) -> Result<String> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    text.lines()
        .find_map(|l| l.trim().strip_prefix("channel = "))
        .map(|c| c.trim_matches('"').to_owned())
        .with_context(|| format!("{}: no channel", file.display()))
}

/// The eBPF crate's nightly with `rust-src` (it builds core from source) and clippy (its code is
/// linted like the rest); one installed before without clippy gets it here.
fn rust_src() -> Result<()> {
    let nightly = ebpf_toolchain()?;
    let installed = output(
        "rustup",
        &["component", "list", "--toolchain", &nightly, "--installed"],
    );
    let has = |c: &str| {
        installed
            .as_deref()
            .is_some_and(|s| s.lines().any(|l| l.starts_with(c)))
    };
    if has("rust-src") && has("clippy") {
        say(&format!("{nightly} rust-src, clippy: present"));
        return Ok(());
    }
    if has("rust-src") {
        say(&format!(
            "adding clippy to {nightly} (the eBPF crate is linted)"
        ));
        return run_cmd(
            Command::new("rustup").args(["component", "add", "clippy", "--toolchain", &nightly]),
            "adding clippy to the pinned nightly",
        );
    }
    say(&format!(
        "installing {nightly} with rust-src (the eBPF programs build core from source) and clippy"
    ));
    run_cmd(
        Command::new("rustup").args([
            "toolchain",
            "install",
            &nightly,
            "--profile",
            "minimal",
            "--component",
            "rust-src",
            "--component",
            "clippy",
        ]),
        "installing the pinned nightly",
    )
}

/// cargo-deny, which `cargo xtask test` runs on the dependency tree (deny.toml).
fn cargo_deny() -> Result<()> {
    if output("cargo-deny", &["--version"]).is_some_and(|v| v.contains(CARGO_DENY_VERSION)) {
        say(&format!("cargo-deny {CARGO_DENY_VERSION}: present"));
        return Ok(());
    }
    say(&format!(
        "building cargo-deny {CARGO_DENY_VERSION} (a few minutes)"
    ));
    run_cmd(
        Command::new("cargo").args([
            "install",
            "--locked",
            "cargo-deny",
            "--version",
            CARGO_DENY_VERSION,
        ]),
        "building cargo-deny",
    )
}

fn bpf_linker() -> Result<()> {
    if let Some(v) = output("bpf-linker", &["--version"]) {
        if v.contains(BPF_LINKER_VERSION) {
            say(&format!("bpf-linker {BPF_LINKER_VERSION}: present"));
            return Ok(());
        }
    }
    let nightly = ebpf_toolchain()?;
    say(&format!(
        "building bpf-linker {BPF_LINKER_VERSION} against {nightly}'s LLVM (about a minute)"
    ));
    let sysroot = output("rustc", &[&format!("+{nightly}"), "--print", "sysroot"])
        .with_context(|| format!("rustc +{nightly} --print sysroot"))?;
    let lib = Path::new(sysroot.trim()).join("lib");
    let llvm = std::fs::read_dir(&lib)
        .with_context(|| format!("listing {}", lib.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libLLVM.so"))
        })
        .with_context(|| {
            format!(
                "no libLLVM.so in {}: is the pinned nightly complete?",
                lib.display()
            )
        })?;
    let link_dir = std::env::temp_dir().join("gpuwatch-llvm-link");
    std::fs::create_dir_all(&link_dir)?;
    let link = link_dir.join("libLLVM.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&llvm, &link)
        .with_context(|| format!("linking {}", link.display()))?;
    let major = llvm
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("libLLVM.so."))
        .and_then(|v| v.split(['.', '-']).next())
        .context("cannot read LLVM's major version from its file name")?
        .to_owned();
    let rustflags = format!(
        "-L {} -C link-arg=-Wl,-rpath,{}",
        link_dir.display(),
        lib.display()
    );
    run_cmd(
        Command::new("cargo")
            .args([
                "install",
                "bpf-linker",
                "--version",
                BPF_LINKER_VERSION,
                "--no-default-features",
                "--features",
                &format!("llvm-{major}"),
            ])
            .env("RUSTFLAGS", rustflags),
        "building bpf-linker",
    )
}

pub(crate) fn debian_packages(what: &str, wanted: &[(&str, &str)]) -> Result<()> {
    let mut missing: Vec<&str> = wanted
        .iter()
        .filter(|(bin, _)| output("sh", &["-c", &format!("command -v {bin}")]).is_none())
        .map(|(_, pkg)| *pkg)
        .collect();
    missing.dedup();
    if missing.is_empty() {
        say(&format!("{what}: present"));
        return Ok(());
    }
    if !is_root() {
        bail!(
            "installing {} needs root (apt-get); run `sudo cargo xtask setup`",
            missing.join(", ")
        );
    }
    say(&format!("installing {} with apt-get", missing.join(", ")));
    apt_install(&missing)
}

/// `url` saved as `dest` (curl), kept only when its SHA-256 is `sha256`.
pub(crate) fn download_verified(url: &str, dest: &Path, sha256: &str) -> Result<()> {
    debian_packages("curl, unzip", &[("curl", "curl"), ("unzip", "unzip")])?;
    run_cmd(
        Command::new("curl")
            .args(["-fsSL", "-o"])
            .arg(dest)
            .arg(url),
        "downloading",
    )?;
    let got = sha256_of(dest)?;
    if got != sha256 {
        let _ = std::fs::remove_file(dest);
        bail!("{url}: SHA-256 {got}, not {sha256}");
    }
    Ok(())
}

/// The SHA-256 of a file, in hex.
pub(crate) fn sha256_of(file: &Path) -> Result<String> {
    let out = Command::new("sha256sum")
        .arg(file)
        .output()
        .context("running sha256sum")?;
    if !out.status.success() {
        bail!("sha256sum {} failed", file.display());
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned())
}

/// `apt-get update`, then an install of `packages` without recommends (root).
pub(crate) fn apt_install(packages: &[&str]) -> Result<()> {
    run_cmd(
        Command::new("apt-get").args(["update", "-q"]),
        "apt-get update",
    )?;
    run_cmd(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(packages)
            .env("DEBIAN_FRONTEND", "noninteractive"),
        "apt-get install",
    )
}

fn docker_answers() -> bool {
    Command::new("docker")
        .args([
            "-H",
            &format!("unix://{DOCKER_SOCKET}"),
            "version",
            "--format",
            "{{.Server.Version}}",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn dockerd() -> Result<()> {
    if docker_answers() {
        say("dockerd: running");
        return Ok(());
    }
    if !is_root() {
        bail!("dockerd is not running and starting it needs root; run `sudo cargo xtask setup`");
    }
    let log = Path::new("/var/log/gpuwatch-dockerd.log");
    say(&format!("starting dockerd (log: {})", log.display()));
    let file = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    // setsid: dockerd outlives this command, as a service would.
    Command::new("setsid")
        .args(["dockerd", "--host", &format!("unix://{DOCKER_SOCKET}")])
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()
        .context("starting dockerd")?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if docker_answers() {
            say("dockerd: running");
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let tail = std::fs::read_to_string(log).unwrap_or_default();
    let tail: Vec<&str> = tail.lines().rev().take(15).collect();
    bail!(
        "dockerd did not answer within 60 s; last lines of {}:\n{}",
        log.display(),
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    )
}

fn tracefs() -> Result<()> {
    let dir = Path::new("/sys/kernel/tracing");
    if dir.join("events").is_dir() {
        say("tracefs: mounted");
        return Ok(());
    }
    if !is_root() {
        bail!("tracefs is not mounted and mounting it needs root: `sudo mount -t tracefs nodev /sys/kernel/tracing`");
    }
    say("mounting tracefs at /sys/kernel/tracing");
    run_cmd(
        Command::new("mount").args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"]),
        "mounting tracefs",
    )
}
