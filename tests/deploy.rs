//! The deployment files against the tools that read them, and the signals a supervisor sends.
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// deploy/systemd/gpuwatch.service passes `systemd-analyze verify` with no warning, pointed at
/// this build's binary (verify checks that ExecStart exists).
#[test]
fn the_systemd_unit_verifies() {
    let unit = std::fs::read_to_string(root().join("deploy/systemd/gpuwatch.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/bin/gpuwatch "), "{unit}");
    for key in [
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "CapabilityBoundingSet=",
        "AmbientCapabilities=",
        "LimitNOFILE=",
    ] {
        assert!(unit.contains(key), "the unit lacks {key}");
    }
    assert!(
        !unit.contains("ExecReload="),
        "SIGHUP does not reload: no ExecReload"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpuwatch.service");
    std::fs::write(
        &path,
        unit.replace(
            "/usr/bin/gpuwatch",
            &support::gpuwatch_bin().to_string_lossy(),
        ),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze (Debian's systemd package) runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Messages about other units on this machine are not this unit's.
    let ours: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("gpuwatch.service"))
        .collect();
    assert!(
        out.status.success() && ours.is_empty(),
        "systemd-analyze verify: {}\n{stderr}",
        out.status
    );
}

/// SIGHUP (what `systemctl reload` and many supervisors send) is logged and ignored: the agent
/// keeps running and ends at its own time, with status 0.
#[test]
fn sighup_is_logged_and_does_not_stop_the_agent() {
    let mut child = Command::new(support::gpuwatch_bin())
        .args([
            "watch",
            "--no-nvml",
            "--no-docker",
            "--no-ebpf",
            "--interval",
            "200ms",
            "--duration",
            "4s",
        ])
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    // stderr line by line, as it comes: the readiness signals below are log lines.
    let (lines, seen) = std::sync::mpsc::channel::<String>();
    let pipe = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    let mut stderr = Vec::new();
    let mut wait_for = |what: &str| {
        while !stderr.iter().any(|l: &String| l.contains(what)) {
            let line = seen
                .recv_timeout(Duration::from_secs(10))
                .unwrap_or_else(|_| panic!("no {what:?} on stderr: {stderr:#?}"));
            stderr.push(line);
        }
    };
    // Its first round says what it watches: the signal handlers are in place by then.
    wait_for("gpuwatch watch on");
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGHUP) }, 0);
    wait_for("SIGHUP");
    assert!(
        child.try_wait().unwrap().is_none(),
        "the agent ended on SIGHUP"
    );
    let status = child.wait().unwrap();
    let elapsed = started.elapsed();
    reader.join().unwrap();
    stderr.extend(seen.try_iter());
    assert!(status.success(), "{status}: {stderr:#?}");
    assert!(elapsed >= Duration::from_secs(4), "ended after {elapsed:?}");
    assert!(
        stderr
            .iter()
            .any(|l| l.contains("SIGHUP") && l.contains("restart")),
        "{stderr:#?}"
    );
}

/// Across a fleet an alert must say which host: every aggregation and match in the shipped
/// Prometheus rules keeps `instance` (and `job`), and every summary names the instance.
#[test]
fn every_shipped_rule_keeps_and_names_the_host() {
    let rules =
        std::fs::read_to_string(root().join("deploy/prometheus/gpuwatch-rules.yml")).unwrap();
    let mut clauses = 0;
    for keyword in [" by (", " on ("] {
        for (i, _) in rules.match_indices(keyword) {
            let end = rules[i..].find(')').map_or(rules.len(), |e| i + e);
            let labels = &rules[i + keyword.len()..end];
            assert!(
                labels.contains("instance") && labels.contains("job"),
                "`{}` drops the host",
                &rules[i..=end.min(rules.len() - 1)]
            );
            clauses += 1;
        }
    }
    assert!(clauses >= 6, "{clauses} clauses checked");
    let summaries: Vec<&str> = rules
        .lines()
        .filter(|l| l.trim_start().starts_with("summary:"))
        .collect();
    assert_eq!(summaries.len(), 14, "one summary per rule");
    for s in summaries {
        assert!(s.contains("{{ $labels.instance }}"), "{s}");
    }
    for word in [" without (", "ignoring ("] {
        assert!(!rules.contains(word), "{word} may drop the host");
    }
}

