//! A fleet: three agents, each under its own hostname (a UTS namespace) with its own fake GPUs
//! and its own real containers, scraped by one real Prometheus that remote-writes to a real
//! VictoriaMetrics (Debian's `victoria-metrics`). The questions an operator asks of the whole
//! fleet are answered by PromQL against VictoriaMetrics:
//! - which container on which host is input-bound right now;
//! - GPU-hours per container across hosts.
//!
//! host-a runs a loader starved of CPU (a 0.4-CPU quota) in front of a trainer that waits on it;
//! host-b a job on one GPU at a steady 90 %; host-c one job holding two GPUs.

use serde_json::{json, Value};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

/// The trainer "computes" (writes 95 to its GPU's utilisation file, spins on its CPU) for a
/// fixed count per batch token from the loader, and writes 0 while it waits for the next.
fn trainer(loader: &str, spins: u32) -> String {
    format!(
        "mkfifo /tmp/q; ( {loader} ) > /tmp/q & exec 3< /tmp/q; \
         while read -r _ <&3; do echo 95 > /state/sm; i=0; \
         while [ $i -lt {spins} ]; do i=$((i+1)); done; echo 0 > /state/sm; done"
    )
}

/// A container whose GPU utilisation the fake NVML follows through `/state/sm`.
struct Job {
    container: Container,
    sm: std::path::PathBuf,
    _state: tempfile::TempDir,
}

impl Job {
    fn start(name: &str, docker_args: &[&str], script: &str) -> Self {
        let state = tempfile::tempdir().unwrap();
        let sm = state.path().join("sm");
        std::fs::write(&sm, "0\n").unwrap();
        let mount = format!("{}:/state", state.path().display());
        let mut args = vec!["-v", mount.as_str()];
        args.extend(docker_args);
        let container = Container::start_with(&unique(name), &[], &args, script);
        Self {
            container,
            sm,
            _state: state,
        }
    }

    fn busy(name: &str) -> Self {
        Self::start(name, &[], "sleep 3600")
    }

    /// Its GPU process: utilisation from its own file, or a steady 90 % for a job that never
    /// waits.
    fn process(&self) -> Value {
        json!({"pid": self.container.pid, "used_memory_bytes": 4 * GIB, "sm_util_file": self.sm})
    }
}

/// Starts VictoriaMetrics on a free port with its data in `dir`; returns it with its URL.
fn victoria_metrics(dir: &Path) -> (Running, String) {
    let port = free_port();
    let child = Command::new("victoria-metrics")
        .arg(format!("-httpListenAddr=127.0.0.1:{port}"))
        .arg(format!("-storageDataPath={}", dir.display()))
        .arg("-retentionPeriod=1d")
        // Samples are queryable 1 s after they arrive, not the default 30 s.
        .arg("-search.latencyOffset=1s")
        .arg("-loggerLevel=ERROR")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("victoria-metrics (Debian package, installed by `cargo xtask setup --test`)");
    (Running(child), format!("http://127.0.0.1:{port}"))
}

