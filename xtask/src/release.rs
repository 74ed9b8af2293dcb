//! `cargo xtask release`: the tarball an operator installs from — the stripped binary, the
//! systemd unit, the example config, the Grafana dashboard, the Prometheus rules, the man pages,
//! the shell completions, the docs, the README and the licences — with the oldest glibc the
//! binary runs on, read from the symbol versions it needs, written beside it and said; and the
//! Debian package of the same files ([`crate::deb`]).
//!
//! The binary is linked against glibc [`GLIBC_FLOOR`] (cargo-zigbuild), not the build host's:
//! GPU hosts often run RHEL/Rocky 8 (2.28), Debian 11 or Ubuntu 20.04 (2.31), and a build on
//! Debian 12 needed 2.34. NVML is opened with `dlopen`, so a static musl build is no answer. A
//! binary that needs a newer version than the floor fails the release.
use crate::setup::run_cmd;
use crate::workspace_root;
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::Command;

/// (file in the repository, name in the tarball).
const FILES: &[(&str, &str)] = &[
    ("deploy/systemd/gpuwatch.service", "gpuwatch.service"),
    ("deploy/gpuwatch.yaml", "gpuwatch.yaml"),
    ("README.md", "README.md"),
    ("LICENSE-MIT", "LICENSE-MIT"),
    ("LICENSE-APACHE", "LICENSE-APACHE"),
    ("LICENSE-GPL2", "LICENSE-GPL2"),
    (
        "deploy/grafana/gpuwatch-dashboard.json",
        "grafana/gpuwatch-dashboard.json",
    ),
    (
        "deploy/prometheus/gpuwatch-rules.yml",
        "prometheus/gpuwatch-rules.yml",
    ),
];

/// The shells `gpuwatch completions` writes a script for, and the script's name in the tarball.
const COMPLETIONS: &[(&str, &str)] = &[
    ("bash", "completions/gpuwatch.bash"),
    ("zsh", "completions/_gpuwatch"),
    ("fish", "completions/gpuwatch.fish"),
];

fn say(msg: &str) {
    eprintln!("[release] {msg}");
}

/// The oldest glibc the release binary runs on.
pub const GLIBC_FLOOR: &str = "2.28";

pub fn run() -> Result<()> {
    let root = workspace_root();
    let zig_dir = crate::glibc_tools::ensure()?;
    let triple = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
    let target = format!("{triple}.{GLIBC_FLOOR}");
    let path = std::env::join_paths(std::iter::once(zig_dir).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))?;
    say(&format!("building for glibc {GLIBC_FLOOR} ({target})"));
    run_cmd(
        Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()))
            .args([
                "zigbuild",
                "--release",
                "-p",
                "gpuwatch",
                "--target",
                &target,
            ])
            .env("PATH", path)
            // The profiling layout is for `cargo xtask hot-code` only.
            .env_remove(crate::hot_code::PROFILE_LAYOUT)
            .current_dir(&root),
        "cargo zigbuild",
    )?;
    let name = format!(
        "gpuwatch-{}-{}-linux-gnu",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::ARCH
    );
    let dist = root.join("target/dist");
    let stage = dist.join(&name);
    if stage.exists() {
        std::fs::remove_dir_all(&stage)?;
    }
    std::fs::create_dir_all(&stage)?;
    let built = root.join("target").join(&triple).join("release/gpuwatch");
    say(&crate::hot_code::check_linked(&built)?);
    let binary = stage.join("gpuwatch");
    run_cmd(
        Command::new("strip").arg("-o").arg(&binary).arg(&built),
        "strip gpuwatch",
    )?;
    for (from, to) in FILES {
        copy(&root.join(from), &stage.join(to))?;
    }
    for doc in std::fs::read_dir(root.join("docs")).context("reading docs/")? {
        let doc = doc?.path();
        if doc.extension().is_some_and(|e| e == "md") {
            let name = doc.file_name().context("a docs/ entry without a name")?;
            copy(&doc, &stage.join("docs").join(name))?;
        }
    }
    generated(&binary, &stage)?;
    let floor = glibc_floor(&binary)?;
    if version_key(&floor) > version_key(GLIBC_FLOOR) {
        bail!("the release binary needs glibc {floor}, newer than its floor {GLIBC_FLOOR}");
    }
    std::fs::write(
        stage.join("GLIBC"),
        format!(
            "gpuwatch needs glibc {floor} or newer (the newest GLIBC_ symbol version it links).\n"
        ),
    )?;
    let tarball = dist.join(format!("{name}.tar.gz"));
    run_cmd(
        Command::new("tar")
            .arg("-czf")
            .arg(&tarball)
            .arg("-C")
            .arg(&dist)
            .arg(&name),
        "tar",
    )?;
    say(&format!(
        "{} (needs glibc {floor} or newer)",
        tarball.display()
    ));
    let deb = crate::deb::build(&stage, &dist, GLIBC_FLOOR)?;
    say(&deb.display().to_string());
    Ok(())
}