/// Across a fleet the dashboard must tell hosts apart: `$job` and `$instance` variables, every
/// query narrowed by both, every aggregation keeping the host, every legend naming it.
/// Every shipped alert has a promtool case in which it fires (the cases run in
/// e2e_serve's promtool test): an alert nobody exercised could fire on nothing or never.
#[test]
fn every_shipped_alert_has_a_promtool_case_that_fires_it() {
    let dir = root().join("deploy/prometheus");
    let rules = std::fs::read_to_string(dir.join("gpuwatch-rules.yml")).unwrap();
    let tests = std::fs::read_to_string(dir.join("gpuwatch-rules.test.yml")).unwrap();
    let lines: Vec<&str> = tests.lines().map(str::trim).collect();
    let fired: Vec<&str> = lines
        .iter()
        .enumerate()
        .filter_map(|(i, l)| {
            let name = l.strip_prefix("alertname: ")?;
            let next = lines[i + 1..].iter().find(|l| !l.is_empty())?;
            (*next != "exp_alerts: []").then_some(name)
        })
        .collect();
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert_eq!(alerts.len(), 14, "{alerts:?}");
    for a in alerts {
        assert!(fired.contains(&a), "no promtool case fires {a}");
    }
}

#[test]
fn the_dashboard_selects_and_names_the_host() {
    let text =
        std::fs::read_to_string(root().join("deploy/grafana/gpuwatch-dashboard.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let variables: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    for name in ["job", "instance", "container"] {
        assert!(
            variables.contains(&name),
            "no ${name} variable: {variables:?}"
        );
    }
    let mut targets = Vec::new();
    let mut panels: Vec<&serde_json::Value> =
        dashboard["panels"].as_array().unwrap().iter().collect();
    while let Some(panel) = panels.pop() {
        targets.extend(panel["targets"].as_array().into_iter().flatten());
        panels.extend(panel["panels"].as_array().into_iter().flatten());
    }
    assert!(targets.len() >= 15, "{} queries", targets.len());
    for target in targets {
        let expr = target["expr"].as_str().unwrap();
        let selectors = expr.matches("gpuwatch_").count();
        for matcher in [r#"job=~"$job""#, r#"instance=~"$instance""#] {
            assert_eq!(
                expr.matches(matcher).count(),
                selectors,
                "{expr} lacks {matcher}"
            );
        }
        for (i, _) in expr.match_indices(" by (") {
            let labels = &expr[i..i + expr[i..].find(')').unwrap()];
            assert!(labels.contains("instance"), "{expr} drops the host");
        }
        let legend = target["legendFormat"].as_str().unwrap_or_default();
        assert!(legend.contains("{{instance}}"), "{expr}: legend {legend:?}");
    }
}

/// The settings of deploy/compose.yaml's `gpuwatch` service, as `docker run` words (sorted), so
/// the README's line, compose and the DaemonSet can be held to one set.
fn compose_settings() -> Vec<String> {
    compose_file_settings("deploy/compose.yaml")
}

fn compose_file_settings(file: &str) -> Vec<String> {
    let text = std::fs::read_to_string(root().join(file)).unwrap();
    let compose: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    let s = &compose["services"]["gpuwatch"];
    let text_of = |v: &serde_json::Value| v.as_str().unwrap().to_owned();
    let mut words = vec![
        format!("--pid={}", text_of(&s["pid"])),
        format!("--network={}", text_of(&s["network_mode"])),
    ];
    if let Some(ns) = s.get("cgroup") {
        words.push(format!("--cgroupns={}", text_of(ns)));
    }
    if s["read_only"] == true {
        words.push("--read-only".into());
    }
    for cap in s["cap_drop"].as_array().unwrap() {
        words.push(format!("--cap-drop={}", text_of(cap)));
    }
    for cap in s["cap_add"].as_array().unwrap() {
        words.push(format!("--cap-add={}", text_of(cap)));
    }
    for volume in s["volumes"].as_array().unwrap() {
        words.push(format!("-v={}", text_of(volume)));
    }
    let devices = &s["deploy"]["resources"]["reservations"]["devices"][0];
    if devices["driver"] == "nvidia" && devices["count"] == "all" {
        words.push("--gpus=all".into());
    }
    words.sort();
    words
}

/// The README's `docker run` lines and deploy/compose.yaml say the same thing (the e2e image test
/// starts the agent from compose.yaml's settings, so the README's lines are the tested ones):
/// the first for Docker 23 and later, the second for Docker 20.10 with SYS_ADMIN standing in
/// for BPF and PERFMON. Both end at the image, whose own command serves on all interfaces.
#[test]
fn the_readme_docker_lines_are_the_compose_service() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines: Vec<String> = readme
        .match_indices("docker run -d --name gpuwatch")
        .map(|(start, _)| {
            let mut command = String::new();
            for l in readme[start..].lines() {
                command.push_str(l.trim_end_matches('\\'));
                command.push(' ');
                if !l.ends_with('\\') {
                    break;
                }
            }
            command
        })
        .collect();
    assert_eq!(lines.len(), 2, "{lines:#?}");
    let current = compose_settings();
    let old_docker: Vec<String> = {
        let mut v: Vec<String> = current
            .iter()
            .filter(|w| !["--cap-add=BPF", "--cap-add=PERFMON"].contains(&w.as_str()))
            .cloned()
            .chain(["--cap-add=SYS_ADMIN".to_owned()])
            .collect();
        v.sort();
        v
    };
    assert_eq!(flags_of(&lines[0]), current, "README: {}", lines[0]);
    assert_eq!(flags_of(&lines[1]), old_docker, "README: {}", lines[1]);
    // The compose file for Docker 20.10 and Compose v1 is the README's second line but for the
    // cgroup namespace, which Compose v1 cannot set.
    let docker20: Vec<String> = old_docker
        .into_iter()
        .filter(|w| w != "--cgroupns=host")
        .collect();
    assert_eq!(
        compose_file_settings("deploy/compose.docker20.yaml"),
        docker20
    );
}

