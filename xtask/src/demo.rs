//! `cargo xtask demo`: gpuwatch on this machine's Docker engine without a GPU. Three containers
//! (a busybox image imported offline) stand for three jobs on three fake GPUs (the fake NVML
//! library, a scenario naming their processes): a trainer keeping its GPU 95 % busy, a job
//! whose second process spins on a CPU while its GPU idles (a loader that cannot keep up), and
//! a notebook holding 20 GiB of an idle GPU. `gpuwatch serve` then shows them at
//! http://127.0.0.1:9879/, each with its verdict and advice, until Ctrl-C or `--seconds`.
//! `--check` asks the agent's API for the three verdicts at the end and fails on any other.
use crate::fake_agent::FakeAgent;
use crate::soak::http_get;
use crate::{cargo, workspace_root};
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const IMAGE: &str = "gpuwatch-demo/busybox:1";
const GIB: u64 = 1 << 30;

#[derive(clap::Args)]
pub struct Args {
    /// Where the agent listens.
    #[arg(long, default_value = "127.0.0.1:9879")]
    pub listen: String,
    /// Stop after this many seconds (default: at Ctrl-C).
    #[arg(long)]
    pub seconds: Option<u64>,
    /// At the end, fail unless each job got its verdict (GPU-bound, input-bound: CPU, idle).
    #[arg(long)]
    pub check: bool,
}

/// (name, compose service, command, GPU utilisation %, GiB held, the verdict it should get).
const JOBS: [(&str, &str, &str, u32, u64, &str); 3] = [
    (
        "gpuwatch-demo-trainer",
        "trainer",
        "exec sleep 3600",
        95,
        30,
        "GPU-bound",
    ),
    (
        "gpuwatch-demo-loader",
        "loader",
        "sh -c 'while :; do :; done' & exec sleep 3600",
        6,
        12,
        "input-bound: CPU",
    ),
    (
        "gpuwatch-demo-notebook",
        "notebook",
        "exec sleep 3600",
        0,
        20,
        "idle",
    ),
];

fn say(msg: &str) {
    eprintln!("[demo] {msg}");
}

/// Set by Ctrl-C: the demo then stops the agent and removes its containers.
static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// The demo's containers, removed on drop.
struct Containers;

impl Drop for Containers {
    fn drop(&mut self) {
        remove_containers();
    }
}

fn remove_containers() {
    let names: Vec<&str> = JOBS.iter().map(|j| j.0).collect();
    let _ = Command::new("docker")
        .args(["rm", "-f"])
        .args(&names)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

pub fn run(args: &Args) -> Result<()> {
    let root = workspace_root();
    cargo(&["build", "--release", "-p", "gpuwatch", "-p", "fake-nvml"])?;
    import_image()?;
    remove_containers();
    // Declared before the agent, so dropped after it: the agent stops, then the containers go.
    let _containers = Containers;
    let mut devices = Vec::new();
    for (i, (name, service, cmd, util, gib, _)) in JOBS.iter().enumerate() {
        let out = Command::new("docker")
            .args(["run", "-d", "--rm", "--name", name, "--label"])
            .arg(format!("com.docker.compose.service={service}"))
            .args([IMAGE, "sh", "-c", cmd])
            .output()
            .context("docker run")?;
        if !out.status.success() {
            bail!(
                "docker run {name}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let pid = docker_pid(name)?;
        devices.push(serde_json::json!({
            "uuid": format!("GPU-00000000-0000-0000-0000-0000000de{i:03}"),
            "utilization_gpu": util,
            "processes": [{"pid": pid, "used_memory_bytes": gib * GIB, "sm_util": util}],
        }));
    }
    let dir = root.join("target/demo");
    std::fs::create_dir_all(&dir)?;
    let scenario = dir.join("scenario.json");
    std::fs::write(
        &scenario,
        serde_json::to_vec_pretty(&serde_json::json!({ "devices": devices }))?,
    )?;
    let agent = FakeAgent::start(&scenario, &args.listen, "2s")?;
    say(&format!(
        "three jobs on three fake GPUs ({}): open http://{}/ (Ctrl-C stops it and removes \
         the containers)",
        scenario.display(),
        args.listen
    ));
    // A handler, not an ignore: the agent, already started, keeps the default and ends too.
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(
            libc::SIGINT,
            on_interrupt as extern "C" fn(libc::c_int) as libc::sighandler_t,
        )
    };
    let started = Instant::now();
    let until = args.seconds.map(Duration::from_secs);
    while !INTERRUPTED.load(std::sync::atomic::Ordering::Relaxed)
        && until.is_none_or(|u| started.elapsed() < u)
    {
        std::thread::sleep(Duration::from_millis(200));
    }
    let result = if args.check {
        check(&args.listen)
    } else {
        Ok(())
    };
    drop(agent);
    result
}

/// Each job's verdict from the agent's API, against the one it should get.
fn check(addr: &str) -> Result<()> {
    let body = http_get(addr, "/api/v1/containers")?;
    let v: serde_json::Value = serde_json::from_str(&body).context("the containers' JSON")?;
    let mut wrong = Vec::new();
    for (name, _, _, _, _, want) in JOBS {
        let got = v["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|w| w["name"] == name)
            .and_then(|w| w["verdict"]["kind"].as_str())
            .unwrap_or("none")
            .to_owned();
        say(&format!("{name}: {got} (expected {want})"));
        if got != want {
            wrong.push(format!("{name}: {got}, not {want}"));
        }
    }
    if !wrong.is_empty() {
        bail!("the demo's verdicts: {}", wrong.join("; "));
    }
    Ok(())
}

pub(crate) fn docker_pid(name: &str) -> Result<u32> {
    let out = Command::new("docker")
        .args(["inspect", "-f", "{{.State.Pid}}", name])
        .output()
        .context("docker inspect")?;
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .with_context(|| format!("the PID of {name}"))
}

/// A busybox image, imported from Debian's busybox-static (no registry needed).
fn import_image() -> Result<()> {
    let present = Command::new("docker")
        .args(["image", "inspect", IMAGE])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if present {
        return Ok(());
    }
    let busybox = Path::new("/bin/busybox");
    if !busybox.exists() {
        bail!("/bin/busybox missing (Debian's busybox-static)");
    }
    let root = std::env::temp_dir().join(format!("gpuwatch-demo-{}", std::process::id()));
    let bin = root.join("bin");
    std::fs::create_dir_all(&bin)?;
    for d in ["tmp", "etc", "proc", "sys", "dev"] {
        std::fs::create_dir_all(root.join(d))?;
    }
    std::fs::copy(busybox, bin.join("busybox"))?;
    let list = Command::new(busybox).arg("--list").output()?;
    for applet in String::from_utf8_lossy(&list.stdout).lines() {
        let _ = std::os::unix::fs::symlink("busybox", bin.join(applet));
    }
    let tar = root.join("rootfs.tar");
    crate::setup::run_cmd(
        Command::new("tar")
            .arg("-C")
            .arg(&root)
            .arg("-cf")
            .arg(&tar)
            .args(["bin", "tmp", "etc", "proc", "sys", "dev"]),
        "tar",
    )?;
    crate::setup::run_cmd(
        Command::new("docker")
            .args(["import", "--change", "ENV PATH=/bin"])
            .arg(&tar)
            .arg(IMAGE),
        "docker import",
    )?;
    let _ = std::fs::remove_dir_all(&root);
    Ok(())
}