fn copy(from: &Path, to: &Path) -> Result<()> {
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::copy(from, to).with_context(|| format!("copying {}", from.display()))?;
    Ok(())
}

/// What the binary writes about itself: a man page per subcommand and the completion scripts.
fn generated(binary: &Path, stage: &Path) -> Result<()> {
    let man = stage.join("man/man1");
    run_cmd(
        Command::new(binary).arg("man").arg("--dir").arg(&man),
        "gpuwatch man --dir",
    )?;
    for (shell, to) in COMPLETIONS {
        let out = Command::new(binary)
            .args(["completions", shell])
            .output()
            .with_context(|| format!("running gpuwatch completions {shell}"))?;
        if !out.status.success() {
            bail!("gpuwatch completions {shell} failed ({})", out.status);
        }
        let to = stage.join(to);
        if let Some(dir) = to.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&to, out.stdout).with_context(|| format!("writing {}", to.display()))?;
    }
    Ok(())
}

/// The newest `GLIBC_x.y[.z]` version among the dynamic symbols `binary` needs.
fn glibc_floor(binary: &Path) -> Result<String> {
    let out = Command::new("objdump")
        .arg("-T")
        .arg(binary)
        .output()
        .context("running objdump (binutils)")?;
    if !out.status.success() {
        bail!("objdump -T {} failed: {}", binary.display(), out.status);
    }
    newest_glibc(&String::from_utf8_lossy(&out.stdout))
        .with_context(|| format!("{} needs no GLIBC_ symbol version", binary.display()))
}

/// A version's numbers, to compare as numbers ("2.9" < "2.28"); `None` if one is not a number.
fn version_key(v: &str) -> Option<Vec<u32>> {
    v.split('.').map(|p| p.parse().ok()).collect()
}

/// Parses `objdump -T` output for the newest `GLIBC_` version named.
fn newest_glibc(objdump: &str) -> Option<String> {
    objdump
        .split_whitespace()
        .filter_map(|word| word.trim_matches(['(', ')']).strip_prefix("GLIBC_"))
        .filter_map(|v| version_key(v).map(|p| (p, v.to_owned())))
        .max_by(|a, b| a.0.cmp(&b.0))
        .map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::newest_glibc;

    #[test]
    fn the_floor_is_the_newest_version_by_number_not_by_text() {
        let objdump = "\
0000000000000000      DF *UND*  0000000000000000 (GLIBC_2.2.5) free
0000000000000000      DF *UND*  0000000000000000 (GLIBC_2.34) __libc_start_main
0000000000000000      DF *UND*  0000000000000000 (GLIBC_2.9) pipe2
0000000000000000  w   D  *UND*  0000000000000000  GLIBC_PRIVATE __gmon
0000000000000000      DF *UND*  0000000000000000 (GLIBC_2.28) statx
";
        assert_eq!(newest_glibc(objdump).as_deref(), Some("2.34"));
        assert_eq!(newest_glibc("no versions here"), None);
    }
}