/// A `docker run -d` line's flags as `--flag=value` words, sorted; it must end at the image.
fn flags_of(line: &str) -> Vec<String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let mut flags = Vec::new();
    let mut i = 3; // after `docker run -d`
    while i < words.len() {
        let word = words[i];
        let takes_value = [
            "--name",
            "--network",
            "--cap-drop",
            "--cap-add",
            "-v",
            "--gpus",
        ];
        if takes_value.contains(&word) {
            if word != "--name" {
                flags.push(format!("{word}={}", words[i + 1]));
            }
            i += 2;
        } else if word.starts_with('-') {
            flags.push(word.to_owned());
            i += 1;
        } else {
            assert_eq!(&words[i..], ["gpuwatch:latest"], "{line}");
            break;
        }
    }
    flags.sort();
    flags
}

/// deploy/kubernetes rendered with `kubectl kustomize` (offline), one value per document.
fn kustomize_docs() -> Vec<serde_json::Value> {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(root().join("deploy/kubernetes"))
        .output()
        .expect("kubectl (Debian's kubernetes-client; `cargo xtask setup --test` installs it)");
    yaml_documents(&out)
}

/// deploy/helm/gpuwatch rendered by Helm's own engine (`helm template`, release `gpuwatch` in
/// namespace `gpuwatch`), with `--set` values.
fn helm_docs(sets: &[&str]) -> Vec<serde_json::Value> {
    let mut cmd = Command::new("helm");
    cmd.args(["template", "gpuwatch"])
        .arg(root().join("deploy/helm/gpuwatch"))
        .args(["--namespace", "gpuwatch"]);
    for set in sets {
        cmd.args(["--set", set]);
    }
    let out = cmd
        .output()
        .expect("helm (`cargo xtask setup --test` installs the pinned release)");
    yaml_documents(&out)
}

