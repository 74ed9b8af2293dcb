//! Project tasks: `cargo xtask setup | test | run`.
//!
//! `setup` installs, idempotently, everything the build and the tests need on a fresh Debian
//! machine; `test` and `run` call it first, so each of the README's two commands works alone.
mod bench_vs_nvitop;
mod deb;
mod demo;
mod fake_agent;
mod fuzz;
mod glibc_tools;
mod gpu_bundle;
mod helm_tool;
mod hot_code;
mod image;
mod release;
mod setup;
mod soak;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use setup::Purpose;
use std::path::PathBuf;
use std::process::Command;

#[derive(Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what building and running gpuwatch needs (the pinned toolchains, bpf-linker, a C
    /// compiler, tracefs); with `--test`, also what the tests need (Docker, started; busybox,
    /// Prometheus, tmux, kubectl, Helm, VictoriaMetrics, Podman, cargo-deny). Safe to run again.
    Setup {
        #[arg(long)]
        test: bool,
    },
    /// Set up, then run formatting and lint checks, the whole test suite (unit, eBPF and
    /// real-Docker end-to-end tests) and a 10-s smoke of each fuzz target.
    Test {
        /// Skip `cargo fmt --check`, clippy and cargo-deny.
        #[arg(long)]
        no_lint: bool,
        /// Skip the fuzz smoke (each fuzz target for 10 s after the tests).
        #[arg(long)]
        no_fuzz: bool,
        /// Extra arguments for `cargo test` (after `--`).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Build the agent's container image, `gpuwatch:<version>` and `gpuwatch:latest`, from
    /// deploy/Dockerfile (root; offline: its Debian base is made here with debootstrap when the
    /// engine lacks it).
    Image,
    /// Run the criterion benchmarks (a sampling round at 8 GPUs × 200 processes; the /metrics
    /// render at 1,000 containers × 8 GPUs).
    Bench {
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Measure the stall probes' cost (root): kernel ns per traced event under a syscall- and
    /// switch-heavy load, and a read-heavy loader's throughput with and without them; empty
    /// programs on the same tracepoints give the floor for both.
    BenchProbes {
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Pack what a GPU machine without cargo or Docker needs into `.device/`: the stripped
    /// gpuwatch and xtask binaries, Debian's Docker with its libraries, nvitop's wheel.
    GpuBundle,
    /// On a GPU machine (the carried xtask, as root): gpuwatch's and nvitop's steady CPU per
    /// second and peak RSS over the same GPU load, one after the other, with the ratios.
    BenchVsNvitop(bench_vs_nvitop::Args),
    /// Build the release tarball under target/dist: the stripped binary, the systemd unit, the
    /// example config, the dashboard, the rules, man pages, completions, docs, the README and the
    /// licences, with the glibc floor it needs.
    Release,
    /// Run each fuzz target (tests/fuzz: the recording reader, cgroup paths, /proc stat,
    /// mountinfo, BTF, the config and its error locator) for a set time, with a table of runs.
    Fuzz(fuzz::Args),
    /// The agent under churn (root, dockerd): `serve` while a container starts every second,
    /// scraped every second; RSS, open files, series, probe map entries and internal events at
    /// the start and the end.
    Soak(soak::Args),
    /// Three jobs on three fake GPUs on this machine's Docker engine, shown by `gpuwatch
    /// serve` at http://127.0.0.1:9879/ with their verdicts and advice (root, dockerd).
    Demo(demo::Args),
    /// Write monitor/hot-code.txt, the functions `serve` runs, which release builds link
    /// together so that fewer of the binary's pages are resident (root, dockerd, a minute).
    HotCode(hot_code::Args),
    /// Set up, build the release binary and run it with these arguments (default: `snapshot`).
    Run {
        #[arg(last = true)]
        args: Vec<String>,
    },
}

fn main() -> Result<()> {
    match Cli::parse().task {
        Task::Setup { test: false } => setup::run(Purpose::Run),
        Task::Setup { test: true } => setup::run(Purpose::Test),
        Task::Test {
            no_lint,
            no_fuzz,
            args,
        } => {
            setup::run(Purpose::Test)?;
            // The e2e test of the agent's image builds deploy/Dockerfile on this base.
            image::base()?;
            test(no_lint, &args)?;
            if no_fuzz || !args.is_empty() {
                return Ok(());
            }
            // The smoke: each target briefly, so a parser that panics on its seeds fails CI.
            fuzz::run(&fuzz::Args {
                seconds: 10,
                targets: Vec::new(),
            })
        }
        Task::Image => {
            setup::run(Purpose::Run)?;
            setup::docker()?;
            image::run()
        }
        Task::Bench { args } => {
            cargo(&["build", "--release", "-p", "fake-nvml"])?;
            let mut a = vec!["bench", "-p", "gpuwatch"];
            if !args.is_empty() {
                a.push("--");
                a.extend(args.iter().map(String::as_str));
            }
            cargo(&a)
        }
        Task::BenchProbes { args } => {
            setup::run(Purpose::Run)?;
            cargo(&[
                "build",
                "--release",
                "-p",
                "gpuwatch",
                "--example",
                "probe_cost",
            ])?;
            let bin = workspace_root().join("target/release/examples/probe_cost");
            let status = Command::new(&bin)
                .args(&args)
                .status()
                .with_context(|| format!("starting {}", bin.display()))?;
            if !status.success() {
                bail!("probe_cost failed ({status})");
            }
            Ok(())
        }
        Task::Run { args } => {
            setup::run(Purpose::Run)?;
            run(&args)
        }
        Task::Soak(args) => {
            setup::run(Purpose::Test)?;
            soak::run(&args)
        }
        Task::HotCode(args) => {
            setup::run(Purpose::Test)?;
            hot_code::run(&args)
        }
        Task::Demo(args) => {
            setup::run(Purpose::Run)?;
            setup::demo()?;
            demo::run(&args)
        }
        Task::Fuzz(args) => {
            setup::run(Purpose::Run)?;
            fuzz::run(&args)
        }
        Task::Release => {
            setup::run(Purpose::Run)?;
            release::run()
        }
        Task::GpuBundle => {
            setup::run(Purpose::Test)?;
            gpu_bundle::run_bundle()
        }
        Task::BenchVsNvitop(args) => bench_vs_nvitop::run(args),
    }
}

pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_owned()
}

/// Runs a command in the workspace root, failing with the command line when it fails.
pub fn cargo(args: &[&str]) -> Result<()> {
    cargo_with_env(args, &[])
}

/// `cargo` with these environment variables set.
pub fn cargo_with_env(args: &[&str], env: &[(&str, &str)]) -> Result<()> {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()));
    cmd.args(args).current_dir(workspace_root());
    cmd.envs(env.iter().copied());
    let shown: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
    eprintln!("[xtask] {}cargo {}", shown.concat(), args.join(" "));
    let status = cmd
        .status()
        .with_context(|| format!("starting cargo {}", args.join(" ")))?;
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    Ok(())
}

