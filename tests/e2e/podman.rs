//! Podman behind Docker's API: gpuwatch pointed at Podman's Docker-compatible service with
//! `DOCKER_HOST` (Debian's podman, really started) names a Podman container as Podman — one
//! workload, `podman:<id>`, keyed as its `libpod-<id>` cgroup is — not as a Docker container
//! beside an unnamed copy of itself.

use serde_json::json;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

fn podman(args: &[&str]) -> String {
    let out = Command::new("podman")
        .args(args)
        .output()
        .expect("podman (Debian package, installed by `cargo xtask setup --test`)");
    assert!(
        out.status.success(),
        "podman {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// `podman system service` on a socket of its own, stopped on drop.
struct Service {
    _child: Running,
    socket: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Service {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("podman.sock");
        let child = Command::new("podman")
            .args(["system", "service", "--time=0"])
            .arg(format!("unix://{}", socket.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("podman");
        let started = Instant::now();
        while !socket.exists() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "no Podman socket"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Self {
            _child: Running(child),
            socket,
            _dir: dir,
        }
    }
}

/// A Podman container, removed on drop.
struct PodmanContainer(String);

impl Drop for PodmanContainer {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args(["rm", "-f", "-t", "0", &self.0])
            .output();
    }
}

#[test]
fn a_podman_container_is_named_as_podman_through_docker_host() {
    require_root();
    // The test image, from Docker's store into Podman's (there is no registry).
    ensure_image();
    let dir = tempfile::tempdir().unwrap();
    let tar = dir.path().join("image.tar");
    docker(&["save", "-o", tar.to_str().unwrap(), IMAGE]);
    podman(&["load", "-q", "-i", tar.to_str().unwrap()]);
    let service = Service::start();
    let name = unique("podman");
    // This VM refuses Podman's default rlimits (raising them needs CAP_SYS_RESOURCE here).
    let id = podman(&[
        "run",
        "-d",
        "--name",
        &name,
        "--network",
        "none",
        "--label",
        "com.docker.compose.service=trainer",
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
        IMAGE,
        "sleep",
        "3600",
    ]);
    let _container = PodmanContainer(id.clone());
    let pid: u32 = podman(&["inspect", "-f", "{{.State.Pid}}", &id])
        .parse()
        .unwrap();

    let run = snapshot_with(
        &json!({"devices": [{"uuid": "GPU-p", "processes": [
            {"pid": pid, "used_memory_bytes": 2 * GIB, "sm_util": 40}]}]}),
        &["--no-ebpf"],
        |cmd| {
            cmd.env(
                "DOCKER_HOST",
                format!("unix://{}", service.socket.display()),
            );
        },
    );
    assert!(run.status.success(), "{}", run.stderr);
    assert_eq!(run.json["sources"]["docker"]["up"], true, "{}", run.stderr);
    let w = workload(&run.json, &format!("podman:{id}"));
    assert_eq!(w["name"], name);
    assert_eq!(w["container"]["engine"], "podman");
    assert_eq!(w["container"]["compose_service"], "trainer");
    assert_eq!(w["gpu"]["memory_bytes"], 2 * GIB);
    let ids: Vec<&str> = run.json["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w["id"].as_str())
        .filter(|i| i.contains(&id))
        .collect();
    assert_eq!(
        ids,
        [format!("podman:{id}")],
        "one workload for the container"
    );
}