fn yaml_documents(out: &std::process::Output) -> Vec<serde_json::Value> {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split("\n---\n")
        .map(|d| serde_saphyr::from_str::<serde_json::Value>(d).unwrap())
        .filter(|d| !d.is_null())
        .collect()
}

/// The agent's version, from its manifest.
fn gpuwatch_version() -> String {
    let manifest = std::fs::read_to_string(root().join("monitor/Cargo.toml")).unwrap();
    manifest
        .lines()
        .find_map(|l| l.strip_prefix("version = "))
        .map(|v| v.trim_matches('"').to_owned())
        .expect("a version in monitor/Cargo.toml")
}

fn of_kind<'a>(docs: &'a [serde_json::Value], kind: &str) -> &'a serde_json::Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in {docs:#?}"))
}

/// What the image needs, in rendered manifests: the host's PID namespace, eBPF's capabilities
/// (compose's) and nothing else, a read-only root, /sys, the Docker socket and containerd's task
/// specs read-only, the readiness and liveness endpoints, and a Service and ServiceMonitor that
/// select its pods.
fn check_what_the_image_needs(docs: &[serde_json::Value]) {
    let ds = of_kind(docs, "DaemonSet");
    assert_eq!(ds["metadata"]["namespace"], "gpuwatch");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostPID"], true, "GPU processes are found by host PID");
    let c = &pod["containers"][0];
    assert_eq!(c["args"][0], "serve");
    let sc = &c["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    let compose_caps: Vec<String> = compose_settings()
        .iter()
        .filter_map(|w| w.strip_prefix("--cap-add=").map(str::to_owned))
        .collect();
    assert_eq!(sc["capabilities"]["add"], serde_json::json!(compose_caps));
    assert_ne!(sc["privileged"], true);
    let mounts = c["volumeMounts"].as_array().unwrap();
    for path in [
        "/sys",
        "/var/run/docker.sock",
        "/run/containerd/io.containerd.runtime.v2.task",
    ] {
        let mount = mounts
            .iter()
            .find(|m| m["mountPath"] == path)
            .unwrap_or_else(|| panic!("{path} not mounted"));
        assert_eq!(mount["readOnly"], true, "{path}");
        let volume = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == mount["name"])
            .unwrap();
        assert_eq!(volume["hostPath"]["path"], path);
    }
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/-/ready");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/-/healthy");
    assert_eq!(c["ports"][0]["containerPort"], 9879);
    assert!(c["resources"]["requests"]["memory"].is_string());
    let pod_labels = &ds["spec"]["template"]["metadata"]["labels"];
    let service = of_kind(docs, "Service");
    for (k, v) in service["spec"]["selector"].as_object().unwrap() {
        assert_eq!(&pod_labels[k], v, "the Service selects the pods");
    }
    let monitor = of_kind(docs, "ServiceMonitor");
    for (k, v) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(
            &service["metadata"]["labels"][k], v,
            "the ServiceMonitor selects the Service"
        );
    }
    assert_eq!(
        monitor["spec"]["endpoints"][0]["port"],
        service["spec"]["ports"][0]["name"]
    );
}

#[test]
fn the_kubernetes_manifests_render_and_carry_what_the_image_needs() {
    check_what_the_image_needs(&kustomize_docs());
}

