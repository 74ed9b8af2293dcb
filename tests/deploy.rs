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
        unit.replace("/usr/bin/gpuwatch", env!("CARGO_BIN_EXE_gpuwatch")),
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
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpuwatch"))
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
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGHUP) }, 0);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the agent ended on SIGHUP"
    );
    let status = child.wait().unwrap();
    let elapsed = started.elapsed();
    let stderr: Vec<String> = BufReader::new(child.stderr.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .collect();
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
