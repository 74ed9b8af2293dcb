//! The agent as a container: deploy/Dockerfile built on the local Debian base (`cargo xtask
//! test` makes it), started with deploy/compose.yaml's settings (the README's minimal line, which
//! tests/deploy.rs holds to the same flags) — host PID and cgroup namespaces,
//! every capability dropped but what eBPF needs, a read-only root, /sys and the Docker socket
//! read-only — with the fake NVML mounted in. It must list a sibling container by name, image
//! and compose service, and load its probes.

use serde_json::json;
use std::process::Command;
use std::time::{Duration, Instant};
use support::*;

const BASE: &str = "debian:bookworm-slim";

/// `docker run` capabilities for eBPF: Debian 12's Docker 20.10 does not know BPF or PERFMON
/// ("invalid CapAdd: unknown capability"); SYS_ADMIN implies both there.
fn ebpf_caps() -> Vec<&'static str> {
    if docker_major() >= 23 {
        vec!["--cap-add", "BPF", "--cap-add", "PERFMON"]
    } else {
        vec!["--cap-add", "SYS_ADMIN"]
    }
}

fn docker_major() -> u32 {
    let version = docker(&["version", "--format", "{{.Server.Version}}"]);
    version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0)
}

/// Builds deploy/Dockerfile on this test's gpuwatch binary; removed on drop.
struct Image(String);

impl Image {
    fn build() -> Self {
        let present = Command::new("docker")
            .args(["image", "inspect", BASE])
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(
            present,
            "{BASE} missing: `cargo xtask test` (or `cargo xtask image`) makes it"
        );
        let context = tempfile::tempdir().unwrap();
        std::fs::copy(support::gpuwatch_bin(), context.path().join("gpuwatch")).unwrap();
        // One tag per build: the tests run side by side, and each removes its own.
        static BUILDS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tag = format!("gpuwatch-e2e:{}-{n}", std::process::id());
        let dockerfile = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/Dockerfile");
        docker(&[
            "build",
            "-q",
            "-f",
            dockerfile,
            "-t",
            &tag,
            context.path().to_str().unwrap(),
        ]);
        Self(tag)
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rmi", "-f", &self.0]).output();
    }
}