/// The Helm chart, rendered by Helm with its defaults, carries what the image needs and deploys
/// what the kustomize manifests deploy: the same pod (namespaces, image, arguments,
/// capabilities, mounts, probes, resources, placement), the same Service ports and the same
/// scrape. Only the labels Helm adds to name the release differ.
#[test]
fn the_helm_chart_renders_what_the_kustomize_manifests_deploy() {
    let helm = helm_docs(&[]);
    check_what_the_image_needs(&helm);
    let kustomize = kustomize_docs();
    let pod =
        |docs: &[serde_json::Value]| of_kind(docs, "DaemonSet")["spec"]["template"]["spec"].clone();
    assert_eq!(pod(&helm), pod(&kustomize));
    for (kind, field) in [("Service", "ports"), ("ServiceMonitor", "endpoints")] {
        assert_eq!(
            of_kind(&helm, kind)["spec"][field],
            of_kind(&kustomize, kind)["spec"][field],
            "{kind}"
        );
    }
    for kind in ["DaemonSet", "Service", "ServiceMonitor"] {
        assert_eq!(
            of_kind(&helm, kind)["metadata"]["name"],
            "gpuwatch",
            "{kind}"
        );
    }
    // The chart is released with the agent: its version and appVersion are the agent's.
    let chart = std::fs::read_to_string(root().join("deploy/helm/gpuwatch/Chart.yaml")).unwrap();
    let chart: serde_json::Value = serde_saphyr::from_str(&chart).unwrap();
    let agent = gpuwatch_version();
    assert_eq!(chart["version"], agent);
    assert_eq!(chart["appVersion"], agent);
}

/// The chart's values do what values.yaml says: a web configuration Secret is mounted and
/// passed to `serve` (and the probes turn to HTTPS), a `config` becomes a ConfigMap the agent
/// reads, a node without Docker drops the socket, and the image, placement and the
/// ServiceMonitor follow their values.
#[test]
fn the_helm_charts_values_reach_the_pod() {
    let docs = helm_docs(&[
        "webConfig.secretName=gpuwatch-web",
        "config.interval=2s",
        "dockerSocket.enabled=false",
        "image.repository=registry.example/gpuwatch",
        "image.tag=0.1.0",
        "nodeSelector.gpu=yes",
        "serviceMonitor.enabled=false",
    ]);
    let ds = of_kind(&docs, "DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_eq!(c["image"], "registry.example/gpuwatch:0.1.0");
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let after = |flag: &str| {
        args.iter()
            .position(|a| *a == flag)
            .map(|i| args[i + 1])
            .unwrap_or_else(|| panic!("no {flag} in {args:?}"))
    };
    let mount_of = |name: &str| {
        c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == name)
            .unwrap_or_else(|| panic!("no mount {name}"))
            .clone()
    };
    let volume_of = |name: &str| {
        pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no volume {name}"))
            .clone()
    };
    let web = after("--web.config.file");
    assert!(
        web.starts_with(mount_of("web-config")["mountPath"].as_str().unwrap()),
        "{web}"
    );
    assert_eq!(
        volume_of("web-config")["secret"]["secretName"],
        "gpuwatch-web"
    );
    for probe in ["readinessProbe", "livenessProbe"] {
        assert_eq!(c[probe]["httpGet"]["scheme"], "HTTPS", "{probe}");
    }
    assert_eq!(after("--config"), mount_of("config")["mountPath"]);
    let config_map = of_kind(&docs, "ConfigMap");
    assert_eq!(
        volume_of("config")["configMap"]["name"],
        config_map["metadata"]["name"]
    );
    let config: serde_json::Value =
        serde_saphyr::from_str(config_map["data"]["gpuwatch.yaml"].as_str().unwrap()).unwrap();
    assert_eq!(config, serde_json::json!({"interval": "2s"}));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gpuwatch.yaml");
    std::fs::write(&file, config_map["data"]["gpuwatch.yaml"].as_str().unwrap()).unwrap();
    let check = Command::new(support::gpuwatch_bin())
        .arg("check-config")
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "the agent reads the chart's ConfigMap: {}",
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(
        !c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["mountPath"] == "/var/run/docker.sock"),
        "no Docker socket on a node without Docker"
    );
    assert_eq!(
        pod["nodeSelector"],
        serde_json::json!({"gpu": "yes", "nvidia.com/gpu.present": "true"})
    );
    assert!(docs.iter().all(|d| d["kind"] != "ServiceMonitor"));
}

