//! Alerts, doctor and the config file, end to end: real containers, the fake NVML driven through
//! a scripted timeline, `gpuwatch watch` notifying a real local HTTP receiver.

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::*;

const MIB: u64 = 1 << 20;
const TOTAL: u64 = 80 * GIB;

/// A webhook receiver on 127.0.0.1: records every POST body; answers 503 to the first
/// `fail_first` requests (to exercise retries), 200 after.
struct Receiver {
    url: String,
    bodies: Arc<Mutex<Vec<Value>>>,
    requests: Arc<Mutex<usize>>,
}

impl Receiver {
    fn start(fail_first: usize) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let requests = Arc::new(Mutex::new(0));
        let (b, r) = (bodies.clone(), requests.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let n = {
                    let mut r = r.lock().unwrap();
                    *r += 1;
                    *r
                };
                let _ = serve_one(stream, n <= fail_first, &b);
            }
        });
        Self {
            url,
            bodies,
            requests,
        }
    }

    fn bodies(&self) -> Vec<Value> {
        self.bodies.lock().unwrap().clone()
    }
}

fn serve_one(stream: TcpStream, fail: bool, bodies: &Mutex<Vec<Value>>) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut len = 0usize;
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0; len];
    reader.read_exact(&mut body)?;
    let mut stream = stream;
    if fail {
        stream.write_all(
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        )?;
        return Ok(());
    }
    bodies
        .lock()
        .unwrap()
        .push(serde_json::from_slice(&body).unwrap_or(Value::Null));
    stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
}

/// Replaces the scenario atomically (the fake re-reads it when it changes).
fn write_scenario(path: &Path, s: &Value) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec(s).unwrap()).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn sigterm(child: &std::process::Child) {
    // SAFETY: plain kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
}

/// (key → [states in order]) of the notifications received.
fn by_key(bodies: &[Value]) -> BTreeMap<String, Vec<String>> {
    let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for b in bodies {
        m.entry(b["alert"]["key"].as_str().unwrap_or_default().to_owned())
            .or_default()
            .push(b["status"].as_str().unwrap_or_default().to_owned());
    }
    m
}

fn rules_seen(bodies: &[Value], status: &str) -> Vec<String> {
    let mut v: Vec<String> = bodies
        .iter()
        .filter(|b| b["status"] == status)
        .map(|b| b["alert"]["rule"].as_str().unwrap_or_default().to_owned())
        .collect();
    v.sort();
    v.dedup();
    v
}

const ALL_RULES: [&str; 11] = [
    "cpu_memory_leak",
    "ghost_process",
    "gpu_ecc_errors",
    "gpu_imbalance",
    "gpu_lost",
    "gpu_memory_high",
    "gpu_memory_leak",
    "gpu_temperature_high",
    "gpu_underutilized",
    "gpu_xid_errors",
    "power_cap_low_util",
];

/// What the driver undoes only by resetting the GPU: a lost GPU stays lost and a volatile ECC
/// count stays, so their alerts stay firing once the rest of the host is well again.
const UNTIL_RESET: [&str; 2] = ["gpu_ecc_errors", "gpu_lost"];

fn resolvable() -> Vec<String> {
    ALL_RULES
        .iter()
        .filter(|r| !UNTIL_RESET.contains(r))
        .map(|r| (*r).to_owned())
        .collect()
}

