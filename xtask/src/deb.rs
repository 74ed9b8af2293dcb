//! The Debian package `cargo xtask release` builds beside the tarball, from the same staged
//! files: the binary in /usr/bin, the systemd unit, the configuration as a conffile in
//! /etc/gpuwatch, a man page per subcommand, the completions where bash, zsh and fish look, and
//! the dashboard, rules, docs and licences under /usr/share/doc/gpuwatch. It depends on the
//! glibc the binary was linked for; on a host run by systemd, installing it enables and starts
//! the service, and removing it stops it.
use crate::setup::run_cmd;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// (file in the staged tarball tree, where the package installs it).
const INSTALLED: &[(&str, &str)] = &[
    ("gpuwatch", "usr/bin/gpuwatch"),
    ("gpuwatch.service", "lib/systemd/system/gpuwatch.service"),
    ("gpuwatch.yaml", "etc/gpuwatch/gpuwatch.yaml"),
    (
        "completions/gpuwatch.bash",
        "usr/share/bash-completion/completions/gpuwatch",
    ),
    (
        "completions/_gpuwatch",
        "usr/share/zsh/vendor-completions/_gpuwatch",
    ),
    (
        "completions/gpuwatch.fish",
        "usr/share/fish/vendor_completions.d/gpuwatch.fish",
    ),
    ("README.md", "usr/share/doc/gpuwatch/README.md"),
    ("LICENSE-MIT", "usr/share/doc/gpuwatch/LICENSE-MIT"),
    ("LICENSE-APACHE", "usr/share/doc/gpuwatch/LICENSE-APACHE"),
    ("LICENSE-GPL2", "usr/share/doc/gpuwatch/LICENSE-GPL2"),
];

/// Folders copied whole under /usr/share/doc/gpuwatch.
const DOC_DIRS: &[&str] = &["docs", "grafana", "prometheus"];

const POSTINST: &str = "#!/bin/sh
set -e
if [ \"$1\" = configure ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload
  systemctl enable gpuwatch.service
  systemctl restart gpuwatch.service
fi
";

const PRERM: &str = "#!/bin/sh
set -e
if [ -d /run/systemd/system ] && [ \"$1\" = remove ]; then
  systemctl stop gpuwatch.service || true
fi
";

const POSTRM: &str = "#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
  if [ \"$1\" = purge ]; then
    systemctl disable gpuwatch.service >/dev/null 2>&1 || true
  fi
  systemctl daemon-reload || true
fi
";

/// Builds `dist/gpuwatch_<version>_<arch>.deb` from the staged tree; returns its path.
pub fn build(stage: &Path, dist: &Path, glibc_floor: &str) -> Result<PathBuf> {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => bail!("no Debian architecture for {other}"),
    };
    let version = env!("CARGO_PKG_VERSION");
    let root = dist.join("deb-root");
    if root.exists() {
        std::fs::remove_dir_all(&root)?;
    }
    for (from, to) in INSTALLED {
        place(&stage.join(from), &root.join(to))?;
    }
    let doc = root.join("usr/share/doc/gpuwatch");
    for dir in DOC_DIRS {
        for entry in std::fs::read_dir(stage.join(dir))? {
            let from = entry?.path();
            let name = from.file_name().context("a staged file without a name")?;
            place(&from, &doc.join(dir).join(name))?;
        }
    }
    let man = root.join("usr/share/man/man1");
    for entry in std::fs::read_dir(stage.join("man/man1"))? {
        let from = entry?.path();
        let name = from.file_name().context("a man page without a name")?;
        place(&from, &man.join(name))?;
    }
    run_cmd(
        Command::new("sh")
            .arg("-c")
            .arg("gzip -9n \"$0\"/*.1")
            .arg(&man),
        "compressing the man pages",
    )?;
    std::fs::write(
        doc.join("copyright"),
        "gpuwatch: MIT OR Apache-2.0 (LICENSE-MIT, LICENSE-APACHE); its kernel programs: \
         GPL-2.0 (LICENSE-GPL2).\n",
    )?;
    control(&root, version, arch, glibc_floor)?;
    let deb = dist.join(format!("gpuwatch_{version}_{arch}.deb"));
    run_cmd(
        Command::new("dpkg-deb")
            .args(["--root-owner-group", "--build"])
            .arg(&root)
            .arg(&deb),
        "dpkg-deb --build",
    )?;
    std::fs::remove_dir_all(&root)?;
    Ok(deb)
}

/// DEBIAN/: control, conffiles and the maintainer scripts.
fn control(root: &Path, version: &str, arch: &str, glibc_floor: &str) -> Result<()> {
    let debian = root.join("DEBIAN");
    std::fs::create_dir_all(&debian)?;
    let du = Command::new("du")
        .args(["-sk"])
        .arg(root)
        .output()
        .context("running du")?;
    let size = String::from_utf8_lossy(&du.stdout)
        .split_whitespace()
        .next()
        .unwrap_or("0")
        .to_owned();
    std::fs::write(
        debian.join("control"),
        format!(
            "Package: gpuwatch\n\
             Version: {version}\n\
             Architecture: {arch}\n\
             Maintainer: gpuwatch developers <gpuwatch@localhost>\n\
             Installed-Size: {size}\n\
             Depends: libc6 (>= {glibc_floor})\n\
             Section: admin\n\
             Priority: optional\n\
             Description: per-container GPU use, stalls and health for Docker GPU hosts\n \
             gpuwatch joins NVML's per-process GPU use to containers, traces why a\n \
             GPU idles with eBPF (the data loader's stalls, the training loop's host\n \
             side), and alerts on heat, memory, leaks, ghost processes and the\n \
             container's own configuration. It serves Prometheus metrics, a JSON API\n \
             and a web page, and writes recordings, reports and plots.\n"
        ),
    )?;
    std::fs::write(debian.join("conffiles"), "/etc/gpuwatch/gpuwatch.yaml\n")?;
    for (name, text) in [("postinst", POSTINST), ("prerm", PRERM), ("postrm", POSTRM)] {
        let path = debian.join(name);
        std::fs::write(&path, text)?;
        set_mode(&path, 0o755)?;
    }
    Ok(())
}

/// Copies `from` to `to` (folders made), executable where `from` is, readable by all.
fn place(from: &Path, to: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::copy(from, to).with_context(|| format!("copying {}", from.display()))?;
    let executable = std::fs::metadata(from)?.permissions().mode() & 0o111 != 0;
    set_mode(to, if executable { 0o755 } else { 0o644 })
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting the mode of {}", path.display()))
}