/// The result vector of `query` once `done` accepts it, within 90 s.
fn wait_for(server: &str, query: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let started = Instant::now();
    let mut last = Value::Null;
    while started.elapsed() < Duration::from_secs(90) {
        last = promql(server, query);
        if let Some(r) = last["data"]["result"].as_array() {
            if done(r) {
                return r.clone();
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    panic!("{query} never gave the expected answer; last: {last:#}")
}

/// The hostname in an agent's snapshot, once it has published one (within 30 s).
fn hostname_of(url: &str) -> String {
    let started = Instant::now();
    loop {
        let snap: Option<Value> = ureq::get(&format!("{url}/api/v1/snapshot"))
            .call()
            .ok()
            .and_then(|mut r| r.body_mut().read_to_string().ok())
            .and_then(|t| serde_json::from_str(&t).ok());
        if let Some(h) = snap.as_ref().and_then(|s| s["host"]["hostname"].as_str()) {
            return h.to_owned();
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{url}: no snapshot"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn label<'a>(series: &'a Value, name: &str) -> &'a str {
    series["metric"][name].as_str().unwrap_or_default()
}

fn value(series: &Value) -> f64 {
    series["value"][1].as_str().unwrap().parse().unwrap()
}

#[test]
fn victoria_metrics_answers_which_container_on_which_host_and_gpu_hours() {
    require_root();
    let starved = Job::start(
        "fleet-starved",
        &["--cpus", "0.4"],
        &trainer(
            "while :; do i=0; while [ $i -lt 6000 ]; do i=$((i+1)); done; echo b; done",
            300,
        ),
    );
    // Steady jobs: 90 % from the fake's fixed figure, no CPU spent (the machine has 2 CPUs).
    let fed = Job::busy("fleet-fed");
    let wide = Job::busy("fleet-wide");
    for job in [&fed, &wide] {
        std::fs::write(&job.sm, "90\n").unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let scenario = |name: &str, devices: Value| {
        let path = dir.path().join(format!("{name}.json"));
        std::fs::write(&path, json!({ "devices": devices }).to_string()).unwrap();
        path
    };
    let hosts = [
        (
            "gpu-host-a",
            scenario(
                "a",
                json!([{"uuid": "GPU-a0", "processes": [starved.process()]}]),
            ),
        ),
        (
            "gpu-host-b",
            scenario(
                "b",
                json!([{"uuid": "GPU-b0", "processes": [fed.process()]}]),
            ),
        ),
        (
            "gpu-host-c",
            scenario(
                "c",
                json!([{"uuid": "GPU-c0", "processes": [wide.process()]},
                       {"uuid": "GPU-c1", "processes": [wide.process()]}]),
            ),
        ),
    ];
    let mut agents = Vec::new();
    let mut targets = String::new();
    for (host, scenario) in &hosts {
        let hostname = [
            "unshare",
            "--uts",
            "sh",
            "-c",
            r#"hostname "$0" && exec "$@""#,
            host,
        ];
        let (agent, url) = serve_via(&hostname, scenario, &["--interval", "2s"]);
        assert_eq!(hostname_of(&url), *host, "each agent is its own host");
        let addr = url.trim_start_matches("http://");
        // The instance label names the host, as a fleet's service discovery would.
        targets.push_str(&format!(
            "      - targets: ['{addr}']\n        labels: {{instance: {host}}}\n"
        ));
        agents.push(agent);
    }
    let (_vm, vm) = victoria_metrics(&dir.path().join("vm"));
    let prom_dir = dir.path().join("prometheus");
    std::fs::create_dir_all(&prom_dir).unwrap();
    let (_prometheus, _prom) = prometheus(
        &prom_dir,
        &format!(
            "scrape_configs:\n  - job_name: gpuwatch\n    static_configs:\n{targets}\
             remote_write:\n  - url: {vm}/api/v1/write\n    queue_config: {{batch_send_deadline: 1s}}\n"
        ),
    );

    // Which container on which host is input-bound right now?
    let input_bound = wait_for(
        &vm,
        r#"max by (instance, container_name, verdict) (gpuwatch_container_verdict{verdict=~"input-bound.*"} == 1)"#,
        |r| {
            r.iter()
                .any(|s| label(s, "container_name") == starved.container.name)
        },
    );
    for s in &input_bound {
        assert_eq!(label(s, "instance"), "gpu-host-a", "{input_bound:#?}");
        assert_eq!(label(s, "container_name"), starved.container.name);
        assert_eq!(label(s, "verdict"), "input-bound: CPU", "{s:#}");
    }

    // GPU-hours per container across hosts: each GPU a container holds, for as long as it is
    // seen, over the last hour (samples every second).
    let gpu_hours = wait_for(
        &vm,
        "sum by (instance, container_name) (count_over_time(gpuwatch_container_gpu_memory_bytes[1h])) / 3600",
        |r| {
            r.len() == 3
                && r.iter()
                    .all(|s| value(s) * 3600.0 >= 10.0 && !label(s, "instance").is_empty())
        },
    );
    let of = |job: &Job| {
        let s = gpu_hours
            .iter()
            .find(|s| label(s, "container_name") == job.container.name)
            .unwrap_or_else(|| panic!("no GPU-hours for {}: {gpu_hours:#?}", job.container.name));
        (label(s, "instance").to_owned(), value(s))
    };
    let (a_host, a) = of(&starved);
    let (b_host, b) = of(&fed);
    let (c_host, c) = of(&wide);
    assert_eq!(
        [a_host.as_str(), b_host.as_str(), c_host.as_str()],
        ["gpu-host-a", "gpu-host-b", "gpu-host-c"]
    );
    // Two GPUs over the same span count twice (the scrapes of the three agents start within a
    // second or two of each other).
    let ratio = c / b;
    eprintln!(
        "input-bound: {:?}; GPU-hours: a {a:.5}, b {b:.5}, c {c:.5} (c/b {ratio:.2})",
        input_bound
            .iter()
            .map(|s| format!("{} on {}", label(s, "container_name"), label(s, "instance")))
            .collect::<Vec<_>>()
    );
    assert!(
        (1.6..=2.4).contains(&ratio),
        "two GPUs / one: {c} / {b} = {ratio}"
    );
    // One GPU each over the same span: the same GPU-hours.
    assert!((0.7..=1.3).contains(&(a / b)), "{a} / {b}: {gpu_hours:#?}");
    drop(agents);
}