fn test(no_lint: bool, extra: &[String]) -> Result<()> {
    if !no_lint {
        cargo(&["fmt", "--all", "--", "--check"])?;
        cargo(&[
            "clippy",
            "--workspace",
            "--exclude",
            "monitor-ebpf",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ])?;
        clippy_ebpf()?;
        // The dependency tree against deny.toml: licences, banned and duplicate crates, and
        // sources (advisories need a database these machines cannot fetch). Offline, it reads
        // every platform's crates from the local registry: a build fetches only this one's, so
        // fetch them all first (a fresh machine has none of the Windows or Android ones).
        cargo(&["fetch", "--locked"])?;
        cargo(&["deny", "--offline", "check", "licenses", "bans", "sources"])?;
    }
    // The end-to-end tests load the fake NVML library and run the agent binary.
    cargo(&["build", "-p", "fake-nvml", "-p", "gpuwatch"])?;
    let mut args = vec!["test", "--workspace", "--exclude", "monitor-ebpf"];
    if !extra.is_empty() {
        args.push("--");
        args.extend(extra.iter().map(String::as_str));
    }
    cargo_test_tally(&args)
}

/// Clippy on the kernel programs, with their own nightly and target (the workspace's clippy
/// leaves the crate out: it does not build for the host).
fn clippy_ebpf() -> Result<()> {
    let nightly = setup::ebpf_toolchain()?;
    let args = [
        "clippy",
        "--target",
        "bpfel-unknown-none",
        "-Z",
        "build-std=core",
        "--release",
        "--",
        "-D",
        "warnings",
    ];
    eprintln!("[xtask] (monitor-ebpf) cargo +{nightly} {}", args.join(" "));
    let mut cmd = Command::new("rustup");
    cmd.args(["run", &nightly, "cargo"])
        .args(args)
        .current_dir(workspace_root().join("monitor-ebpf"));
    // The outer cargo's toolchain and compiler must not leak into the nightly's build.
    for var in [
        "RUSTUP_TOOLCHAIN",
        "RUSTC",
        "RUSTDOC",
        "CARGO",
        "RUSTC_WRAPPER",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd.status().context("starting clippy on monitor-ebpf")?;
    if !status.success() {
        bail!("clippy on monitor-ebpf failed ({status})");
    }
    Ok(())
}

/// Runs `cargo test`, echoing its output, and ends with one line totalling every test binary's
/// `test result:` line (cargo's own last line is often a doc-test run of 0 tests).
fn cargo_test_tally(args: &[&str]) -> Result<()> {
    use std::io::{BufRead, BufReader};
    eprintln!("[xtask] cargo {}", args.join(" "));
    let mut child = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()))
        .args(args)
        .current_dir(workspace_root())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("starting cargo test")?;
    let (mut passed, mut failed, mut ignored) = (0u64, 0u64, 0u64);
    let stdout = child.stdout.take().context("cargo test's stdout")?;
    for line in BufReader::new(stdout).lines() {
        let line = line.context("reading cargo test's output")?;
        println!("{line}");
        if let Some(rest) = line.strip_prefix("test result: ") {
            let count = |word: &str| -> u64 {
                rest.split(';')
                    .find_map(|part| {
                        part.trim()
                            .trim_start_matches("ok. ")
                            .trim_start_matches("FAILED. ")
                            .strip_suffix(word)
                    })
                    .and_then(|n| n.trim().parse().ok())
                    .unwrap_or(0)
            };
            passed += count(" passed");
            failed += count(" failed");
            ignored += count(" ignored");
        }
    }
    let status = child.wait().context("waiting for cargo test")?;
    println!("tests: {passed} passed, {failed} failed, {ignored} skipped");
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    Ok(())
}

fn run(args: &[String]) -> Result<()> {
    cargo(&["build", "--release", "-p", "gpuwatch"])?;
    let bin = workspace_root().join("target/release/gpuwatch");
    let args: Vec<&str> = if args.is_empty() {
        vec!["snapshot"]
    } else {
        args.iter().map(String::as_str).collect()
    };
    let status = Command::new(&bin)
        .args(&args)
        .status()
        .with_context(|| format!("starting {}", bin.display()))?;
    if !status.success() {
        bail!("gpuwatch {} failed ({status})", args.join(" "));
    }
    Ok(())
}