/// The shipped Prometheus rules restate the agent's own alert rules for setups that alert from
/// Alertmanager: each threshold, window and `for` must be the agent's default, so changing one
/// without the other fails here.
#[test]
fn the_prometheus_rules_use_the_agents_own_thresholds() {
    let text =
        std::fs::read_to_string(root().join("deploy/prometheus/gpuwatch-rules.yml")).unwrap();
    let doc: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    let alerts: Vec<&serde_json::Value> = doc["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .filter(|r| r.get("alert").is_some())
        .collect();
    let rule = |name: &str| -> (String, Duration) {
        let r = alerts
            .iter()
            .find(|r| r["alert"] == name)
            .unwrap_or_else(|| panic!("no alert {name}"));
        let expr = r["expr"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let for_ = r
            .get("for")
            .and_then(|f| f.as_str())
            .map_or(Duration::ZERO, prom_duration);
        (expr, for_)
    };
    let c = gpuwatch::health::rules::RulesConfig::default();
    let mib = |b: u64| b / (1 << 20);
    let minutes = |d: Duration| format!("{}m", d.as_secs() / 60);
    let checks: Vec<(&str, Vec<String>, Duration)> = vec![
        (
            "GpuwatchContainerGPUUnderutilized",
            vec![format!(
                "< {:.2}",
                c.gpu_underutilized.below_percent / 100.0
            )],
            c.gpu_underutilized.for_,
        ),
        (
            "GpuwatchGPUMemoryHigh",
            vec![format!("> {:.2}", c.gpu_memory_high.above_percent / 100.0)],
            c.gpu_memory_high.for_,
        ),
        (
            "GpuwatchGPUTemperatureHigh",
            vec![format!("> {}", c.gpu_temperature_high.above_celsius)],
            c.gpu_temperature_high.for_,
        ),
        (
            "GpuwatchContainerGPUMemoryLeak",
            vec![
                format!("[{}:", minutes(c.gpu_memory_leak.window)),
                format!(
                    "* 60 > {} * 1024 * 1024",
                    mib(c.gpu_memory_leak.min_growth_per_minute.0)
                ),
            ],
            c.gpu_memory_leak.min_duration,
        ),
        (
            "GpuwatchContainerMemoryLeak",
            vec![
                format!("[{}]", minutes(c.cpu_memory_leak.window)),
                format!(
                    "* 60 > {} * 1024 * 1024",
                    mib(c.cpu_memory_leak.min_growth_per_minute.0)
                ),
            ],
            c.cpu_memory_leak.min_duration,
        ),
        (
            "GpuwatchContainerGPUImbalance",
            vec![format!(") > {:.2}", c.gpu_imbalance.spread_percent / 100.0)],
            c.gpu_imbalance.for_,
        ),
        (
            "GpuwatchGPUPowerCapLowUtilization",
            vec![
                format!(">= {:.2}", c.power_cap_low_util.power_ratio),
                format!(
                    "< {:.2}",
                    c.power_cap_low_util.below_utilization_percent / 100.0
                ),
            ],
            c.power_cap_low_util.for_,
        ),
        ("GpuwatchGPULost", vec!["== 1".into()], c.gpu_lost.for_),
        (
            "GpuwatchGPUECCErrors",
            vec!["> 0".into()],
            c.gpu_ecc_errors.for_,
        ),
        (
            "GpuwatchGPUXidErrors",
            vec![format!("[{}]) > 0", minutes(c.gpu_xid_errors.hold))],
            c.gpu_xid_errors.for_,
        ),
    ];
    for (name, fragments, for_) in checks {
        let (expr, got_for) = rule(name);
        for f in fragments {
            assert!(
                expr.contains(&f),
                "{name}: `{expr}` lacks the agent's `{f}`"
            );
        }
        assert_eq!(got_for, for_, "{name}: `for` differs from the agent's");
    }
}

/// A Prometheus duration of one unit (`10s`, `3m`, `1h`).
fn prom_duration(s: &str) -> Duration {
    let (n, unit) = s.split_at(s.len() - 1);
    let n: u64 = n.parse().unwrap_or_else(|_| panic!("duration {s}"));
    Duration::from_secs(match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => panic!("duration {s}"),
    })
}