/// deploy/compose.yaml's `gpuwatch` service as `docker run` flags: the settings the agent is
/// started with here are the shipped file's, not a copy of them. The NVIDIA device reservation
/// is left out (the fake NVML is mounted instead), and BPF/PERFMON become SYS_ADMIN on engines
/// that do not know them.
fn compose_service_flags() -> Vec<String> {
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/compose.yaml");
    let text = std::fs::read_to_string(file).unwrap();
    let compose: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    let service = &compose["services"]["gpuwatch"];
    assert_eq!(service["image"], "gpuwatch:latest", "{service:#}");
    let mut flags = vec![
        format!("--pid={}", service["pid"].as_str().unwrap()),
        format!("--cgroupns={}", service["cgroup"].as_str().unwrap()),
        format!("--network={}", service["network_mode"].as_str().unwrap()),
    ];
    assert_eq!(service["read_only"], true, "{service:#}");
    flags.push("--read-only".into());
    for cap in service["cap_drop"].as_array().unwrap() {
        flags.extend(["--cap-drop".into(), cap.as_str().unwrap().to_owned()]);
    }
    let added: Vec<&str> = service["cap_add"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert_eq!(added, ["BPF", "PERFMON"], "eBPF's capabilities, no more");
    flags.extend(ebpf_caps().into_iter().map(str::to_owned));
    for volume in service["volumes"].as_array().unwrap() {
        flags.extend(["-v".into(), volume.as_str().unwrap().to_owned()]);
    }
    for (key, value) in service["environment"].as_object().unwrap() {
        flags.extend(["-e".into(), format!("{key}={}", value.as_str().unwrap())]);
    }
    flags
}

#[test]
fn the_agent_runs_as_a_container_with_the_minimal_line() {
    require_root();
    let image = Image::build();
    let (trainer, dir) = trainer_on_a_fake_gpu("image-trainer", 3u64 << 30);
    let port = free_port();
    let fake = fake_nvml_lib();
    let mut args: Vec<String> = ["run", "-d", "--name", &unique("image-agent")]
        .map(str::to_owned)
        .to_vec();
    args.extend(compose_service_flags());
    args.extend([
        // The fake NVML, where a host's libnvidia-ml would be mounted.
        "-v".to_owned(),
        format!("{}:/usr/lib/libnvidia-ml.so.1:ro", fake.display()),
        "-v".into(),
        format!("{}:/scenario:ro", dir.path().display()),
        "-e".into(),
        "GPUWATCH_NVML_LIB=/usr/lib/libnvidia-ml.so.1".into(),
        "-e".into(),
        "FAKE_NVML_SCENARIO=/scenario/scenario.json".into(),
        image.0.clone(),
        "serve".into(),
        "--web.listen-address".into(),
        format!("127.0.0.1:{port}"),
    ]);
    let agent = docker(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let _remove = Removed(agent.clone());

    let (metrics, line) = trainers_memory_series(port, &trainer, &agent, 3u64 << 30);
    assert!(line.contains(&format!("image=\"{IMAGE}\"")), "{line}");
    // Without CAP_SYS_PTRACE another container's root is closed to the agent: /dev/shm use is
    // not read, and the snapshot says why (the README names the capability).
    let snap: serde_json::Value = ureq::get(&format!("http://127.0.0.1:{port}/api/v1/snapshot"))
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .expect("the snapshot API answers JSON");
    let w = workload(&snap, &format!("docker:{}", trainer.id));
    let shm_error = w["config"]["errors"]["shm"].as_str().unwrap_or_default();
    assert!(shm_error.contains("root/dev/shm"), "{:#}", w["config"]);
    every_source_up(&metrics, &agent);
}

/// A container of compose service `trainer` holding `memory` of a fake GPU, and the folder of
/// that GPU's scenario (`scenario.json`), to mount into the agent's container.
fn trainer_on_a_fake_gpu(name: &str, memory: u64) -> (Container, tempfile::TempDir) {
    let trainer = Container::start(
        &unique(name),
        &[("com.docker.compose.service", "trainer")],
        "sleep 3600",
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("scenario.json"),
        json!({"devices": [{"uuid": "GPU-00000000-0000-0000-0000-0000000000c1",
            "processes": [{"pid": trainer.pid, "used_memory_bytes": memory, "sm_util": 70}]}]})
        .to_string(),
    )
    .unwrap();
    (trainer, dir)
}

/// `/metrics` once it names the trainer, and its GPU memory series, which must carry its compose
/// service and `bytes`.
fn trainers_memory_series(
    port: u16,
    trainer: &Container,
    agent: &str,
    bytes: u64,
) -> (String, String) {
    let want = format!("container_name=\"{}\"", trainer.name);
    let metrics = metrics_naming(port, &want, agent);
    let line = metrics
        .lines()
        .find(|l| l.starts_with("gpuwatch_container_gpu_memory_bytes{") && l.contains(&want))
        .unwrap_or_else(|| panic!("no GPU memory series for the trainer:\n{metrics}"))
        .to_owned();
    assert!(line.contains("compose_service=\"trainer\""), "{line}");
    let value: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert_eq!(value, bytes as f64, "{line}");
    (metrics, line)
}

/// NVML, Docker and eBPF all up in the containerised agent's `/metrics`.
fn every_source_up(metrics: &str, agent: &str) {
    for source in ["nvml", "docker", "ebpf"] {
        let up = format!("gpuwatch_up{{source=\"{source}\"}} 1");
        assert!(
            metrics.lines().any(|l| l.starts_with(&up)),
            "{source} not up in the containerised agent; its log:\n{}",
            logs(agent)
        );
    }
}

/// `/metrics` once it names `want` (a minute at most; the agent's log otherwise).
fn metrics_naming(port: u16, want: &str, agent: &str) -> String {
    let url = format!("http://127.0.0.1:{port}/metrics");
    let started = Instant::now();
    loop {
        let body = ureq::get(&url)
            .call()
            .ok()
            .and_then(|mut r| r.body_mut().read_to_string().ok());
        if let Some(b) = body.filter(|b| b.contains(want)) {
            return b;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no {want} series after 60 s; the agent's log:\n{}",
            logs(agent)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The shipped compose file for this engine started by the Compose the host has: Debian 12's
/// Docker 20.10 with its `docker-compose` 1.29 (Compose v1) and deploy/compose.docker20.yaml;
/// Docker 23 or later with Compose v2 and deploy/compose.yaml. The tool first validates the
/// file as shipped; then it starts it with three changes a GPU-less host needs — this test's
/// image, the fake NVML mounted where the NVIDIA runtime would put the driver's (the device
/// reservation dropped), a port of its own — and the agent names a sibling container.
#[test]
fn the_agent_starts_from_the_compose_file_with_the_hosts_compose() {
    require_root();
    let (file, tool): (&str, &[&str]) = if docker_major() >= 23 {
        ("compose.yaml", &["docker", "compose"])
    } else {
        ("compose.docker20.yaml", &["docker-compose"])
    };
    let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(file);
    let compose = |args: &[&str]| {
        let out = Command::new(tool[0])
            .args(&tool[1..])
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{tool:?} ({e}): `cargo xtask setup --test` installs it"));
        assert!(
            out.status.success(),
            "{tool:?} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    compose(&["-f", shipped.to_str().unwrap(), "config", "-q"]);

    let image = Image::build();
    let (trainer, dir) = trainer_on_a_fake_gpu("compose-trainer", 2u64 << 30);
    let port = free_port();
    let mut doc: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(&shipped).unwrap()).unwrap();
    let service = doc["services"]["gpuwatch"].as_object_mut().unwrap();
    service.insert("image".into(), json!(image.0));
    service.insert(
        "command".into(),
        json!(["serve", "--web.listen-address", format!("127.0.0.1:{port}")]),
    );
    service.insert("restart".into(), json!("no"));
    assert!(service.remove("deploy").is_some(), "the NVIDIA reservation");
    let volumes = service["volumes"].as_array_mut().unwrap();
    volumes.push(json!(format!(
        "{}:/usr/lib/libnvidia-ml.so.1:ro",
        fake_nvml_lib().display()
    )));
    volumes.push(json!(format!("{}:/scenario:ro", dir.path().display())));
    let env = service["environment"].as_object_mut().unwrap();
    env.insert(
        "GPUWATCH_NVML_LIB".into(),
        json!("/usr/lib/libnvidia-ml.so.1"),
    );
    env.insert(
        "FAKE_NVML_SCENARIO".into(),
        json!("/scenario/scenario.json"),
    );
    let started_file = dir.path().join("compose.json");
    std::fs::write(&started_file, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    let project = unique("compose").replace('-', "");
    let file_arg = started_file.to_str().unwrap().to_owned();
    compose(&["-f", &file_arg, "-p", &project, "up", "-d"]);
    let _down = ComposeDown {
        tool,
        file: file_arg.clone(),
        project: project.clone(),
    };
    let agent = docker(&[
        "ps",
        "-q",
        "--filter",
        &format!("label=com.docker.compose.project={project}"),
    ]);
    assert!(!agent.is_empty(), "compose started no container");
    let (metrics, _) = trainers_memory_series(port, &trainer, &agent, 2u64 << 30);
    every_source_up(&metrics, &agent);
}

/// `compose down` of a started project, on drop.
struct ComposeDown {
    tool: &'static [&'static str],
    file: String,
    project: String,
}

impl Drop for ComposeDown {
    fn drop(&mut self) {
        let _ = Command::new(self.tool[0])
            .args(&self.tool[1..])
            .args(["-f", &self.file, "-p", &self.project, "down"])
            .output();
    }
}

/// A container removed on drop.
struct Removed(String);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rm", "-f", &self.0]).output();
    }
}

fn logs(id: &str) -> String {
    let out = Command::new("docker").args(["logs", id]).output().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
