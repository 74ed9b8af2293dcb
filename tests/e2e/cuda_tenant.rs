//! The CUDA probe path against a hostile tenant, on the real kernel with real containers and a
//! running `serve`: a container decides what its "driver library" is, when it is replaced, how
//! many it maps and how long its memory map is. The agent must never place a probe in a file
//! outside the GPU processes' own mappings, never block on what a tenant names, and keep its
//! rounds, health, descriptors and memory within bounds while a tenant tries.
//!
//! The host's file a probe must never reach is a copy of the fake driver library
//! (`tests/fake-cuda`) outside any container, called by a host process that the fake NVML lists
//! as a GPU process: a probe planted in it would count that process's launches.

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use support::*;

fn get(url: &str) -> (u16, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(2)))
        .build()
        .into();
    match agent.get(url).call() {
        Ok(mut r) => (
            r.status().as_u16(),
            r.body_mut().read_to_string().unwrap_or_default(),
        ),
        Err(e) => (0, e.to_string()),
    }
}

/// The published snapshot, once one is.
fn snapshot_at(addr: &str) -> Option<Value> {
    let (status, body) = get(&format!("{addr}/api/v1/snapshot"));
    if status != 200 {
        eprintln!(
            "/api/v1/snapshot: {status} {}",
            body.chars().take(300).collect::<String>()
        );
    }
    (status == 200)
        .then(|| serde_json::from_str(&body).ok())
        .flatten()
}

/// A tenant: a container whose job maps its own copy of the driver library at
/// `/t/libcuda.so.1`, in a folder of the host's bind-mounted at `/t` (so the test can do to
/// its tree what the tenant would do from inside).
struct Tenant {
    container: Container,
    dir: tempfile::TempDir,
}

impl Tenant {
    fn start(name: &str, job: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(
            fake_cuda_dir().join("libcuda.so.1"),
            dir.path().join("libcuda.so.1"),
        )
        .unwrap();
        let mount = format!("{}:/t", dir.path().display());
        let container = cuda_container(
            &unique(name),
            &[("CUDA_JOB_LIB", "/t/libcuda.so.1")],
            &["-v", &mount],
            job,
        );
        Self { container, dir }
    }

    fn library(&self) -> PathBuf {
        self.dir.path().join("libcuda.so.1")
    }

    /// Renames `what` over its library, as `mv -f` in the container would: the job's mapping
    /// stays of the old inode.
    fn replace_library(&self, what: &Path) {
        std::fs::rename(what, self.library()).unwrap();
    }
}

/// A tenant chrooted into `/t` of its container (a host folder): it maps `/x/libcuda.so.1`,
/// which the kernel names `/t/x/libcuda.so.1` from the container's root, and puts what `plant`
/// makes at `/t/t/x/libcuda.so.1`, where that name leads through its process's root.
struct Chrooted {
    container: Container,
    _dir: tempfile::TempDir,
}

impl Chrooted {
    fn start(name: &str, plant: impl FnOnce(&Path)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("x")).unwrap();
        std::fs::create_dir_all(root.join("t/x")).unwrap();
        std::fs::copy(
            fake_cuda_dir().join("libcuda.so.1"),
            root.join("x/libcuda.so.1"),
        )
        .unwrap();
        std::fs::copy(
            fake_cuda_dir().join("tenant_maps"),
            root.join("tenant_maps"),
        )
        .unwrap();
        plant(&root.join("t/x/libcuda.so.1"));
        let container = Container::start_with(
            &unique(name),
            &[],
            &["-v", &format!("{}:/t", root.display())],
            "exec chroot /t /tenant_maps repeat /x/libcuda.so.1 1",
        );
        Self {
            container,
            _dir: dir,
        }
    }
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path for the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo");
}

fn inode(path: &Path) -> u64 {
    std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(path).unwrap())
}

/// A child process killed on drop (a failed assertion leaves no job spinning behind it).
struct Killed(std::process::Child);

