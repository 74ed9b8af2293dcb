//! `cargo xtask fuzz`: runs each fuzz target of tests/fuzz (cargo-fuzz, libFuzzer with
//! AddressSanitizer, on the kernel programs' pinned nightly) for a set time from a corpus
//! seeded with real inputs, and prints a table of what ran and what was found.
use crate::setup::{ebpf_toolchain, run_cmd};
use crate::workspace_root;
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::Command;

const CARGO_FUZZ_VERSION: &str = "0.13.1";
pub const TARGETS: [&str; 6] = [
    "recording",
    "cgroup_path",
    "proc_stat",
    "mountinfo",
    "btf",
    "config",
];

#[derive(clap::Args)]
pub struct Args {
    /// Seconds per target.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Targets to run (default: all).
    pub targets: Vec<String>,
}

fn say(msg: &str) {
    eprintln!("[fuzz] {msg}");
}

struct Outcome {
    target: String,
    runs: u64,
    new_units: u64,
    corpus: usize,
    crash: Option<String>,
}

pub fn run(args: &Args) -> Result<()> {
    cargo_fuzz()?;
    let nightly = ebpf_toolchain()?;
    let root = workspace_root();
    let targets: Vec<String> = if args.targets.is_empty() {
        TARGETS.iter().map(|t| (*t).to_owned()).collect()
    } else {
        args.targets.clone()
    };
    for t in &targets {
        if !TARGETS.contains(&t.as_str()) {
            bail!("no fuzz target {t}: the targets are {}", TARGETS.join(", "));
        }
    }
    let target_dir = build_dir()?;
    say(&format!(
        "building the targets (AddressSanitizer) in {}",
        target_dir.display()
    ));
    run_cmd(
        Command::new("cargo")
            .arg(format!("+{nightly}"))
            .args(["fuzz", "build", "--fuzz-dir", "tests/fuzz", "--target-dir"])
            .arg(&target_dir)
            .current_dir(&root),
        "cargo fuzz build",
    )?;
    let mut outcomes = Vec::new();
    for target in &targets {
        outcomes.push(run_target(
            &root,
            &nightly,
            &target_dir,
            target,
            args.seconds,
        )?);
    }
    println!(
        "{:<12} {:>12} {:>9} {:>8}  result",
        "target", "runs", "new units", "corpus"
    );
    for o in &outcomes {
        println!(
            "{:<12} {:>12} {:>9} {:>8}  {}",
            o.target,
            o.runs,
            o.new_units,
            o.corpus,
            o.crash.as_deref().unwrap_or("no crash")
        );
    }
    let crashed: Vec<&str> = outcomes
        .iter()
        .filter(|o| o.crash.is_some())
        .map(|o| o.target.as_str())
        .collect();
    if !crashed.is_empty() {
        bail!("fuzz targets crashed: {}", crashed.join(", "));
    }
    Ok(())
}

/// Where the instrumented build goes: outside the clone (`GPUWATCH_FUZZ_TARGET_DIR`, else
/// `~/.cache/gpuwatch/fuzz-target`), so a fresh clone on the same machine rebuilds only what
/// changed, not every dependency with AddressSanitizer (the smoke's build was most of its time).
fn build_dir() -> Result<std::path::PathBuf> {
    let dir = match std::env::var_os("GPUWATCH_FUZZ_TARGET_DIR") {
        Some(d) => std::path::PathBuf::from(d),
        None => {
            let home = std::env::var_os("HOME").context("HOME is not set")?;
            Path::new(&home).join(".cache/gpuwatch/fuzz-target")
        }
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

fn run_target(
    root: &Path,
    nightly: &str,
    target_dir: &Path,
    target: &str,
    seconds: u64,
) -> Result<Outcome> {
    let corpus = root.join("target/fuzz-corpus").join(target);
    let artifacts = root.join("target/fuzz-artifacts").join(target);
    std::fs::create_dir_all(&corpus)?;
    std::fs::create_dir_all(&artifacts)?;
    seed(root, target, &corpus)?;
    say(&format!("{target}: {seconds} s"));
    let out = Command::new("cargo")
        .arg(format!("+{nightly}"))
        .args(["fuzz", "run", "--fuzz-dir", "tests/fuzz", "--target-dir"])
        .arg(target_dir)
        .arg(target)
        .arg(&corpus)
        .arg("--")
        .arg(format!("-max_total_time={seconds}"))
        .arg("-print_final_stats=1")
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .current_dir(root)
        .output()
        .with_context(|| format!("running fuzz target {target}"))?;
    let log = String::from_utf8_lossy(&out.stderr);
    let stat = |name: &str| -> u64 {
        log.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let crash = (!out.status.success()).then(|| {
        let artifact = log
            .lines()
            .find_map(|l| l.split_once("Test unit written to ").map(|(_, p)| p.trim()))
            .unwrap_or("no artifact written");
        let why = log
            .lines()
            .find(|l| l.contains("panicked") || l.contains("ERROR: AddressSanitizer"))
            .unwrap_or("see the log");
        format!("CRASH: {why} ({artifact})")
    });
    if crash.is_some() {
        eprintln!("{log}");
    }
    Ok(Outcome {
        target: target.to_owned(),
        runs: stat("stat::number_of_executed_units:"),
        new_units: stat("stat::new_units_added:"),
        corpus: std::fs::read_dir(&corpus).map_or(0, |d| d.count()),
        crash,
    })
}

/// Real inputs for each target, so fuzzing starts from what the agent meets.
fn seed(root: &Path, target: &str, corpus: &Path) -> Result<()> {
    let put = |name: &str, bytes: &[u8]| std::fs::write(corpus.join(name), bytes);
    match target {
        // The reader finds columns by name: a recording of a few of them is a whole one.
        "recording" => put(
            "seed.csv",
            b"unix_ms,record,gpu_index,gpu_uuid,temperature_celsius,workload_id,workload_name,\
              gpu_busy_fraction,verdict,alert_rule,alert_state\n\
              1000,gpu,0,GPU-a,40,,,,,,\n\
              1000,workload,0|1,,,docker:x,train,0.5,GPU-bound,,\n\
              2000,alert,0,,,docker:x,train,,,gpu_temperature_high,firing\n",
        )?,
        "cgroup_path" => put(
            "seed",
            b"/system.slice/docker-3f6d9a0b1c2e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f90.scope",
        )?,
        "proc_stat" => put("seed", &std::fs::read("/proc/self/stat")?)?,
        "mountinfo" => put("seed", &std::fs::read("/proc/self/mountinfo")?)?,
        // The BTF header: magic, version 1, flags, header length 24, then empty sections.
        "btf" => put(
            "seed",
            &[
                0x9f, 0xeb, 1, 0, 24, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            ],
        )?,
        "config" => put(
            "seed.yaml",
            &std::fs::read(root.join("deploy/gpuwatch.yaml"))?,
        )?,
        _ => {}
    }
    Ok(())
}

/// cargo-fuzz, installed with the userspace toolchain when missing.
fn cargo_fuzz() -> Result<()> {
    let present = Command::new("cargo")
        .args(["fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if present {
        return Ok(());
    }
    say(&format!("installing cargo-fuzz {CARGO_FUZZ_VERSION}"));
    run_cmd(
        Command::new("cargo").args([
            "install",
            "--locked",
            "cargo-fuzz",
            "--version",
            CARGO_FUZZ_VERSION,
        ]),
        "cargo install cargo-fuzz",
    )
}