#[test]
fn every_rule_fires_and_resolves_once_per_incident() {
    require_root();
    // The trainer leaks: host memory through a tmpfs it keeps writing (real pages charged to
    // its cgroup), GPU memory through the scenario below. It stops when /tmp/stop appears.
    let trainer = Container::start_with(
        &unique("alert-trainer"),
        &[("com.docker.compose.service", "trainer")],
        &["--tmpfs", "/data:size=1g"],
        "i=0; while [ ! -e /tmp/stop ]; do dd if=/dev/zero of=/data/f$i bs=1M count=4 \
         2>/dev/null; i=$((i+1)); sleep 0.2; done; sleep 3600",
    );
    let ddp = Container::start(&unique("alert-ddp"), &[], "sleep 3600");
    let ghost = Container::start(&unique("alert-ghost"), &[], "sleep 3600");
    let (trainer_pid, ddp_pid, ghost_pid) = (trainer.pid, ddp.pid, ghost.pid);
    let ghost_id = ghost.id.clone();

    let receiver = Receiver::start(1);
    let dir = tempfile::tempdir().unwrap();
    let scenario_path = dir.path().join("scenario.json");
    let config = dir.path().join("gpuwatch.yaml");
    let command_log = dir.path().join("command.jsonl");
    std::fs::write(
        &config,
        format!(
            "interval: 250ms
sources:
  nvml_series_interval: 1s
alerts:
  max_notifications_per_minute: 1000
  rules:
    gpu_underutilized: {{below_percent: 30, for: 1s}}
    gpu_memory_high: {{above_percent: 95, for: 1s}}
    gpu_temperature_high: {{above_celsius: 83, for: 1s}}
    gpu_memory_leak: {{window: 6s, min_duration: 3s, min_growth_per_minute: 600MiB, min_r_squared: 0.8}}
    cpu_memory_leak: {{window: 6s, min_duration: 3s, min_growth_per_minute: 300MiB, min_r_squared: 0.8}}
    gpu_imbalance: {{spread_percent: 5, for: 1s}}
    power_cap_low_util: {{power_ratio: 0.9, below_utilization_percent: 80, for: 1s}}
    gpu_xid_errors: {{hold: 3s}}
    ghost_process: {{for: 1s}}
notify:
  webhook:
    url: {}
    retries: 3
    backoff: 100ms
  command:
    argv: [/bin/sh, -c, 'cat >> {}; echo \" $GPUWATCH_ALERT_STATE\" >> {}']
",
            receiver.url,
            command_log.display(),
            command_log.display()
        ),
    )
    .unwrap();

    // The trainer has GPU 0 (beside the ghost, which computes nothing); the DDP job runs on
    // GPUs 1 and 3, at 20 % and 90 % while sick. Each GPU's utilisation is what its processes
    // do (GPU 1's is fixed, as a device figure), so what the driver reports holds together.
    // The trainer's GPU memory grows 100 MiB per 500 ms of real time (12,000 MiB/min), however
    // late a loaded machine runs the loop that writes it.
    let trainer_memory = |elapsed: Duration| 2 * GIB + elapsed.as_millis() as u64 * 100 * MIB / 500;
    let sick = |step: u64, elapsed: Duration, ghost_listed: bool| {
        let mut gpu0 = vec![json!({"pid": trainer_pid,
            "used_memory_bytes": trainer_memory(elapsed), "sm_util": 10})];
        if ghost_listed {
            gpu0.push(json!({"pid": ghost_pid, "used_memory_bytes": GIB}));
        }
        json!({"devices": [
            {"uuid": "GPU-alert-0", "memory_total_bytes": TOTAL, "processes": gpu0},
            {"uuid": "GPU-alert-1", "memory_total_bytes": TOTAL, "memory_used_bytes": TOTAL / 100 * 97,
             "temperature": 90, "power_mw": 690_000, "power_limit_mw": 700_000, "utilization_gpu": 20,
             "ecc_uncorrected_volatile": 2,
             // Xid 79 arrives once the agent listens; it is delivered once.
             "xid_events": if step >= 2 { vec![79] } else { vec![] },
             "processes": [{"pid": ddp_pid, "used_memory_bytes": 4 * GIB, "sm_util": 20}]},
            {"uuid": "GPU-alert-2", "lost": true},
            {"uuid": "GPU-alert-3", "memory_total_bytes": TOTAL,
             "processes": [{"pid": ddp_pid, "used_memory_bytes": 4 * GIB, "sm_util": 90}]}
        ]})
    };
    // Healthy again: the leak stops where it got to (memory a leak took is not given back), so
    // no step in the trainer's memory looks like growth.
    let healthy = |trainer_memory: u64| {
        json!({"devices": [
            {"uuid": "GPU-alert-0", "memory_total_bytes": TOTAL, "processes": [
                {"pid": trainer_pid, "used_memory_bytes": trainer_memory, "sm_util": 95}]},
            {"uuid": "GPU-alert-1", "memory_total_bytes": TOTAL, "temperature": 50, "utilization_gpu": 50,
             "processes": [{"pid": ddp_pid, "used_memory_bytes": 4 * GIB, "sm_util": 50}]},
            {"uuid": "GPU-alert-2"},
            {"uuid": "GPU-alert-3", "memory_total_bytes": TOTAL,
             "processes": [{"pid": ddp_pid, "used_memory_bytes": 4 * GIB, "sm_util": 50}]}
        ]})
    };
    let leak_start = Instant::now();
    write_scenario(&scenario_path, &sick(0, Duration::ZERO, true));

    let mut watch = gpuwatch_on(&scenario_path)
        .args(["-c"])
        .arg(&config)
        .args(["watch", "--json", "--log", "info"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = watch.stdout.take().unwrap();
    let lines = Arc::new(Mutex::new(Vec::<Value>::new()));
    let l2 = lines.clone();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            l2.lock()
                .unwrap()
                .push(serde_json::from_str(&line).unwrap_or(Value::Null));
        }
    });

    // Phase 1: everything goes wrong. The GPU memory of the trainer grows (see `sick`); the ghost's container is removed once the agent has seen it alive.
    let started = Instant::now();
    let mut step = 0;
    let mut last_write = Duration::ZERO;
    let mut ghost = Some(ghost);
    let mut removal = None;
    while rules_seen(&receiver.bodies(), "firing").len() < ALL_RULES.len()
        && started.elapsed() < Duration::from_secs(40)
    {
        std::thread::sleep(Duration::from_millis(500));
        step += 1;
        if step == 4 {
            // docker rm -f: the PID dies, the fake NVML keeps listing it. Off this loop: under
            // load the removal takes seconds, and the leak must keep its steady cadence.
            let g = ghost.take();
            removal = Some(std::thread::spawn(move || drop(g)));
        }
        last_write = leak_start.elapsed();
        write_scenario(&scenario_path, &sick(step, last_write, true));
    }
    if let Some(r) = removal {
        r.join().unwrap();
    }
    let fired = rules_seen(&receiver.bodies(), "firing");
    assert_eq!(
        fired,
        ALL_RULES,
        "rules fired after {:?}",
        started.elapsed()
    );

    // Phase 2: all well again; the ghost's PID is no longer listed, the trainer stops leaking.
    docker(&["exec", &trainer.id, "touch", "/tmp/stop"]);
    write_scenario(&scenario_path, &healthy(trainer_memory(last_write)));
    let healed = Instant::now();
    while rules_seen(&receiver.bodies(), "resolved").len() < resolvable().len()
        && healed.elapsed() < Duration::from_secs(40)
    {
        std::thread::sleep(Duration::from_millis(500));
    }
    // A little longer: nothing may fire again.
    std::thread::sleep(Duration::from_secs(2));
    sigterm(&watch);
    let status = watch.wait().unwrap();
    reader.join().unwrap();
    let mut stderr = String::new();
    watch
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(status.success(), "{stderr}");

    let bodies = receiver.bodies();
    assert_eq!(
        rules_seen(&bodies, "resolved"),
        resolvable(),
        "resolved after {:?}; stderr:\n{stderr}",
        healed.elapsed()
    );
    // Exactly one firing, then one resolved, per incident — even though the receiver failed the
    // first request (the retry delivered it, once); a lost GPU and its ECC count, only fired.
    assert!(*receiver.requests.lock().unwrap() > bodies.len());
    for (key, states) in by_key(&bodies) {
        let until_reset = UNTIL_RESET
            .iter()
            .any(|r| key.starts_with(&format!("{r}/")));
        let want: &[&str] = if until_reset {
            &["firing"]
        } else {
            &["firing", "resolved"]
        };
        assert_eq!(states, want, "{key}");
    }
    // The same transitions on stdout, as JSON lines.
    let printed = lines.lock().unwrap().clone();
    assert_eq!(by_key(&printed), by_key(&bodies));

    // The command got the same notifications: the JSON on stdin, the state in its environment.
    let commands: Vec<Value> = std::fs::read_to_string(&command_log)
        .unwrap()
        .lines()
        .map(|l| {
            let (json, state) = l.rsplit_once(' ').unwrap();
            let v: Value = serde_json::from_str(json).unwrap();
            assert_eq!(v["status"], state);
            v
        })
        .collect();
    assert_eq!(by_key(&commands), by_key(&bodies));

    // Alerts name the container (name, image, compose service), the GPU and the value.
    let firing = |rule: &str| -> Vec<&Value> {
        bodies
            .iter()
            .filter(|b| b["status"] == "firing" && b["alert"]["rule"] == rule)
            .collect()
    };
    let under = firing("gpu_underutilized");
    let under = under
        .iter()
        .find(|b| b["alert"]["subject"]["container"]["name"] == trainer.name.as_str())
        .expect("the trainer is underutilized");
    assert_eq!(
        under["alert"]["subject"]["container"]["compose_service"],
        "trainer"
    );
    assert_eq!(
        under["alert"]["subject"]["container"]["image"],
        support::IMAGE
    );
    // Busy 10 %: the GPU's series says so in every window.
    let value = under["alert"]["value"].as_f64().unwrap();
    assert!((value - 10.0).abs() < 2.0, "{under}");
    let ghost_alert = firing("ghost_process")[0];
    assert_eq!(ghost_alert["alert"]["subject"]["pid"], ghost_pid);
    assert_eq!(ghost_alert["alert"]["subject"]["gpu"]["index"], 0);
    assert!(
        ghost_alert["alert"]["summary"]
            .as_str()
            .unwrap()
            .contains("no longer exists"),
        "{ghost_alert}"
    );
    let imbalance = firing("gpu_imbalance")[0];
    assert_eq!(
        imbalance["alert"]["subject"]["container"]["name"],
        ddp.name.as_str()
    );
    assert!((imbalance["alert"]["value"].as_f64().unwrap() - 70.0).abs() < 10.0);
    let leak = firing("gpu_memory_leak")[0];
    // 100 MiB per 500 ms = 12000 MiB/min, as fitted.
    let slope = leak["alert"]["value"].as_f64().unwrap();
    assert!((9000.0..15000.0).contains(&slope), "{leak}");
    let cpu_leak = firing("cpu_memory_leak")[0];
    assert_eq!(
        cpu_leak["alert"]["subject"]["container"]["name"],
        trainer.name.as_str()
    );
    let xid = firing("gpu_xid_errors")[0];
    assert_eq!(xid["alert"]["value"], 79.0);
    assert_eq!(xid["alert"]["subject"]["gpu"]["uuid"], "GPU-alert-1");
    let hot = firing("gpu_temperature_high")[0];
    assert_eq!(hot["alert"]["subject"]["gpu"]["uuid"], "GPU-alert-1");
    assert_eq!(hot["alert"]["value"], 90.0);
    let full = firing("gpu_memory_high")[0];
    assert_eq!(full["alert"]["subject"]["gpu"]["uuid"], "GPU-alert-1");
    assert!(
        (full["alert"]["value"].as_f64().unwrap() - 97.0).abs() < 0.1,
        "{full}"
    );
    let capped = firing("power_cap_low_util")[0];
    assert_eq!(capped["alert"]["subject"]["gpu"]["uuid"], "GPU-alert-1");
    assert!((capped["alert"]["value"].as_f64().unwrap() - 690.0 / 700.0).abs() < 1e-6);
    let ecc = firing("gpu_ecc_errors")[0];
    assert_eq!(ecc["alert"]["subject"]["gpu"]["uuid"], "GPU-alert-1");
    assert_eq!(ecc["alert"]["value"], 2.0);
    // A lost GPU answers no query, its UUID included: it is known by its index.
    let lost = firing("gpu_lost")[0];
    assert_eq!(lost["alert"]["subject"]["gpu"]["index"], 2);
    assert_eq!(lost["alert"]["subject"]["gpu"]["uuid"], Value::Null);
    let cpu_slope = cpu_leak["alert"]["value"].as_f64().unwrap();
    assert!(cpu_slope >= 300.0, "{cpu_leak}");

    // Exactly the incidents the scenario makes, one alert each: no rule fires for a subject it
    // should not, none misses one.
    let gpu = |n: u32| format!("GPU-alert-{n}");
    let workload = |id: &str| format!("docker:{id}");
    let mut expected: std::collections::BTreeSet<String> = [
        ("gpu_underutilized", workload(&trainer.id)),
        ("gpu_memory_high", gpu(1)),
        ("gpu_temperature_high", gpu(1)),
        ("gpu_memory_leak", workload(&trainer.id)),
        ("cpu_memory_leak", workload(&trainer.id)),
        ("gpu_imbalance", workload(&ddp.id)),
        ("power_cap_low_util", gpu(1)),
        ("gpu_lost", "index-2".to_owned()),
        ("gpu_ecc_errors", gpu(1)),
        ("gpu_xid_errors", gpu(1)),
        ("ghost_process", format!("{}/{ghost_pid}", gpu(0))),
    ]
    .map(|(rule, subject)| format!("{rule}/{subject}"))
    .into();
    // The ghost's own container held GPU 0 idle while it lived: it may have been underutilized
    // long enough to fire before its removal. Nothing else may.
    let ghost_idle = format!("gpu_underutilized/{}", workload(&ghost_id));
    let keys: std::collections::BTreeSet<String> = by_key(&bodies).into_keys().collect();
    if keys.contains(&ghost_idle) {
        expected.insert(ghost_idle);
    }
    assert_eq!(keys, expected);
}