impl Killed {
    fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn gpu_process(pid: u32, sm: &Path) -> Value {
    json!({"pid": pid, "used_memory_bytes": 1u64 << 30, "sm_util_file": sm})
}

/// The launches counted for GPU process `pid` in a traced window, `None` when not traced.
fn cuda_launches(snap: &Value, pid: u32) -> Option<u64> {
    let w = snap["workloads"].as_array()?.iter().find(|w| {
        w["gpu"]["per_gpu"].as_array().is_some_and(|g| {
            g.iter().any(|g| {
                g["pids"]
                    .as_array()
                    .is_some_and(|p| p.iter().any(|p| p == pid))
            })
        })
    })?;
    if w["cuda"]["traced"] != true {
        return None;
    }
    let procs = w["cuda"]["processes"].as_array()?;
    Some(
        procs
            .iter()
            .filter(|p| p["pid"] == pid)
            .map(|p| p["calls"]["launches"].as_u64().unwrap_or(0))
            .sum(),
    )
}

#[test]
fn a_swapped_in_symlink_fifo_or_host_path_is_never_probed_nor_waited_on() {
    require_root();
    let work = tempfile::tempdir().unwrap();
    // The host's file: a copy of the library outside any container, and a host process
    // launching through it, listed as a GPU process.
    let host_lib = work.path().join("libhost.so");
    std::fs::copy(fake_cuda_dir().join("libcuda.so.1"), &host_lib).unwrap();
    // (2,000 launches a second, asleep between.)
    let host = Killed(
        std::process::Command::new(fake_cuda_dir().join("cuda_job"))
            .env("CUDA_JOB_LIB", &host_lib)
            .args(["--seconds", "600", "launch:100", "hostfn:50000", "sync"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let host_fifo = work.path().join("host.fifo");
    mkfifo(&host_fifo);

    // The symlink tenant: scanned first, then swapped for a link to the host's file, then its
    // GPU idles under a busy loop so the probes are wanted.
    let swap = Tenant::start("tenant-swap", "--seconds 600 launch:100:50");
    // The FIFO tenant and the host-path tenant: chrooted (Docker grants CAP_SYS_CHROOT), so the
    // path the kernel gives for their library (from the container's root) names another file
    // through their process's root: a FIFO, and a link to a FIFO of the host's.
    let fifo = Chrooted::start("tenant-fifo", mkfifo);
    let path = Chrooted::start("tenant-path", |at| {
        std::os::unix::fs::symlink(&host_fifo, at).unwrap()
    });

    let sm_busy = work.path().join("sm-busy");
    let sm_swap = work.path().join("sm-swap");
    std::fs::write(&sm_busy, "100\n").unwrap();
    std::fs::write(&sm_swap, "100\n").unwrap();
    let scenario = work.path().join("scenario.json");
    // Each process on a GPU of its own (the busy share of a shared one is all of theirs); four
    // GPUs from the start (the agent counts them once), the last two used later.
    let write_scenario = |mut procs: Vec<Value>| {
        let tmp = work.path().join("scenario.tmp");
        procs.resize(4, Value::Null);
        let devices: Vec<Value> = procs
            .into_iter()
            .enumerate()
            .map(|(i, p)| {
                let held: Vec<Value> = p.is_object().then_some(p).into_iter().collect();
                json!({"uuid": format!("GPU-tenant-{i}"), "processes": held})
            })
            .collect();
        let s = json!({"devices": devices});
        std::fs::write(&tmp, s.to_string()).unwrap();
        std::fs::rename(&tmp, &scenario).unwrap();
    };
    write_scenario(vec![
        gpu_process(host.id(), &sm_busy),
        gpu_process(swap.container.pid, &sm_swap),
    ]);
    let config = work.path().join("gpuwatch.yaml");
    std::fs::write(
        &config,
        "sources:\n  nvml_series_interval: 1s\n  cuda_tracing: {mode: adaptive, linger: 60s}\n",
    )
    .unwrap();
    let (_serve, addr) = serve_configured(&config, &scenario, &["--interval", "1s"]);

    // Until the swap tenant's library has been read.
    let deadline = Instant::now() + Duration::from_secs(30);
    let own_inode = inode(&swap.library());
    loop {
        let snap = snapshot_at(&addr);
        let seen = snap.as_ref().is_some_and(|s| {
            s["cuda_tracing"]["libraries"]
                .as_array()
                .is_some_and(|l| l.iter().any(|l| l["inode"] == own_inode))
        });
        if seen {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the tenant's library (inode {own_inode}) was never read: {:#}",
            snap.map_or(Value::Null, |s| s["cuda_tracing"].clone())
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // The attacks: a symbolic link to the host's file renamed over the scanned library; a FIFO
    // and a link to a host FIFO where the other two tenants' libraries were.
    let link = swap.dir.path().join("link");
    std::os::unix::fs::symlink(&host_lib, &link).unwrap();
    swap.replace_library(&link);
    write_scenario(vec![
        gpu_process(host.id(), &sm_busy),
        gpu_process(swap.container.pid, &sm_swap),
        gpu_process(fifo.container.pid, &sm_busy),
        gpu_process(path.container.pid, &sm_busy),
    ]);
    // Its GPU idles while its loop is busy: the probes are wanted now.
    std::fs::write(&sm_swap, "10\n").unwrap();

    // The agent stays healthy throughout, and the swap tenant's own file is probed (through
    // the agent's descriptor of it), never the host's.
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut traced = 0;
    let mut last_taken = 0;
    let mut timeline = Vec::new();
    while traced < 3 {
        assert!(
            Instant::now() < deadline,
            "the tenant's own library was never traced over 3 windows: {timeline:#?}"
        );
        let started = Instant::now();
        let (status, _) = get(&format!("{addr}/-/healthy"));
        assert_eq!(status, 200, "/-/healthy while a tenant names a FIFO");
        assert!(started.elapsed() < Duration::from_secs(2));
        std::thread::sleep(Duration::from_millis(500));
        let Some(s) = snapshot_at(&addr) else {
            continue;
        };
        let taken = s["taken_at_unix_ms"].as_u64().unwrap();
        if taken == last_taken {
            continue;
        }
        last_taken = taken;
        let libs = s["cuda_tracing"]["libraries"].as_array().unwrap().clone();
        assert!(
            !libs.iter().any(|l| l["inode"] == inode(&host_lib)),
            "the host's file is listed: {libs:#?}"
        );
        timeline.push(format!(
            "attached {} libraries {} host {:?} tenant {:?} reason {}",
            s["cuda_tracing"]["attached"],
            libs.iter()
                .map(|l| format!("{}:{}:{}", l["path"], l["inode"], l["attached"]))
                .collect::<Vec<_>>()
                .join(","),
            cuda_launches(&s, host.id()),
            cuda_launches(&s, swap.container.pid),
            s["cuda_tracing"]["reason"]
        ));
        if let Some(h) = cuda_launches(&s, host.id()) {
            assert_eq!(
                h, 0,
                "a probe in the host's file counted the host process: {libs:#?}"
            );
        }
        if cuda_launches(&s, swap.container.pid).is_some_and(|n| n > 0) {
            traced += 1;
        }
    }
    // The FIFO and the link to a host FIFO: refused, each with an event.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = snapshot_at(&addr).unwrap();
        let refused = s["internal_events"]["cuda_probe_attach_failed"]
            .as_u64()
            .unwrap();
        if refused >= 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{refused} refused of the tenants {} and {}: {:#}; GPU processes {:?}",
            fifo.container.pid,
            path.container.pid,
            s["cuda_tracing"],
            s["gpus"]
                .as_array()
                .unwrap()
                .iter()
                .map(|g| g["processes"].to_string())
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(get(&format!("{addr}/-/healthy")).0, 200);
    drop(host);
}

/// Descriptors the probes may hold: 64 libraries at most, a file and three links each, and
/// the agent's own (under 64).
const FILES_MAX: usize = 64 * 4 + 64;
/// Twice the debug build's peak here with a tenant mapping 1,000 driver copies.
const RSS_MAX_KIB: u64 = 128 << 10;

/// How far the published rounds got: the newest round's time less the oldest's (rounds are
/// stamped as they start, one an interval).
fn span_ms(rounds: &[u64]) -> u64 {
    match (rounds.first(), rounds.last()) {
        (Some(first), Some(last)) => last - first,
        _ => 0,
    }
}

#[test]
fn a_thousand_driver_copies_and_a_huge_memory_map_stay_bounded() {
    require_root();
    let work = tempfile::tempdir().unwrap();
    let copies = tempfile::tempdir().unwrap();
    for i in 0..1000 {
        std::fs::copy(
            fake_cuda_dir().join("libcuda.so.1"),
            copies.path().join(format!("libcuda.so.1.{i}")),
        )
        .unwrap();
    }
    // A path of ~4,000 bytes, mapped 8,000 times: a `maps` of ~33 MB.
    let mut deep = copies.path().to_path_buf();
    while deep.as_os_str().len() < 3900 {
        deep.push("d".repeat(200));
    }
    std::fs::create_dir_all(&deep).unwrap();
    let long = deep.join("libcuda.so.1");
    std::fs::copy(fake_cuda_dir().join("libcuda.so.1"), &long).unwrap();
    let mount = format!("{}:/c:ro", copies.path().display());
    let in_container =
        |p: &Path| format!("/c/{}", p.strip_prefix(copies.path()).unwrap().display());
    let tools = fake_cuda_dir().display().to_string();
    let many = Container::start_with(
        &unique("tenant-many"),
        &[],
        &["-v", &mount, "-v", &format!("{tools}:/opt/cuda:ro")],
        "exec /opt/cuda/tenant_maps copies /c 1000",
    );
    let huge = Container::start_with(
        &unique("tenant-huge"),
        &[],
        &["-v", &mount, "-v", &format!("{tools}:/opt/cuda:ro")],
        &format!(
            "exec /opt/cuda/tenant_maps repeat {} 8000",
            in_container(&long)
        ),
    );
    std::thread::sleep(Duration::from_secs(2));
    let scenario = work.path().join("scenario.json");
    std::fs::write(
        &scenario,
        json!({"devices": [
            {"uuid": "GPU-many", "processes": [
                {"pid": many.pid, "used_memory_bytes": 1u64 << 30, "sm_util": 10}]},
            {"uuid": "GPU-huge", "processes": [
                {"pid": huge.pid, "used_memory_bytes": 1u64 << 30, "sm_util": 10}]},
        ]})
        .to_string(),
    )
    .unwrap();
    let config = work.path().join("gpuwatch.yaml");
    std::fs::write(
        &config,
        "sources:\n  nvml_series_interval: 1s\n  cuda_tracing: {mode: always}\n",
    )
    .unwrap();
    let (serve, addr) = serve_configured(&config, &scenario, &["--interval", "1s"]);
    let agent = serve.0.id();

    // Rounds keep coming (one a second), health answers at once, and the probes' descriptors
    // and the agent's memory stay bounded, while the tenants are read and probed.
    let mut rounds = Vec::new();
    let started = Instant::now();
    let mut peak = (0, 0);
    while started.elapsed() < Duration::from_secs(20) {
        let t = Instant::now();
        let (status, _) = get(&format!("{addr}/-/healthy"));
        assert_eq!(status, 200);
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "/-/healthy took {:?}",
            t.elapsed()
        );
        if let Some(s) = snapshot_at(&addr) {
            let taken = s["taken_at_unix_ms"].as_u64().unwrap();
            if rounds.last() != Some(&taken) {
                rounds.push(taken);
            }
        }
        let (rss, files) = agent_usage(agent);
        peak = (peak.0.max(rss), peak.1.max(files));
        assert!(files <= FILES_MAX, "{files} open files");
        assert!(rss <= RSS_MAX_KIB, "{rss} KiB resident");
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!(
        "peak {} KiB, {} files; rounds at {rounds:?}",
        peak.0, peak.1
    );
    // Snapshots are published as the GPU series covers them, so several rounds at a time: the
    // newest round's time says how far the rounds got, not the count of distinct ones seen.
    assert!(
        span_ms(&rounds) >= 14_000,
        "20 s of rounds reached only: {rounds:?}"
    );
    let s = snapshot_at(&addr).unwrap();
    let libs = s["cuda_tracing"]["libraries"].as_array().unwrap();
    assert!(
        (8..=9).contains(&libs.len()),
        "8 of the 1,000 copies, and the long path's file: {} libraries",
        libs.len()
    );
    assert!(
        s["internal_events"]["cuda_probe_limit"].as_u64().unwrap() >= 2,
        "the copies past 8 and the map past 16 MiB: {:#}",
        s["internal_events"]
    );

    // The tenant exits: its libraries are detached off the round, and rounds go on meanwhile.
    docker(&["kill", &many.name]);
    let before = rounds.len();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(8) {
        if let Some(s) = snapshot_at(&addr) {
            let taken = s["taken_at_unix_ms"].as_u64().unwrap();
            if rounds.last() != Some(&taken) {
                rounds.push(taken);
            }
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(
        span_ms(&rounds[before..]) >= 4_000,
        "8 s of rounds while the tenant's libraries were detached reached only: {:?}",
        &rounds[before..]
    );
    let mut serve = serve;
    let (status, took) = sigterm_and_wait(&mut serve.0);
    assert!(status.success(), "{status}");
    assert!(took < Duration::from_secs(10), "SIGTERM took {took:?}");
    drop(huge);
}
