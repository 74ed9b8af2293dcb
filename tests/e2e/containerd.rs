//! Pods on a containerd node: no Docker lists them, and the kubelet's labels are not on any
//! container the agent can ask Docker about. containerd's CRI plugin writes the pod's and the
//! container's names into the task's OCI spec (`io.kubernetes.cri.*` annotations), which
//! containerd keeps while the task runs. A real containerd (Debian's), started here on its own
//! socket and state, runs a task as the CRI plugin would: the annotations, and a cgroup under
//! the pod's (`/kubepods/<qos>/pod<uid>/<id>`, as a kubelet with the cgroupfs driver makes it).
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

const UID: &str = "7c1e2d3f-4a5b-4c6d-8e9f-0a1b2c3d4e5f";

/// containerd on a socket and state of its own (the CRI plugin off: no CNI here), stopped on
/// drop with its tasks.
struct Containerd {
    dir: tempfile::TempDir,
    daemon: Child,
}

impl Containerd {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.toml");
        std::fs::write(
            &config,
            "version = 2\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n",
        )
        .unwrap();
        let log = std::fs::File::create(dir.path().join("containerd.log")).unwrap();
        let daemon = Command::new("containerd")
            .arg("--config")
            .arg(&config)
            .arg("--root")
            .arg(dir.path().join("root"))
            .arg("--state")
            .arg(dir.path().join("state"))
            .arg("--address")
            .arg(dir.path().join("containerd.sock"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("containerd (Debian's containerd; `cargo xtask setup --test` installs it)");
        let me = Self { dir, daemon };
        let started = Instant::now();
        while !me.ctr(&["version"]).status.success() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "containerd did not answer in 30 s:\n{}",
                me.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        me
    }

    fn ctr(&self, args: &[&str]) -> std::process::Output {
        Command::new("ctr")
            .arg("--address")
            .arg(self.dir.path().join("containerd.sock"))
            .args(["--namespace", "k8s.io"])
            .args(args)
            .output()
            .unwrap()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
    }

    /// Where its runtime keeps the running tasks (the agent's `sources.containerd_tasks`).
    fn task_dir(&self) -> PathBuf {
        self.dir.path().join("state/io.containerd.runtime.v2.task")
    }

    /// Runs `sleep` from a busybox root as container `id` in `cgroup`, with `annotations`;
    /// returns the task's host PID.
    fn run(&self, id: &str, cgroup: &str, annotations: &[(&str, &str)]) -> u32 {
        let rootfs = self.dir.path().join(format!("rootfs-{id}"));
        std::fs::create_dir_all(rootfs.join("bin")).unwrap();
        std::fs::copy(busybox(), rootfs.join("bin/busybox")).unwrap();
        std::os::unix::fs::symlink("busybox", rootfs.join("bin/sleep")).unwrap();
        let rootfs = rootfs.to_str().unwrap().to_owned();
        // `--rootfs`: the first argument is a root directory, not an image.
        let mut args = vec!["run", "-d", "--rootfs", "--cgroup", cgroup];
        let pairs: Vec<String> = annotations
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        for pair in &pairs {
            args.extend(["--annotation", pair]);
        }
        args.extend([rootfs.as_str(), id, "/bin/sleep", "3600"]);
        let out = self.ctr(&args);
        assert!(
            out.status.success(),
            "ctr run: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        let tasks = String::from_utf8_lossy(&self.ctr(&["task", "ls"]).stdout).into_owned();
        tasks
            .lines()
            .find(|l| l.starts_with(id))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|pid| pid.parse().ok())
            .unwrap_or_else(|| panic!("no PID for {id} in:\n{tasks}"))
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let listed = self.ctr(&["task", "ls", "-q"]);
        for id in String::from_utf8_lossy(&listed.stdout).lines() {
            self.ctr(&["task", "kill", "-s", "SIGKILL", id]);
            let deadline = Instant::now() + Duration::from_secs(10);
            while !self.ctr(&["task", "delete", id]).status.success() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            self.ctr(&["container", "delete", id]);
        }
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
    }
}

fn busybox() -> &'static Path {
    let path = Path::new("/bin/busybox");
    assert!(
        path.exists(),
        "busybox-static (`cargo xtask setup --test` installs it)"
    );
    path
}

/// A GPU process in a pod's container on a containerd node is keyed by its cgroup, as on any
/// Kubernetes node, and named from containerd's task spec: the pod, its namespace, the
/// container and its image. A task whose spec names another pod's uid than its cgroup does is
/// not named from it.
#[test]
fn a_pods_container_on_containerd_is_named_from_its_task_spec() {
    require_root();
    let containerd = Containerd::start();
    let id = format!("{:0>64}", format!("{:x}", std::process::id()));
    let cgroup = format!("/kubepods/besteffort/pod{UID}/{id}");
    let pid = containerd.run(
        &id,
        &cgroup,
        &[
            ("io.kubernetes.cri.container-type", "container"),
            ("io.kubernetes.cri.sandbox-name", "trainer-0"),
            ("io.kubernetes.cri.sandbox-namespace", "ml"),
            ("io.kubernetes.cri.sandbox-uid", UID),
            ("io.kubernetes.cri.container-name", "trainer"),
            ("io.kubernetes.cri.image-name", "registry.example/yolo:8"),
        ],
    );
    let other_uid = "00000000-1111-4222-8333-444444444444";
    let stranger_id = format!("{:f>64}", format!("{:x}", std::process::id()));
    let stranger = containerd.run(
        &stranger_id,
        &format!("/kubepods/besteffort/pod{other_uid}/{stranger_id}"),
        &[
            ("io.kubernetes.cri.sandbox-name", "victim-0"),
            ("io.kubernetes.cri.sandbox-namespace", "prod"),
            ("io.kubernetes.cri.sandbox-uid", UID),
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gpuwatch.yaml");
    std::fs::write(
        &config,
        format!(
            "sources:\n  containerd_tasks: {}\n",
            containerd.task_dir().display()
        ),
    )
    .unwrap();
    let run = snapshot(
        &json!({"devices": [{"uuid": "GPU-cd", "processes": [
            {"pid": pid, "used_memory_bytes": GIB, "sm_util": 40},
            {"pid": stranger, "used_memory_bytes": 2 * GIB, "sm_util": 10}]}]}),
        &["--no-docker", "-c", config.to_str().unwrap()],
    );
    let w = workload(&run.json, &format!("kubernetes:{UID}/{id}"));
    assert_eq!(w["name"], "trainer-0/trainer", "{w:#}");
    let c = &w["container"];
    assert_eq!(c["engine"], "containerd");
    assert_eq!(c["image"], "registry.example/yolo:8");
    assert_eq!(
        c["kubernetes"],
        json!({"namespace": "ml", "pod": "trainer-0", "container": "trainer"})
    );
    assert_eq!(w["gpu"]["memory_bytes"], GIB);
    let s = workload(&run.json, &format!("kubernetes:{other_uid}/{stranger_id}"));
    assert_eq!(s["container"], Value::Null, "{s:#}");
    assert_eq!(s["gpu"]["memory_bytes"], 2 * GIB);
}