#[test]
fn a_dead_webhook_never_holds_back_sampling() {
    require_root();
    // Accepts connections and never answers.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let held = Arc::new(Mutex::new(Vec::new()));
    let h2 = held.clone();
    std::thread::spawn(move || {
        for s in listener.incoming().flatten() {
            h2.lock().unwrap().push(s);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.json");
    let config = dir.path().join("gpuwatch.yaml");
    std::fs::write(
        &config,
        format!(
            "interval: 200ms\nsources: {{nvml_series_interval: 200ms}}\nalerts:\n  rules:\n    gpu_temperature_high: {{for: 0s}}\n\
             notify:\n  webhook: {{url: {url}, timeout: 2s, retries: 5, backoff: 1s, queue: 1}}\n"
        ),
    )
    .unwrap();
    let temp = |t: u32| json!({"devices": [{"uuid": "GPU-dead-hook", "temperature": t}]});
    write_scenario(&scenario, &temp(95));
    let mut child = gpuwatch_on(&scenario)
        .args(["-c"])
        .arg(&config)
        .args(["watch", "--no-docker", "--no-ebpf", "--duration", "6s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    // Answer every transition with the opposite temperature: each flip waits only on gpuwatch
    // noticing the last one, so a slow start on a loaded machine costs flips, not the test.
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let mut stderr_pipe = child.stderr.take().unwrap();
    let stderr_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr_pipe.read_to_string(&mut s);
        s
    });
    let mut lines = Vec::new();
    let mut transitions = 0;
    for line in stdout.lines() {
        let line = line.unwrap();
        if line.contains(" FIRING ") {
            transitions += 1;
            write_scenario(&scenario, &temp(50));
        } else if line.contains(" RESOLVED ") {
            transitions += 1;
            write_scenario(&scenario, &temp(95));
        }
        lines.push(line);
    }
    let status = child.wait().unwrap();
    let took = started.elapsed();
    let stdout = lines.join("\n");
    let stderr = stderr_reader.join().unwrap();
    assert!(status.success(), "{stderr}");
    // A sampler that waited on the receiver would stop after two transitions: one in flight
    // (hung for 5 retries of 2 s) and one in the queue's single slot.
    assert!(
        transitions >= 5,
        "sampling went on while the webhook hung:\n{stdout}"
    );
    // The run ends at --duration plus at most the 5 s given to the queue (11 s, and the
    // start-up), not after the retries of even one queued notification (6 + 15 s).
    assert!(took < Duration::from_secs(16), "{took:?}");
    assert!(
        stderr.contains("notification_dropped"),
        "a full queue is counted and logged:\n{stderr}"
    );
    // Said once, before the first transition, on stderr: what is watched and where alerts go.
    let said: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("gpuwatch watch on "))
        .collect();
    assert_eq!(said.len(), 1, "{stderr}");
    for part in [
        "1 GPUs",
        "12 of 12 alert rules on",
        "gpu_temperature_high",
        // Printed below, not logged a second time on the same terminal.
        "alerts go to a webhook and below",
    ] {
        assert!(said[0].contains(part), "{part}: {}", said[0]);
    }
    assert!(
        !stdout.contains("gpuwatch watch on"),
        "stdout is the transitions only"
    );
    assert!(
        !stderr.contains(" FIRING ") && !stderr.contains(" RESOLVED "),
        "each transition once, on stdout:\n{stderr}"
    );
}

fn check_config(path: &Path) -> std::process::Output {
    Command::new(support::gpuwatch_bin())
        .arg("check-config")
        .arg(path)
        .output()
        .unwrap()
}

#[test]
fn a_broken_config_names_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpuwatch.yaml");
    std::fs::write(
        &path,
        "interval: 1s\nalerts:\n  rules:\n    gpu_memory_high:\n      above_percent: lots\n",
    )
    .unwrap();
    let out = check_config(&path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr.contains(&format!(
            "{}: line 5, column 22, field `alerts.rules.gpu_memory_high.above_percent`",
            path.display()
        )),
        "{stderr}"
    );
    // Every command refuses it the same way, before sampling anything.
    let out = Command::new(support::gpuwatch_bin())
        .arg("-c")
        .arg(&path)
        .args(["snapshot", "--no-nvml", "--no-docker", "--no-ebpf"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 5"));
    assert!(out.stdout.is_empty());
    // A good file passes, and says what it enables.
    std::fs::write(
        &path,
        "alerts:\n  rules:\n    gpu_imbalance: {enabled: false}\n",
    )
    .unwrap();
    let out = check_config(&path);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("11 of 12 alert rules enabled"));
}

#[test]
fn doctor_gates_a_launch() {
    require_root();
    let c = Container::start(&unique("doctor"), &[], "sleep 3600");
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.json");
    let healthy = json!({"devices": [{"uuid": "GPU-doc", "temperature": 38,
        "processes": [{"pid": c.pid, "used_memory_bytes": 2 * GIB, "sm_util": 80}]}]});
    write_scenario(&scenario, &healthy);
    let run = |window: &str| {
        let out = gpuwatch_on(&scenario)
            .args(["doctor", "--json", "--no-ebpf", "--window", window])
            .output()
            .unwrap();
        let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
        });
        (out.status.code(), report)
    };
    let (code, report) = run("2s");
    assert_eq!(code, Some(0), "{report:#}");
    // The GPU is busy with the container's job: said, and no more than a warning.
    let checks = report["checks"].as_array().unwrap();
    let not_ok: Vec<(&str, &str)> = checks
        .iter()
        .filter(|c| c["status"] != "ok")
        .map(|c| (c["check"].as_str().unwrap(), c["value"].as_str().unwrap()))
        .collect();
    assert!(
        matches!(not_ok[..], [("gpu_in_use", v)]
            if v.starts_with("busy ") && v.ends_with(&format!("% with {} (38 °C)", c.name))),
        "{report:#}"
    );
    assert_eq!(report["status"], "warning");
    assert!(checks
        .iter()
        .any(|c2| c2["check"] == "container_memory" && c2["subject"] == c.name.as_str()));

    // The seed's risks: hot at start (while idle: a GPU warm from a job on it is busy, not
    // hot), memory nearly full and growing, a slow driver, ECC errors, a ghost.
    let dead = dead_pid();
    let pid = c.pid;
    let sick = move |used: u64| {
        json!({
            "delays_ms": {"nvmlDeviceGetMemoryInfo_v2": 600},
            "devices": [{"uuid": "GPU-doc", "temperature": 60, "memory_total_bytes": TOTAL,
                "memory_used_bytes": used, "ecc_uncorrected_volatile": 1,
                "processes": [{"pid": pid, "used_memory_bytes": 2 * GIB, "sm_util": 0},
                              {"pid": dead, "used_memory_bytes": GIB}]}]})
    };
    write_scenario(&scenario, &sick(TOTAL / 100 * 93));
    let s2 = scenario.clone();
    let grow = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        write_scenario(&s2, &sick(TOTAL / 100 * 96));
    });
    let (code, report) = run("3s");
    grow.join().unwrap();
    assert_eq!(code, Some(2), "{report:#}");
    assert_eq!(report["status"], "risk");
    let status = |check: &str| -> Vec<String> {
        report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["check"] == check)
            .map(|c| c["status"].as_str().unwrap().to_owned())
            .collect()
    };
    for check in [
        "start_temperature",
        "gpu_memory_high",
        "nvml_latency",
        "gpu_ecc_errors",
        "ghost_process",
    ] {
        assert_eq!(status(check), ["risk"], "{check}: {report:#}");
    }
}

