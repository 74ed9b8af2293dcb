//! `gpuwatch serve` scraped by a real Prometheus (Debian's package): over TLS with basic auth,
//! a container's series found by a PromQL query, a scrape without credentials refused, the
//! shipped alerting rules loaded by Prometheus and checked and unit-tested by promtool.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

mod chaos;

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn get(url: &str) -> (u16, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into();
    let mut r = agent.get(url).call().unwrap();
    let status = r.status().as_u16();
    (status, r.body_mut().read_to_string().unwrap_or_default())
}

/// Starts a real Prometheus with the shipped rules and `scrape_configs` (YAML, indented by two
/// spaces); returns it with its URL.
fn prometheus(dir: &Path, scrape_configs: &str) -> (Running, String) {
    support::prometheus(dir, &format!("scrape_configs:\n{scrape_configs}"))
}

/// `gpuwatch serve` on a free port with the fake NVML reading `scenario`.
fn serve(scenario: &Path, extra: &[&str]) -> (Running, String) {
    serve_via(&[], scenario, extra)
}

/// `up` of a scrape job, once it has been scraped (each job's first scrape comes at its own
/// offset within the interval).
fn up(prom: &str, job: &str) -> Option<String> {
    let started = Instant::now();
    loop {
        let r = promql(prom, &format!("up{{job=\"{job}\"}}"));
        if let Some(v) = r["data"]["result"][0]["value"][1].as_str() {
            return Some(v.to_owned());
        }
        if started.elapsed() > Duration::from_secs(30) {
            return None;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[test]
fn prometheus_scrapes_it_over_tls_with_basic_auth() {
    require_root();
    let c = Container::start(
        &unique("serve"),
        &[("com.docker.compose.service", "trainer")],
        "sleep 3600",
    );
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.json");
    std::fs::write(
        &scenario,
        serde_json::to_vec(
            &json!({"devices": [{"uuid": "GPU-serve", "utilization_gpu": 70, "power_mw": 250_000,
            "processes": [{"pid": c.pid, "used_memory_bytes": 3 * GIB, "sm_util": 70}]}]}),
        )
        .unwrap(),
    )
    .unwrap();

    // A self-signed certificate for localhost, a bcrypt user, the exporter web config.
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let (cert_pem, key_pem) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_pem, cert.cert.pem()).unwrap();
    std::fs::write(&key_pem, cert.signing_key.serialize_pem()).unwrap();
    let web = dir.path().join("web.yml");
    std::fs::write(
        &web,
        format!(
            "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n\
             basic_auth_users:\n  prom: {}\n",
            bcrypt::hash("s3cret", 4).unwrap()
        ),
    )
    .unwrap();
    // The GPU series every second, so the counters below step each second, not each 10 s.
    let config = dir.path().join("gpuwatch.yaml");
    std::fs::write(&config, "sources:\n  nvml_series_interval: 1s\n").unwrap();
    let (_agent, addr) = serve(
        &scenario,
        &[
            "--web.config.file",
            web.to_str().unwrap(),
            "-c",
            config.to_str().unwrap(),
        ],
    );
    assert!(addr.starts_with("https://127.0.0.1:"), "{addr}");
    let target = addr.trim_start_matches("https://").to_owned();

    let (_prometheus, prom) = prometheus(
        dir.path(),
        &format!(
            "  - job_name: gpuwatch
    scheme: https
    tls_config: {{ca_file: {ca}, server_name: localhost}}
    basic_auth: {{username: prom, password: s3cret}}
    static_configs: [{{targets: ['{target}']}}]
  - job_name: gpuwatch-no-credentials
    scheme: https
    tls_config: {{ca_file: {ca}, server_name: localhost}}
    static_configs: [{{targets: ['{target}']}}]
",
            ca = cert_pem.display(),
        ),
    );

    // The container's GPU memory, as Prometheus stored it from a TLS + basic-auth scrape.
    let query = format!(
        "gpuwatch_container_gpu_memory_bytes{{job=\"gpuwatch\",container_name=\"{}\"}}",
        c.name
    );
    let started = Instant::now();
    let result = loop {
        let r = promql(&prom, &query);
        if let Some(first) = r["data"]["result"].as_array().and_then(|a| a.first()) {
            break first.clone();
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no series after 60 s; last answer {r}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let m = &result["metric"];
    assert_eq!(m["gpu"], "0");
    assert_eq!(m["uuid"], "GPU-serve");
    assert_eq!(m["image"], IMAGE);
    assert_eq!(m["compose_service"], "trainer");
    assert_eq!(m["container_id"], &c.id[..12]);
    assert_eq!(
        result["value"][1].as_str().unwrap().parse::<f64>().unwrap(),
        (3 * GIB) as f64
    );
    // Without credentials the same target is refused.
    assert_eq!(up(&prom, "gpuwatch").as_deref(), Some("1"));
    assert_eq!(up(&prom, "gpuwatch-no-credentials").as_deref(), Some("0"));
    // Prometheus loaded every shipped rule.
    let (status, rules) = get(&format!("{prom}/api/v1/rules"));
    assert_eq!(status, 200);
    let rules: Value = serde_json::from_str(&rules).unwrap();
    let loaded = rules["data"]["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(loaded, 14, "{rules}");

    // The accounting counters: over 20 s of a GPU 70 % busy with the container's work,
    // increase() gives 14 busy GPU-seconds, for the GPU and for the container, and 6 idle; at
    // 250 W, 5,000 J for the GPU, 3,500 of them the container's busy part, 1,500 idle.
    let value = |q: &str| -> Option<f64> {
        promql(&prom, q)["data"]["result"].as_array()?.first()?["value"][1]
            .as_str()?
            .parse()
            .ok()
    };
    while started.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(500));
    }
    let sel = format!("job=\"gpuwatch\",container_name=\"{}\"", c.name);
    for (query, want) in [
        (
            "increase(gpuwatch_gpu_busy_seconds_total{job=\"gpuwatch\"}[20s])".to_owned(),
            14.0,
        ),
        (
            format!("increase(gpuwatch_container_gpu_busy_seconds_total{{{sel}}}[20s])"),
            14.0,
        ),
        (
            format!("sum(increase(gpuwatch_container_gpu_idle_seconds_total{{{sel}}}[20s]))"),
            6.0,
        ),
    ] {
        let got = value(&query).unwrap_or_else(|| panic!("no value for {query}"));
        eprintln!("{query} = {got:.2} (want {want})");
        assert!(
            (got - want).abs() <= 2.0,
            "{query}: {got}, not about {want}"
        );
    }
    // Joules: the same 2 s of slack, at 250 W.
    for (query, want) in [
        (
            "increase(gpuwatch_gpu_energy_joules_total{job=\"gpuwatch\"}[20s])".to_owned(),
            5000.0,
        ),
        (
            format!("increase(gpuwatch_container_gpu_busy_energy_joules_total{{{sel}}}[20s])"),
            3500.0,
        ),
        (
            format!("sum(increase(gpuwatch_container_gpu_idle_energy_joules_total{{{sel}}}[20s]))"),
            1500.0,
        ),
    ] {
        let got = value(&query).unwrap_or_else(|| panic!("no value for {query}"));
        eprintln!("{query} = {got:.0} (want {want})");
        assert!(
            (got - want).abs() <= 500.0,
            "{query}: {got}, not about {want}"
        );
    }
}

#[test]
fn mutual_tls_admits_only_clients_with_a_certificate_from_the_ca() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.json");
    std::fs::write(&scenario, br#"{"devices": [{"uuid": "GPU-mtls"}]}"#).unwrap();
    let write = |name: &str, text: String| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    // A CA for clients, a client certificate it signs, and a server certificate.
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, rcgen::KeyPair::generate().unwrap())
        .unwrap();
    let client_key = rcgen::KeyPair::generate().unwrap();
    let client = rcgen::CertificateParams::new(vec!["prometheus".to_owned()])
        .unwrap()
        .signed_by(&client_key, &ca)
        .unwrap();
    // A client certificate from another CA: a server that accepts any certificate would let
    // it in.
    let mut other_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    other_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let other_ca =
        rcgen::CertifiedIssuer::self_signed(other_params, rcgen::KeyPair::generate().unwrap())
            .unwrap();
    let stranger_key = rcgen::KeyPair::generate().unwrap();
    let stranger = rcgen::CertificateParams::new(vec!["prometheus".to_owned()])
        .unwrap()
        .signed_by(&stranger_key, &other_ca)
        .unwrap();
    let stranger_pem = write("stranger.pem", stranger.pem());
    let stranger_key_pem = write("stranger.key", stranger_key.serialize_pem());
    let server = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    write("clients-ca.pem", ca.pem());
    let client_pem = write("client.pem", client.pem());
    let client_key_pem = write("client.key", client_key.serialize_pem());
    let server_pem = write("server.pem", server.cert.pem());
    write("server.key", server.signing_key.serialize_pem());
    let web = write(
        "web.yml",
        "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  \
         client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: clients-ca.pem\n"
            .to_owned(),
    );
    let (_agent, addr) = serve(
        &scenario,
        &["--no-docker", "--web.config.file", web.to_str().unwrap()],
    );
    let target = addr.trim_start_matches("https://").to_owned();
    let (_prometheus, prom) = prometheus(
        dir.path(),
        &format!(
            "  - job_name: with-client-cert
    scheme: https
    tls_config: {{ca_file: {server}, server_name: localhost, cert_file: {cert}, key_file: {key}}}
    static_configs: [{{targets: ['{target}']}}]
  - job_name: without-client-cert
    scheme: https
    tls_config: {{ca_file: {server}, server_name: localhost}}
    static_configs: [{{targets: ['{target}']}}]
  - job_name: with-another-cas-cert
    scheme: https
    tls_config: {{ca_file: {server}, server_name: localhost, cert_file: {stranger}, key_file: {stranger_key}}}
    static_configs: [{{targets: ['{target}']}}]
",
            server = server_pem.display(),
            cert = client_pem.display(),
            key = client_key_pem.display(),
            stranger = stranger_pem.display(),
            stranger_key = stranger_key_pem.display(),
        ),
    );
    assert_eq!(up(&prom, "with-client-cert").as_deref(), Some("1"));
    assert_eq!(up(&prom, "without-client-cert").as_deref(), Some("0"));
    assert_eq!(up(&prom, "with-another-cas-cert").as_deref(), Some("0"));
}

#[test]
fn api_landing_page_and_expiry_of_exited_containers() {
    require_root();
    let c = Container::start(&unique("serve-api"), &[], "sleep 3600");
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.json");
    std::fs::write(
        &scenario,
        serde_json::to_vec(&json!({"devices": [{"uuid": "GPU-api", "temperature": 99,
            "processes": [{"pid": c.pid, "used_memory_bytes": GIB, "sm_util": 50}]}]}))
        .unwrap(),
    )
    .unwrap();
    let config = dir.path().join("gpuwatch.yaml");
    std::fs::write(
        &config,
        "alerts:\n  rules:\n    gpu_temperature_high: {for: 0s}\n",
    )
    .unwrap();
    let (_agent, addr) = serve(&scenario, &["-c", config.to_str().unwrap()]);
    // Healthy at once (the process answers); ready once a round is published.
    assert_eq!(get(&format!("{addr}/-/healthy")).0, 200);
    let wait_for = |path: &str, pred: &dyn Fn(&str) -> bool| -> String {
        let started = Instant::now();
        loop {
            let (status, body) = get(&format!("{addr}{path}"));
            if status == 200 && pred(&body) {
                return body;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "{path}: {status} {body}"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    };
    assert_eq!(wait_for("/-/ready", &|b| b == "ready\n"), "ready\n");
    let landing = wait_for("/", &|b| b.contains("/metrics"));
    assert!(landing.contains("<title>gpuwatch: "), "{landing}");
    let containers: Value =
        serde_json::from_str(&wait_for("/api/v1/containers", &|b| b.contains(&c.name))).unwrap();
    let mine = containers["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == c.name.as_str())
        .unwrap();
    assert_eq!(mine["gpu"]["memory_bytes"], GIB);
    let alerts: Value = serde_json::from_str(&wait_for("/api/v1/alerts", &|b| {
        b.contains("gpu_temperature_high")
    }))
    .unwrap();
    assert_eq!(alerts["alerts"][0]["state"], "firing");
    let metrics = wait_for("/metrics", &|b| b.contains(&c.name));
    assert!(metrics.contains("gpuwatch_alert{rule=\"gpu_temperature_high\""));
    assert_eq!(get(&format!("{addr}/nowhere")).0, 404);
    // The container stops (and the driver frees its process's memory): its series are gone
    // from the next scrapes.
    drop(c);
    std::fs::write(
        &scenario,
        serde_json::to_vec(&json!({"devices": [{"uuid": "GPU-api", "temperature": 99}]})).unwrap(),
    )
    .unwrap();
    let name = containers["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["gpu"]["memory_bytes"] == GIB)
        .unwrap()["name"]
        .as_str()
        .unwrap()
        .to_owned();
    // Gone while the rest is still there (an empty /metrics lacks the name too).
    let after = wait_for("/metrics", &|b| !b.contains(&name));
    for still in [
        "gpuwatch_up{source=\"nvml\"} 1",
        "gpuwatch_gpu_temperature_celsius{",
        "gpuwatch_alert{rule=\"gpu_temperature_high\"",
    ] {
        assert!(after.contains(still), "{still} missing:\n{after}");
    }
}

/// The window of the first round `serve` publishes that has one: the time since the round
/// before, which the sampler measured.
fn round_window(addr: &str) -> f64 {
    let started = Instant::now();
    loop {
        let (_, body) = get(&format!("{addr}/api/v1/snapshot"));
        let snap: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        if let Some(w) = snap["window_seconds"].as_f64() {
            return w;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "{body}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn serve_samples_at_serve_interval_and_the_flag_beats_it() {
    // `serve` has its own interval (5 s by default), not `interval` (1 s, the other commands'):
    // an exporter is scraped every 15 s or more. The page reloads every round and says how
    // often; a round's window says how long after the one before it was taken.
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.json");
    std::fs::write(&scenario, br#"{"devices": [{"uuid": "GPU-interval"}]}"#).unwrap();
    let refresh = |addr: &str| -> String {
        let started = Instant::now();
        loop {
            let (status, body) = get(&format!("{addr}/"));
            if status == 200 {
                return body;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "{status}: {body}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let defaults = dir.path().join("defaults.yaml");
    std::fs::write(&defaults, "sources:\n  nvml_series_interval: 1s\n").unwrap();
    let (_agent, addr) = serve_configured(&defaults, &scenario, &[]);
    let page = refresh(&addr);
    assert!(
        page.contains(r#"http-equiv="refresh" content="5""#),
        "{page}"
    );

    let own = dir.path().join("own.yaml");
    std::fs::write(
        &own,
        "interval: 3s\nserve_interval: 2s\nsources:\n  nvml_series_interval: 1s\n",
    )
    .unwrap();
    let (_agent, addr) = serve_configured(&own, &scenario, &[]);
    assert!(refresh(&addr).contains(r#"content="2""#));
    let window = round_window(&addr);
    assert!((window - 2.0).abs() < 0.3, "rounds {window} s apart");
    let (_agent, addr) = serve_configured(&own, &scenario, &["--interval", "1s"]);
    assert!(refresh(&addr).contains(r#"content="1""#));
    let window = round_window(&addr);
    assert!((window - 1.0).abs() < 0.3, "rounds {window} s apart");
}

#[test]
fn promtool_accepts_and_unit_tests_the_shipped_rules() {
    let dir = deploy().join("prometheus");
    let check = Command::new("promtool")
        .args(["check", "rules", "gpuwatch-rules.yml"])
        .current_dir(&dir)
        .output()
        .expect("promtool (Debian package `prometheus`)");
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
    let test = Command::new("promtool")
        .args(["test", "rules", "gpuwatch-rules.test.yml"])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(
        test.status.success(),
        "{}{}",
        String::from_utf8_lossy(&test.stdout),
        String::from_utf8_lossy(&test.stderr)
    );
}

/// `/metrics` answers what the client asks for: OpenMetrics to Prometheus (which asks for it),
/// the text format to anyone else; `promtool check metrics` finds nothing to say of the text
/// format, a counter's help included.
#[test]
fn metrics_come_in_the_format_asked_for_and_pass_promtool() {
    require_root();
    let c = Container::start(&unique("negotiate"), &[], "sleep 3600");
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.json");
    std::fs::write(
        &scenario,
        json!({"devices": [{"uuid": "GPU-negotiate",
            "processes": [{"pid": c.pid, "used_memory_bytes": GIB, "sm_util": 60}]}]})
        .to_string(),
    )
    .unwrap();
    let (_agent, url) = serve(&scenario, &[]);
    wait_for_metrics(&url, |m| m.contains("gpuwatch_gpu_busy_seconds_total"));
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into();
    let fetch = |accept: &str| {
        let mut r = agent
            .get(&format!("{url}/metrics"))
            .header("Accept", accept)
            .call()
            .unwrap();
        let kind = r.headers()["content-type"].to_str().unwrap().to_owned();
        (kind, r.body_mut().read_to_string().unwrap())
    };
    let (kind, om) =
        fetch("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5");
    assert!(kind.starts_with("application/openmetrics-text"), "{kind}");
    assert!(om.trim_end().ends_with("# EOF"));
    let (kind, plain) = fetch("text/plain;version=0.0.4");
    assert!(kind.starts_with("text/plain; version=0.0.4"), "{kind}");
    assert!(!plain.contains("# EOF") && !plain.contains("# UNIT"));
    assert!(
        plain.contains("# HELP gpuwatch_gpu_busy_seconds_total "),
        "{plain}"
    );
    assert!(plain.contains("# TYPE gpuwatch_gpu_busy_seconds_total counter"));
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package `prometheus`)");
    use std::io::Write;
    check
        .stdin
        .take()
        .unwrap()
        .write_all(plain.as_bytes())
        .unwrap();
    let out = check.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool: {said}"
    );
}

/// Slow clients under a 1,024-file limit (soft and hard, so the agent cannot raise it): 300
/// half-sent requests leave scrapes answering; past the connection limit ((1024 - 64) / 2 =
/// 480), with every place held by a half-sent request, a real scrape is still answered: the
/// half-sent requests that came first are closed at once to make room (before, it got a 503);
/// every half-sent request is closed by the server within the header timeout (10 s).
#[test]
fn half_sent_requests_neither_starve_scrapes_nor_stay_open() {
    use std::io::{Read, Write};
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.json");
    std::fs::write(&scenario, r#"{"devices": [{"uuid": "GPU-slow"}]}"#).unwrap();
    let mut cmd = Command::new(support::gpuwatch_bin());
    cmd.args([
        "serve",
        "--web.listen-address",
        "127.0.0.1:0",
        "--interval",
        "500ms",
    ])
    .args(["--no-docker", "--no-ebpf"])
    .env("GPUWATCH_NVML_LIB", fake_nvml_lib())
    .env("FAKE_NVML_SCENARIO", &scenario)
    .stderr(Stdio::piped());
    limit_open_files(&mut cmd, 1024);
    let mut child = cmd.spawn().unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let addr = first.rsplit_once(" on ").unwrap().1.to_owned();
    std::thread::spawn(move || for _ in lines {});
    let _agent = Running(child);
    let host = addr.trim_start_matches("http://").to_owned();
    let scrape = || get(&format!("{addr}/metrics"));
    let started = Instant::now();
    while scrape().0 != 200 {
        assert!(started.elapsed() < Duration::from_secs(20), "never served");
        std::thread::sleep(Duration::from_millis(200));
    }

    let half_sent = |n: usize| -> Vec<std::net::TcpStream> {
        (0..n)
            .map(|_| {
                let mut s = std::net::TcpStream::connect(&host).unwrap();
                s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                    .unwrap();
                s
            })
            .collect()
    };
    let mut slow = half_sent(300);
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    let (status, body) = scrape();
    assert_eq!(status, 200, "{body}");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());

    // Past the limit, every place held by a half-sent request: a scrape is still answered,
    // and the first half-sent requests are closed at once, long before the header timeout.
    slow.extend(half_sent(180));
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    let (status, body) = scrape();
    assert_eq!(status, 200, "at the limit: {body}");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    let mut first = slow.remove(0);
    first
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    let mut answer = Vec::new();
    let read = first.read_to_end(&mut answer);
    assert!(
        matches!(&read, Ok(0))
            || matches!(&read, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "the oldest half-sent request is closed for the scrape: {read:?} {answer:?}"
    );

    // The server closes every half-sent request within the header timeout.
    let deadline = Instant::now() + Duration::from_secs(15);
    for s in &mut slow {
        let left = deadline.saturating_duration_since(Instant::now());
        s.set_read_timeout(Some(left.max(Duration::from_millis(10))))
            .unwrap();
        let mut buf = [0u8; 512];
        let closed = loop {
            match s.read(&mut buf) {
                Ok(0) => break true,
                Ok(_) => continue, // a 408 or 503 before the close
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
                Err(_) => break false,
            }
        };
        assert!(closed, "a half-sent request still open after 15 s");
    }
    assert!(started.elapsed() < Duration::from_secs(60));
    let (status, _) = scrape();
    assert_eq!(status, 200);
}

/// A password guesser is cut off: ten wrong passwords from one address within a minute, then
/// `429` with `Retry-After` and no more bcrypt, while the right password, once verified, still
/// gets in; a scraper with no credentials at all is refused and not counted.
#[test]
fn a_password_guesser_is_slowed_and_the_right_password_still_gets_in() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.json");
    std::fs::write(&scenario, br#"{"devices": [{"uuid": "GPU-guess"}]}"#).unwrap();
    let web = dir.path().join("web.yml");
    std::fs::write(
        &web,
        format!(
            "basic_auth_users:\n  prom: {}\n",
            bcrypt::hash("s3cret", 4).unwrap()
        ),
    )
    .unwrap();
    let (_agent, addr) = serve(&scenario, &["--web.config.file", web.to_str().unwrap()]);
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(20)))
        .build()
        .into();
    let call = |user: &str, password: Option<&str>| {
        let mut req = agent.get(&format!("{addr}/metrics"));
        if let Some(p) = password {
            use base64::Engine;
            let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{p}"));
            req = req.header("Authorization", &format!("Basic {token}"));
        }
        let r = req.call().unwrap();
        let retry = r
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        (r.status().as_u16(), retry)
    };
    // 503 until the first round is published. Nothing is verified yet, as after a restart.
    let started = Instant::now();
    while call("prom", None).0 == 503 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no round in 30 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for _ in 0..20 {
        assert_eq!(call("prom", None).0, 401, "no credentials");
    }
    for i in 0..10 {
        assert_eq!(call("prom", Some("guess")).0, 401, "guess {i}");
    }
    // Locked: prom from this network is checked once per 6 s, one request waiting. The next
    // guess is checked at once; one sent after it waits its turn (6 s); one more waits behind
    // it; the one after that finds the lane full: 429 with Retry-After, at once.
    assert_eq!(call("prom", Some("guess")).0, 401, "checked at its turn");
    let t = Instant::now();
    std::thread::scope(|s| {
        let second = s.spawn(|| call("prom", Some("guess")));
        std::thread::sleep(Duration::from_secs(1));
        let third = s.spawn(|| call("prom", Some("guess")));
        std::thread::sleep(Duration::from_millis(500));
        let (status, retry) = call("prom", Some("guess"));
        assert_eq!(status, 429, "the lane is full");
        let retry: u64 = retry.expect("Retry-After").parse().unwrap();
        assert!((1..=60).contains(&retry), "{retry}");
        assert!(t.elapsed() < Duration::from_secs(5), "refused at once");
        assert_eq!(second.join().unwrap().0, 401);
        assert!(
            t.elapsed() >= Duration::from_secs(5),
            "the second waited its turn"
        );
        assert_eq!(third.join().unwrap().0, 401);
    });
    // Another user from the same address is not locked; the right password gets in at its
    // turn, whoever guessed before it.
    assert_eq!(call("grafana", Some("guess")).0, 401);
    assert_eq!(
        call("prom", Some("s3cret")).0,
        200,
        "the right password gets in"
    );
    assert_eq!(call("prom", Some("s3cret")).0, 200, "and is remembered");
}

/// NVML's series call hangs (a wedged driver): the agent says which step has not returned,
/// `/-/healthy` and `/-/ready` turn false, and SIGTERM still ends it within seconds.
#[test]
fn a_hung_nvml_call_turns_health_false_and_does_not_block_shutdown() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.json");
    std::fs::write(
        &scenario,
        json!({
            "delays_ms": {"nvmlDeviceGetSamples": 3_600_000},
            "devices": [{"uuid": "GPU-hung"}]
        })
        .to_string(),
    )
    .unwrap();
    let log = dir.path().join("stderr.log");
    let mut child = Command::new(support::gpuwatch_bin())
        .args(["serve", "--web.listen-address", "127.0.0.1:0"])
        .args(["--interval", "500ms", "--no-docker", "--no-ebpf"])
        .env("GPUWATCH_NVML_LIB", fake_nvml_lib())
        .env("FAKE_NVML_SCENARIO", &scenario)
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let addr = loop {
        let text = std::fs::read_to_string(&log).unwrap();
        if let Some(a) = text
            .lines()
            .find_map(|l| l.rsplit_once("listening on ").map(|(_, a)| a.to_owned()))
        {
            break a;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "{text}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(get(&format!("{addr}/-/healthy")).0, 200, "healthy at first");
    // The first round fetches the series at once and hangs there; the limit is 10 s.
    let (status, body) = loop {
        let (status, body) = get(&format!("{addr}/-/healthy"));
        if status != 200 || started.elapsed() > Duration::from_secs(30) {
            break (status, body);
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("utilisation series") && body.contains("running for"),
        "{body}"
    );
    let (ready, _) = get(&format!("{addr}/-/ready"));
    assert_eq!(ready, 503);
    let (status, took) = sigterm_and_wait(&mut child);
    assert!(took < Duration::from_secs(6), "exit took {took:?}");
    assert_eq!(status.code(), Some(3), "{status}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        text.matches("source_hung").count(),
        1,
        "one event per hang: {text}"
    );
    assert!(text.contains("stopping without"), "{text}");
}

/// NVML hangs after the agent has published rounds: `/metrics` keeps serving the last round,
/// but `gpuwatch_up{source="nvml"}` turns 0 while the round waits on it, so an alert on
/// `gpuwatch_up == 0` fires (before, it stayed 1 and only the timestamps told).
#[test]
fn a_hang_after_rounds_were_published_turns_the_sources_up_to_0() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.json");
    let devices = json!([{"uuid": "GPU-00000000-0000-0000-0000-00000000000a"}]);
    std::fs::write(&scenario, json!({ "devices": devices }).to_string()).unwrap();
    let (mut agent, addr) = support::serve_via(&[], &scenario, &["--no-docker", "--no-ebpf"]);
    // `None` until the first round is published (503: no sample yet).
    let nvml_up = || {
        let (status, body) = get(&format!("{addr}/metrics"));
        if status != 200 {
            return None;
        }
        body.lines()
            .find(|l| l.starts_with("gpuwatch_up{source=\"nvml\"}"))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
    };
    let started = Instant::now();
    while nvml_up() != Some(1.0) {
        assert!(started.elapsed() < Duration::from_secs(20), "never up");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Now the driver's series call hangs for an hour.
    std::fs::write(
        &scenario,
        json!({"delays_ms": {"nvmlDeviceGetSamples": 3_600_000}, "devices": devices}).to_string(),
    )
    .unwrap();
    let hung_at = Instant::now();
    while get(&format!("{addr}/-/healthy")).0 == 200 {
        assert!(
            hung_at.elapsed() < Duration::from_secs(30),
            "the hang never noticed"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(nvml_up(), Some(0.0), "gpuwatch_up for nvml while it hangs");
    let (_, took) = sigterm_and_wait(&mut agent.0);
    assert!(took < Duration::from_secs(6), "exit took {took:?}");
}

/// Every thread of `pid`: the named fields of its `status`, each with its whitespace made one
/// space ("" where the field is missing).
fn thread_status(pid: u32, names: &[&str]) -> Vec<Vec<String>> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .map(|s| {
            names
                .iter()
                .map(|name| {
                    s.lines()
                        .find_map(|l| l.strip_prefix(name))
                        .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
                        .unwrap_or_default()
                })
                .collect()
        })
        .collect()
}

/// Every thread of `pid`: (name, CapEff, CapPrm, NoNewPrivs).
fn thread_privileges(pid: u32) -> Vec<(String, u64, u64, bool)> {
    thread_status(pid, &["Name:", "CapEff:", "CapPrm:", "NoNewPrivs:"])
        .into_iter()
        .map(|f| {
            let hex = |v: &str| u64::from_str_radix(v, 16).unwrap();
            (f[0].clone(), hex(&f[1]), hex(&f[2]), f[3] == "1")
        })
        .collect()
}

/// The name of the HTTP runtime's threads, which keep no capability.
const HTTP_THREADS: &str = "gpuwatch-http";

/// The HTTP runtime's threads are there (workers at least) and hold no capability, with
/// no-new-privileges.
fn assert_http_threads_hold_nothing(threads: &[(String, u64, u64, bool)]) {
    let http: Vec<_> = threads.iter().filter(|t| t.0 == HTTP_THREADS).collect();
    assert!(http.len() >= 2, "the HTTP workers: {threads:?}");
    for (name, eff, prm, nnp) in http {
        assert_eq!((*eff, *prm, *nnp), (0, 0, true), "thread {name}");
    }
}

/// Least privilege: started as root with every capability, or with exactly the four it
/// documents, a running `serve` holds only CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE and
/// CAP_DAC_READ_SEARCH in every thread (Docker, watchdog, signals) but the HTTP runtime's,
/// which hold none, all with no-new-privileges, and still serves every source;
/// `--keep-capabilities` keeps them all.
#[test]
fn serve_keeps_only_the_capabilities_it_uses_in_every_thread() {
    require_root();
    const FOUR: u64 = (1 << 39) | (1 << 38) | (1 << 19) | (1 << 2);
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.json");
    std::fs::write(
        &scenario,
        json!({"devices": [{"uuid": "GPU-caps"}]}).to_string(),
    )
    .unwrap();
    let exactly_four = [
        "setpriv",
        "--bounding-set",
        "-all,+bpf,+perfmon,+sys_ptrace,+dac_read_search",
        "--",
    ];
    for prefix in [&[][..], &exactly_four[..]] {
        let (agent, url) = serve_via(prefix, &scenario, &[]);
        let metrics = wait_for_metrics(&url, |m| m.contains("gpuwatch_up{source=\"ebpf\"} 1"));
        for source in ["nvml", "docker", "ebpf"] {
            let up = format!("gpuwatch_up{{source=\"{source}\"}} 1");
            assert!(
                metrics.contains(&up),
                "{prefix:?}: {source} down:\n{metrics}"
            );
        }
        let threads = thread_privileges(agent.0.id());
        assert!(threads.len() >= 4, "{threads:?}");
        assert_http_threads_hold_nothing(&threads);
        for (name, eff, prm, nnp) in threads.iter().filter(|t| t.0 != HTTP_THREADS) {
            assert_eq!(
                (*eff, *prm, *nnp),
                (FOUR, FOUR, true),
                "{prefix:?}: thread {name}"
            );
        }
    }
    let (agent, url) = serve_via(&[], &scenario, &["--keep-capabilities"]);
    wait_for_metrics(&url, |m| m.contains("gpuwatch_up{source=\"ebpf\"} 1"));
    let threads = thread_privileges(agent.0.id());
    assert!(
        threads.iter().all(|t| t.1 & (1 << 21) != 0),
        "SYS_ADMIN kept: {threads:?}"
    );
}

/// `--user nobody`: every thread of a running `serve` holds nobody's uid and gid in all four
/// slots (real, effective, saved, filesystem) and still the four capabilities, with
/// no-new-privileges; rounds keep coming (the published round's time moves, health stays OK)
/// and the eBPF maps are still read. An unknown user is refused before anything starts.
#[test]
fn serve_becomes_the_user_it_is_given_and_keeps_sampling() {
    require_root();
    const FOUR: u64 = (1 << 39) | (1 << 38) | (1 << 19) | (1 << 2);
    const NOBODY: &str = "65534";
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.json");
    std::fs::write(
        &scenario,
        json!({"devices": [{"uuid": "GPU-user"}]}).to_string(),
    )
    .unwrap();
    // Without Docker: nobody may not connect to its socket (the test below).
    let (agent, url) = serve_via(&[], &scenario, &["--user", "nobody", "--no-docker"]);
    wait_for_metrics(&url, |m| m.contains("gpuwatch_up{source=\"ebpf\"} 1"));
    let ids = |pid: u32| thread_status(pid, &["Name:", "Uid:", "Gid:"]);
    // The switch happens once the sources are open, right after the first metrics can show.
    let started = Instant::now();
    let all_nobody = |t: &[Vec<String>]| {
        t.iter()
            .all(|f| f[1] == [NOBODY; 4].join(" ") && f[2] == [NOBODY; 4].join(" "))
    };
    while !all_nobody(&ids(agent.0.id())) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            ids(agent.0.id())
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let threads = thread_privileges(agent.0.id());
    assert!(threads.len() >= 4, "{threads:?}");
    assert_http_threads_hold_nothing(&threads);
    for (name, eff, prm, nnp) in threads.iter().filter(|t| t.0 != HTTP_THREADS) {
        assert_eq!((*eff, *prm, *nnp), (FOUR, FOUR, true), "thread {name}");
    }
    let taken_at = || {
        let (status, body) = get(&format!("{url}/api/v1/gpus"));
        assert_eq!(status, 200, "{body}");
        serde_json::from_str::<Value>(&body).unwrap()["taken_at"].to_string()
    };
    // A round is published once the GPU series covers it: up to the 10-s series interval late.
    let first = taken_at();
    let switched = Instant::now();
    while taken_at() == first {
        assert!(
            switched.elapsed() < Duration::from_secs(25),
            "no round published since the switch: {first}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(get(&format!("{url}/-/healthy")).0, 200);
    let metrics = get(&format!("{url}/metrics")).1;
    assert!(
        metrics.contains("gpuwatch_up{source=\"ebpf\"} 1"),
        "{metrics}"
    );
    drop(agent);
    let out = std::process::Command::new(support::gpuwatch_bin())
        .args(["serve", "--user", "no-such-user-gpuwatch", "--no-ebpf"])
        .env("GPUWATCH_NVML_LIB", fake_nvml_lib())
        .env("FAKE_NVML_SCENARIO", &scenario)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("--user") && err.contains("no-such-user-gpuwatch"),
        "{err}"
    );
}

/// `--user` for a user that may not connect to the Docker socket (root's, mode 0660, as
/// Docker's is root:docker) is refused before anything starts, naming the socket and the fix:
/// after the switch every new connection to the daemon would fail.
#[test]
fn serve_refuses_a_user_that_could_not_reach_docker() {
    use std::os::unix::fs::PermissionsExt;
    require_root();
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = dir.path().join("docker.sock");
    let _daemon = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o660)).unwrap();
    let serve_as_nobody = || {
        std::process::Command::new(support::gpuwatch_bin())
            .args(["serve", "--web.listen-address", "127.0.0.1:0", "--no-ebpf"])
            .args(["--no-nvml", "--user", "nobody", "--duration", "1s"])
            .arg("--docker-socket")
            .arg(&socket)
            .output()
            .unwrap()
    };
    let out = serve_as_nobody();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("--user nobody: that user may not connect to the Docker socket")
            && err.contains(&socket.display().to_string())
            && err.contains("--no-docker"),
        "{err}"
    );
    assert!(
        !err.contains("listening on"),
        "refused before serving: {err}"
    );
    // Where the socket lets every user in, the same command starts.
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = serve_as_nobody();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("may not connect"), "{err}");
    assert!(err.contains("listening on"), "{err}");
}

/// `/metrics` once `ready` accepts it (within 30 s).
fn wait_for_metrics(url: &str, ready: impl Fn(&str) -> bool) -> String {
    let started = Instant::now();
    loop {
        let (status, body) = get(&format!("{url}/metrics"));
        if status == 200 && ready(&body) {
            return body;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{status}: {body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A TCP connection to `host` (`ip:port`) whose receive buffer is `rcvbuf` bytes, set before
/// the connection (when the window is negotiated).
fn connect_with_small_window(host: &str, rcvbuf: i32) -> std::net::TcpStream {
    use std::os::fd::FromRawFd;
    let addr: std::net::SocketAddrV4 = host.parse().unwrap();
    // SAFETY: plain socket calls on a descriptor this function owns until it hands it over.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0);
        let ok = libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&rcvbuf as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        );
        assert_eq!(ok, 0);
        let sin = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: addr.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(*addr.ip()).to_be(),
            },
            sin_zero: [0; 8],
        };
        let r = libc::connect(
            fd,
            (&sin as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
        std::net::TcpStream::from_raw_fd(fd)
    }
}

/// Clients that ask for `/metrics` and stop reading are closed once the server's writes stall
/// for the write-stall timeout (10 s): when they read again they find the rest cut off. Before,
/// each held its whole response for as long as it kept the socket open (40 of them took the
/// agent from 55 to 742 MB; 5 were still open after 145 s).
#[test]
fn clients_that_stop_reading_their_response_are_closed() {
    use std::io::{Read, Write};
    require_root();
    let dir = tempfile::tempdir().unwrap();
    // 300 GPUs make a /metrics of several hundred KB: more than the socket buffers hold.
    let devices: Vec<Value> = (0..300)
        .map(|i| json!({"uuid": format!("GPU-00000000-0000-0000-0000-{i:012}")}))
        .collect();
    let scenario = dir.path().join("scenario.json");
    std::fs::write(&scenario, json!({ "devices": devices }).to_string()).unwrap();
    let (_agent, addr) = serve(&scenario, &["--no-docker", "--no-ebpf"]);
    let full = wait_for_metrics(&addr, |m| {
        m.contains("GPU-00000000-0000-0000-0000-000000000299")
    });
    let host = addr.trim_start_matches("http://").to_owned();
    let mut readers: Vec<std::net::TcpStream> = (0..5)
        .map(|_| {
            let mut s = connect_with_small_window(&host, 2048);
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_secs(14));
    for s in &mut readers {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut got = 0usize;
        let mut buf = [0u8; 65536];
        let closed = loop {
            match s.read(&mut buf) {
                Ok(0) => break true,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
                Err(_) => break false, // still open, waiting for more
            }
        };
        assert!(closed, "still open after 14 s unread ({got} bytes read)");
        assert!(
            got < full.len(),
            "the whole response came ({got} of {} bytes): nothing was cut",
            full.len()
        );
    }
    // The agent goes on serving.
    let (status, _) = get(&format!("{addr}/metrics"));
    assert_eq!(status, 200);
}

/// The bytes of responses that slow readers hold are bounded: past the agent's 32-MiB budget, or
/// one source's 8 MiB of it, a request is answered `503` with `Retry-After`, and health still
/// answers. Before,
/// each slow reader held its whole response until the write guard closed it (40 readers of a
/// 33.5-MB answer took the agent from 406 MB to 1.6 GB).
#[test]
fn slow_readers_together_hold_at_most_the_responses_budget() {
    use std::io::{Read, Write};
    require_root();
    let dir = tempfile::tempdir().unwrap();
    // 3,000 GPUs make a snapshot of 2.2 MB: 100 readers of it would hold 220 MB.
    let devices: Vec<Value> = (0..3000)
        .map(|i| json!({"uuid": format!("GPU-00000000-0000-0000-0000-{i:012}")}))
        .collect();
    let scenario = dir.path().join("scenario.json");
    std::fs::write(&scenario, json!({ "devices": devices }).to_string()).unwrap();
    let (agent, addr) = serve(&scenario, &["--no-docker", "--no-ebpf"]);
    let full = loop {
        let (status, body) = get(&format!("{addr}/api/v1/snapshot"));
        if status == 200 && body.contains("GPU-00000000-0000-0000-0000-000000002999") {
            break body;
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    assert!(full.len() > 2 << 20, "the snapshot is {} bytes", full.len());
    let pid = agent.0.id();
    let (before, _) = agent_usage(pid);
    let host = addr.trim_start_matches("http://").to_owned();
    let mut readers: Vec<std::net::TcpStream> = (0..100)
        .map(|_| {
            let mut s = connect_with_small_window(&host, 4096);
            s.write_all(b"GET /api/v1/snapshot HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
            s
        })
        .collect();
    // Within the write guard's 10 s, before the first of them is closed.
    let mut peak = before;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(9) {
        let (status, _) = get(&format!("{addr}/-/healthy"));
        assert_eq!(status, 200, "health while slow readers hold the budget");
        peak = peak.max(agent_usage(pid).0);
        std::thread::sleep(Duration::from_millis(250));
    }
    let mut answers = std::collections::BTreeMap::<String, usize>::new();
    for s in &mut readers {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut head = [0u8; 512];
        let n = s.read(&mut head).unwrap_or(0);
        let text = String::from_utf8_lossy(&head[..n]).into_owned();
        let status = text.get(..12).unwrap_or("nothing").to_owned();
        if status == "HTTP/1.1 503" {
            assert!(text.contains("retry-after: 1"), "{text}");
        }
        *answers.entry(status).or_default() += 1;
    }
    eprintln!("RSS {before} → {peak} KiB; answers {answers:?}");
    // The budget, and what the renders and the connections' own buffers hold beside it.
    assert!(
        peak - before < 96 << 10,
        "RSS {before} → {peak} KiB with 100 slow readers"
    );
    assert!(
        answers.get("HTTP/1.1 503").is_some_and(|&n| n >= 10),
        "{answers:?}"
    );
    drop(readers);
    // Once the readers are gone, the budget is free again.
    let started = Instant::now();
    while get(&format!("{addr}/api/v1/snapshot")).0 != 200 {
        assert!(started.elapsed() < Duration::from_secs(20), "still busy");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// A container created through Docker's API (the command line cannot pass an argument of a
/// megabyte) with `labels`, started; removed on drop.
fn container_with_labels(name: &str, labels: &Value) -> Container {
    use std::io::{Read, Write};
    ensure_image();
    let _ = Command::new("docker").args(["rm", "-f", name]).output();
    let body =
        json!({"Image": "gpuwatch-test/busybox:1", "Cmd": ["sleep", "3600"], "Labels": labels})
            .to_string();
    let mut s = std::os::unix::net::UnixStream::connect("/var/run/docker.sock").unwrap();
    write!(
        s,
        "POST /containers/create?name={name} HTTP/1.1\r\nHost: docker\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 201"), "{reply}");
    let id = docker(&["start", name]);
    let id = docker(&["inspect", "-f", "{{.Id}}", &id]);
    let pid = docker(&["inspect", "-f", "{{.State.Pid}}", &id])
        .parse()
        .unwrap();
    Container {
        id,
        name: name.to_owned(),
        pid,
    }
}

/// A tenant's label of a megabyte is cut wherever it is shown or stored — the table, the JSON,
/// a recording, `/metrics`, alerts — and served to 65,536 characters for its container alone.
#[test]
fn a_megabyte_label_is_cut_everywhere_and_whole_for_its_container() {
    require_root();
    let service = "s".repeat(1 << 20);
    let c = container_with_labels(
        &unique("huge-label"),
        &json!({"com.docker.compose.service": service, "com.docker.compose.project": "p".repeat(1 << 20)}),
    );
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.json");
    std::fs::write(
        &scenario,
        json!({"devices": [{"uuid": "GPU-huge", "processes": [
            {"pid": c.pid, "used_memory_bytes": 1u64 << 30, "sm_util": 5}]}]})
        .to_string(),
    )
    .unwrap();
    let run = |args: &[&str]| {
        let out = gpuwatch_on(&scenario).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let longest = |t: &str| t.lines().map(|l| l.chars().count()).max().unwrap_or(0);
    let table = run(&["snapshot", "--window", "1s", "--no-ebpf"]);
    assert!(longest(&table) < 1000, "a table row of {}", longest(&table));
    let json = run(&["snapshot", "--json", "--window", "1s", "--no-ebpf"]);
    assert!(
        json.len() < 64 << 10,
        "the snapshot's JSON is {} bytes",
        json.len()
    );
    let snap: Value = serde_json::from_str(&json).unwrap();
    let w = workload(&snap, &format!("docker:{}", c.id));
    let cut = w["container"]["compose_service"].as_str().unwrap();
    assert_eq!(cut.chars().count(), 1024);
    assert!(cut.ends_with('…'));
    let csv = dir.path().join("rec.csv");
    run(&[
        "record",
        "--interval",
        "1s",
        "--duration",
        "2s",
        "--no-ebpf",
        "-o",
        csv.to_str().unwrap(),
    ]);
    let text = std::fs::read_to_string(&csv).unwrap();
    assert!(longest(&text) < 4096, "a CSV row of {}", longest(&text));

    let (_agent, url) = serve(&scenario, &["--no-ebpf"]);
    let metrics = loop {
        let (_, m) = get(&format!("{url}/metrics"));
        if m.contains("GPU-huge") && m.contains("gpuwatch_container_gpu_busy") {
            break m;
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    assert!(
        metrics.len() < 256 << 10,
        "/metrics is {} bytes",
        metrics.len()
    );
    let (status, one) = get(&format!("{url}/api/v1/containers/{}", &c.id[..12]));
    assert_eq!(status, 200, "{one}");
    let one: Value = serde_json::from_str(&one).unwrap();
    let whole = one["whole"]["compose_service"].as_str().unwrap();
    assert_eq!(whole.chars().count(), 64 << 10);
    assert!(whole.ends_with('…'));
    assert_eq!(one["container"]["id"], format!("docker:{}", c.id));
}

/// The page at `/` in a real browser (Debian's headless Chromium): it loads with no network
/// beyond the agent, and shows a container's verdict, evidence and advice; its screenshot has
/// the verdict's badge drawn.
#[test]
fn a_browser_shows_a_containers_verdict_evidence_and_advice() {
    require_root();
    let browser = Path::new("/usr/bin/chromium-headless-shell");
    assert!(
        browser.exists(),
        "{} missing: run `cargo xtask setup --test`",
        browser.display()
    );
    let c = Container::start(&unique("serve-page"), &[], "sleep 3600");
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.json");
    std::fs::write(
        &scenario,
        serde_json::to_vec(
            &json!({"devices": [{"uuid": "GPU-page", "utilization_gpu": 0,
            "processes": [{"pid": c.pid, "used_memory_bytes": GIB, "sm_util": 0}]}]}),
        )
        .unwrap(),
    )
    .unwrap();
    let (_agent, addr) = serve(&scenario, &[]);
    // The container's verdict and advice, as the API gives them, once it has one.
    let started = Instant::now();
    let verdict = loop {
        let (_, body) = get(&format!("{addr}/api/v1/containers"));
        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        let mine = v["containers"].as_array().into_iter().flatten().find(|w| {
            w["name"] == c.name.as_str()
                && w["verdict"]["advice"]
                    .as_str()
                    .is_some_and(|a| !a.is_empty())
                && w["verdict"]["evidence"][0].is_string()
        });
        if let Some(w) = mine {
            break w["verdict"].clone();
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no verdict: {body}"
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    let chrome = |extra: &[&str]| {
        // A browser that hangs fails the test rather than holding it.
        let out = Command::new("timeout")
            .arg("60")
            .arg(browser)
            .args(["--no-sandbox", "--disable-gpu", "--hide-scrollbars"])
            .arg("--window-size=1300,1400")
            .args(extra)
            .arg(format!("{addr}/"))
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let dom = chrome(&["--dump-dom"]);
    let label = verdict["kind"].as_str().unwrap();
    let text = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    };
    // The container's own section (the advice also appears in an alert's action).
    let start = dom
        .find(&format!("<h3>{}</h3>", c.name))
        .unwrap_or_else(|| panic!("no section for {}:\n{dom}", c.name));
    let section = &dom[start..start + dom[start..].find("</section>").unwrap()];
    for want in [
        "class=\"verdict ".to_owned(),
        label.to_owned(),
        text(verdict["advice"].as_str().unwrap()),
        text(verdict["evidence"][0].as_str().unwrap()),
    ] {
        assert!(
            section.contains(&want),
            "{want:?} not in the container's section:\n{section}"
        );
    }

    let shot = dir.path().join("page.png");
    chrome(&[&format!("--screenshot={}", shot.display())]);
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&shot).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = info.color_type.samples();
    // The badge's colour for this verdict (web_page.rs's .ok / .problem / .neutral).
    let badge: [u8; 3] = match label {
        "GPU-bound" => [0xd9, 0xf2, 0xd9],
        "unknown" | "idle" => [0xee, 0xee, 0xee],
        _ => [0xff, 0xe2, 0xb3],
    };
    let badge_pixels = buf[..info.buffer_size()]
        .chunks(channels)
        .filter(|p| p[..3] == badge)
        .count();
    assert!(
        badge_pixels > 100,
        "{badge_pixels} pixels of the badge's colour {badge:?} in the screenshot"
    );
}