/// `webhook.format: alertmanager`: a receiver written for Alertmanager gets its version-4
/// message, firing and then resolved, one alert each, with the same fingerprint.
#[test]
fn the_webhook_speaks_alertmanagers_message_when_asked() {
    let receiver = Receiver::start(0);
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.json");
    let hot = |celsius: u32| json!({"devices": [{"uuid": "GPU-am", "temperature": celsius}]});
    write_scenario(&scenario, &hot(90));
    let config = dir.path().join("gpuwatch.yaml");
    std::fs::write(
        &config,
        format!(
            "interval: 250ms\nalerts:\n  rules:\n    gpu_temperature_high: {{above_celsius: 83, for: 0s}}\n\
             notify:\n  webhook: {{url: {}, format: alertmanager}}\n",
            receiver.url
        ),
    )
    .unwrap();
    let mut watch = gpuwatch_on(&scenario)
        .args(["-c"])
        .arg(&config)
        .args(["watch", "--no-docker", "--no-ebpf"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let wait_for = |status: &str| -> Value {
        let started = Instant::now();
        loop {
            if let Some(b) = receiver
                .bodies()
                .into_iter()
                .find(|b| b["status"] == status)
            {
                return b;
            }
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "no {status} message: {:?}",
                receiver.bodies()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let firing = wait_for("firing");
    write_scenario(&scenario, &hot(50));
    let resolved = wait_for("resolved");
    sigterm(&watch);
    let _ = watch.wait();

    assert_eq!(firing["version"], "4", "{firing:#}");
    assert_eq!(firing["receiver"], "gpuwatch");
    assert_eq!(firing["groupLabels"]["alertname"], "gpu_temperature_high");
    let alerts = firing["alerts"].as_array().unwrap();
    assert_eq!(alerts.len(), 1, "{firing:#}");
    let a = &alerts[0];
    assert_eq!(a["status"], "firing");
    assert_eq!(a["labels"]["alertname"], "gpu_temperature_high");
    assert_eq!(a["labels"]["severity"], "critical");
    assert_eq!(a["labels"]["gpu"], "0");
    assert_eq!(a["labels"]["gpu_uuid"], "GPU-am");
    assert!(
        a["annotations"]["summary"].as_str().unwrap().contains("90"),
        "{a:#}"
    );
    assert!(!a["annotations"]["description"].as_str().unwrap().is_empty());
    assert_eq!(a["endsAt"], "0001-01-01T00:00:00Z");
    assert!(a["startsAt"].as_str().unwrap().starts_with("20"), "{a:#}");
    let r = &resolved["alerts"][0];
    assert_eq!(r["status"], "resolved");
    assert!(r["endsAt"].as_str().unwrap().starts_with("20"), "{r:#}");
    assert_eq!(r["fingerprint"], a["fingerprint"]);
    assert_eq!(a["fingerprint"].as_str().unwrap().len(), 16);
}
