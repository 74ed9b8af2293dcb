//! Helpers for the end-to-end tests: a real Docker engine, an image built offline, real
//! processes, the fake NVML library and the real `gpuwatch` binary.
//!
//! These tests need root and a running dockerd (`cargo xtask test` sets both up). A missing
//! prerequisite is a failure with a message, never a silent skip.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Once;

pub const IMAGE: &str = "gpuwatch-test/busybox:1";
pub const GIB: u64 = 1 << 30;

/// The `gpuwatch` binary of this build: in the folder above the test binaries'
/// (`target/<profile>/deps/<test>` → `target/<profile>/gpuwatch`), built first (with the fake
/// NVML) so that a product change tested with `cargo test -p gpuwatch-tests --test e2e_…`
/// runs the changed agent, never the one built last. (Cargo releases the build directory
/// while the tests run; after `cargo xtask test`'s own build this is a no-op.)
pub fn gpuwatch_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>");
    static BUILT: Once = Once::new();
    BUILT.call_once(|| build_agent(dir));
    let bin = dir.join("gpuwatch");
    assert!(
        bin.exists(),
        "{} missing: build it with `cargo build -p gpuwatch` (`cargo xtask test` does)",
        bin.display()
    );
    bin
}

/// `cargo build -p fake-nvml -p gpuwatch` in the profile whose folder is `dir`, as `cargo xtask
/// test` builds them.
fn build_agent(dir: &Path) {
    let profile = match dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev",
        Some(other) => other,
        None => "dev",
    };
    let out = Command::new(env!("CARGO"))
        .args([
            "build",
            "--profile",
            profile,
            "-p",
            "fake-nvml",
            "-p",
            "gpuwatch",
        ])
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .output()
        .expect("run cargo build");
    assert!(
        out.status.success(),
        "building the agent the tests run failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn require_root() {
    // SAFETY: no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "the end-to-end tests need root (eBPF, cgroups, Docker): run `sudo cargo xtask test`"
    );
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub fn docker(args: &[&str]) -> String {
    let out = run(Command::new("docker").args(args));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Builds the test image offline: a busybox-static rootfs imported with `docker import`
/// (there is no registry to pull from).
pub fn ensure_image() {
    static BUILD: Once = Once::new();
    BUILD.call_once(|| {
        let present = Command::new("docker")
            .args(["image", "inspect", IMAGE])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if present {
            return;
        }
        let busybox = Path::new("/bin/busybox");
        assert!(
            busybox.exists(),
            "/bin/busybox missing: `cargo xtask setup` installs busybox-static"
        );
        let root = tempfile::tempdir().expect("tempdir");
        let bin = root.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        for d in ["tmp", "etc", "proc", "sys", "dev"] {
            std::fs::create_dir_all(root.path().join(d)).unwrap();
        }
        std::fs::copy(busybox, bin.join("busybox")).unwrap();
        let list = run(Command::new(busybox).arg("--list"));
        for applet in String::from_utf8_lossy(&list.stdout).lines() {
            let _ = std::os::unix::fs::symlink("busybox", bin.join(applet));
        }
        let tar = root.path().join("rootfs.tar");
        run(Command::new("tar")
            .arg("-C")
            .arg(root.path())
            .arg("-cf")
            .arg(&tar)
            .args(["bin", "tmp", "etc", "proc", "sys", "dev"]));
        docker(&[
            "import",
            "--change",
            "ENV PATH=/bin",
            tar.to_str().unwrap(),
            IMAGE,
        ]);
    });
}

/// A running container, removed on drop.
pub struct Container {
    pub id: String,
    pub name: String,
    /// Host PID of the container's main process.
    pub pid: u32,
}

impl Container {
    pub fn start(name: &str, labels: &[(&str, &str)], script: &str) -> Self {
        Self::start_with(name, labels, &[], script)
    }

    /// Like `start`, with extra `docker run` arguments (devices, limits, mounts).
    pub fn start_with(
        name: &str,
        labels: &[(&str, &str)],
        docker_args: &[&str],
        script: &str,
    ) -> Self {
        ensure_image();
        let _ = Command::new("docker").args(["rm", "-f", name]).output();
        let mut args: Vec<String> = vec!["run".into(), "-d".into(), "--name".into(), name.into()];
        for (k, v) in labels {
            args.push("--label".into());
            args.push(format!("{k}={v}"));
        }
        args.extend(docker_args.iter().map(|a| a.to_string()));
        args.extend([IMAGE.to_owned(), "sh".into(), "-c".into(), script.into()]);
        let id = docker(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let pid = docker(&["inspect", "-f", "{{.State.Pid}}", &id])
            .parse()
            .expect("a PID");
        Self {
            id,
            name: name.to_owned(),
            pid,
        }
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rm", "-f", &self.id]).output();
    }
}

/// A name unique to this test run (containers left by an aborted run do not collide).
pub fn unique(name: &str) -> String {
    format!("gpuwatch-e2e-{name}-{}", std::process::id())
}

/// A process of this host outside any container: moved into the root cgroup of every hierarchy.
pub struct HostProcess(pub Child);

impl HostProcess {
    pub fn spawn() -> Self {
        let child = Command::new("sleep")
            .arg("600")
            .spawn()
            .expect("spawn sleep");
        let pid = child.id().to_string();
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        for line in mountinfo.lines() {
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            if !(right.starts_with("cgroup ") || right.starts_with("cgroup2 ")) {
                continue;
            }
            let mount = left.split(' ').nth(4).unwrap();
            let procs = Path::new(mount).join("cgroup.procs");
            std::fs::write(&procs, &pid)
                .unwrap_or_else(|e| panic!("moving {pid} to {}: {e}", procs.display()));
        }
        Self(child)
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The PID of a process that has already exited.
pub fn dead_pid() -> u32 {
    let mut c = Command::new("true").spawn().unwrap();
    let pid = c.id();
    c.wait().unwrap();
    pid
}

/// A `gpuwatch` command on the fake NVML reading `scenario`, without colour.
pub fn gpuwatch_on(scenario: &Path) -> Command {
    let mut cmd = Command::new(gpuwatch_bin());
    cmd.env("GPUWATCH_NVML_LIB", fake_nvml_lib())
        .env("FAKE_NVML_SCENARIO", scenario)
        .env("NO_COLOR", "1");
    cmd
}

pub fn fake_nvml_lib() -> PathBuf {
    let dir = gpuwatch_bin().parent().unwrap().to_owned();
    let lib = dir.join("libnvidia_ml_fake.so");
    assert!(
        lib.exists(),
        "{} missing: build it with `cargo build -p fake-nvml` (`cargo xtask test` does)",
        lib.display()
    );
    lib
}

pub struct Run {
    pub status: std::process::ExitStatus,
    pub json: Value,
    pub stderr: String,
}

/// Runs `gpuwatch snapshot --json` with the fake NVML reading `scenario`.
pub fn snapshot(scenario: &Value, extra: &[&str]) -> Run {
    snapshot_with(scenario, extra, |_| {})
}

pub fn snapshot_with(scenario: &Value, extra: &[&str], tweak: impl FnOnce(&mut Command)) -> Run {
    run_snapshot(scenario, extra, tweak, None)
}

/// Like [`snapshot`], calling `at_baseline` as soon as gpuwatch logs its baseline round (the
/// start of the window): for a test that changes something inside the window, whatever the time
/// gpuwatch took to start.
pub fn snapshot_around_baseline(
    scenario: &Value,
    extra: &[&str],
    at_baseline: impl FnOnce(),
) -> Run {
    run_snapshot(scenario, extra, |_| {}, Some(Box::new(at_baseline)))
}

/// What `gpuwatch snapshot` logs (at info) once its baseline round is taken.
const BASELINE_LOG: &str = "baseline round taken";

fn run_snapshot(
    scenario: &Value,
    extra: &[&str],
    tweak: impl FnOnce(&mut Command),
    mut at_baseline: Option<Box<dyn FnOnce() + '_>>,
) -> Run {
    use std::io::{BufRead, Read};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("scenario.json");
    std::fs::write(&path, serde_json::to_vec_pretty(scenario).unwrap()).unwrap();
    let mut cmd = Command::new(gpuwatch_bin());
    // Through the environment, so a test's own --nvml-lib wins.
    cmd.args(["snapshot", "--json", "--window", "1s", "--log", "info"])
        .args(extra)
        .env("GPUWATCH_NVML_LIB", fake_nvml_lib())
        .env("FAKE_NVML_SCENARIO", &path)
        .env("NO_COLOR", "1");
    tweak(&mut cmd);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("run gpuwatch");
    // stdout on its own thread: a large snapshot must not block gpuwatch while stderr is read
    let mut out = child.stdout.take().unwrap();
    let stdout = std::thread::spawn(move || {
        let mut v = Vec::new();
        out.read_to_end(&mut v).map(|_| v)
    });
    let mut stderr = String::new();
    for line in std::io::BufReader::new(child.stderr.take().unwrap()).split(b'\n') {
        let line = String::from_utf8_lossy(&line.unwrap()).into_owned();
        if line.contains(BASELINE_LOG) {
            if let Some(f) = at_baseline.take() {
                f();
            }
        }
        stderr.push_str(&line);
        stderr.push('\n');
    }
    let status = child.wait().expect("wait for gpuwatch");
    let stdout = stdout.join().unwrap().expect("read gpuwatch's stdout");
    assert!(
        at_baseline.is_none() || !status.success(),
        "gpuwatch never logged \"{BASELINE_LOG}\"; stderr:\n{stderr}"
    );
    let json = serde_json::from_slice(&stdout).unwrap_or_else(|e| {
        panic!(
            "gpuwatch printed no JSON ({e}); status {status}; stderr:\n{stderr}\nstdout:\n{}",
            String::from_utf8_lossy(&stdout)
        )
    });
    Run {
        status,
        json,
        stderr,
    }
}

/// The workload with this id (`docker:<id>`, `host:host`, ...).
pub fn workload<'a>(snap: &'a Value, id: &str) -> &'a Value {
    snap["workloads"]
        .as_array()
        .expect("workloads array")
        .iter()
        .find(|w| w["id"] == id)
        .unwrap_or_else(|| panic!("no workload {id} in {:#}", snap["workloads"]))
}

pub fn gpu_process(snap: &Value, gpu: usize, pid: u32) -> &Value {
    snap["gpus"][gpu]["processes"]
        .as_array()
        .expect("processes array")
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| panic!("no pid {pid} on GPU {gpu} in {:#}", snap["gpus"][gpu]))
}

/// A loop device over a temporary image file, detached on drop: real block I/O that the test
/// can throttle through the container's cgroup.
pub struct LoopDevice {
    pub path: String,
    _image: tempfile::TempDir,
}

impl LoopDevice {
    pub fn new(size_mib: u64) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("data.img");
        let f = std::fs::File::create(&img).unwrap();
        f.set_len(size_mib << 20).unwrap();
        let out = run(Command::new("losetup").args(["-f", "--show"]).arg(&img));
        Self {
            path: String::from_utf8_lossy(&out.stdout).trim().to_owned(),
            _image: dir,
        }
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.path]).output();
    }
}

/// Sends SIGTERM and waits for the child to end, at most 15 s (then kills it and fails);
/// returns its status and how long it took.
pub fn sigterm_and_wait(child: &mut Child) -> (std::process::ExitStatus, std::time::Duration) {
    // SAFETY: plain kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let asked = std::time::Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return (s, asked.elapsed());
        }
        if asked.elapsed() > std::time::Duration::from_secs(15) {
            let _ = child.kill();
            panic!("still running 15 s after SIGTERM");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// A process's resident set (KiB) and open files: what a chaos test bounds.
pub fn agent_usage(pid: u32) -> (u64, usize) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    let files = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    (rss, files)
}

/// A port nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap()
}

/// A child killed (SIGTERM, then waited for) on drop.
pub struct Running(pub Child);

impl Drop for Running {
    fn drop(&mut self) {
        // SAFETY: plain kill(2) on our own child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

/// Starts `gpuwatch serve` on a free port (every 500 ms unless `extra` sets `--interval`) with
/// the fake NVML reading `scenario`, run through `prefix` (a command that ends by executing its
/// arguments: `unshare …`, `setpriv …`) when not empty; returns it with the address it printed.
pub fn serve_via(prefix: &[&str], scenario: &Path, extra: &[&str]) -> (Running, String) {
    let mut cmd = match prefix.split_first() {
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args).arg(gpuwatch_bin());
            c
        }
        None => Command::new(gpuwatch_bin()),
    };
    cmd.args(["serve", "--web.listen-address", "127.0.0.1:0"]);
    if !extra.contains(&"--interval") {
        cmd.args(["--interval", "500ms"]);
    }
    if !extra.contains(&"-c") {
        // Rounds are published once the GPU series covers them: with the 10-s default a test
        // waits up to 10 s for each published change.
        cmd.env("GPUWATCH_CONFIG", fast_series_config());
    }
    start_serve(cmd, scenario, extra)
}

/// Starts `gpuwatch serve` on a free port with the configuration file `config` and nothing
/// else setting its interval, the fake NVML reading `scenario`; returns it with its address.
pub fn serve_configured(config: &Path, scenario: &Path, extra: &[&str]) -> (Running, String) {
    let mut cmd = Command::new(gpuwatch_bin());
    cmd.args(["serve", "--web.listen-address", "127.0.0.1:0", "-c"])
        .arg(config);
    start_serve(cmd, scenario, extra)
}

/// Runs `cmd` (a `serve` command line) with `extra` and the fake NVML reading `scenario`, until
/// it says where it listens.
fn start_serve(mut cmd: Command, scenario: &Path, extra: &[&str]) -> (Running, String) {
    use std::io::{BufRead, BufReader};
    let mut child = cmd
        .args(extra)
        .env("GPUWATCH_NVML_LIB", fake_nvml_lib())
        .env("FAKE_NVML_SCENARIO", scenario)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    // Warnings about the configuration may come first.
    let mut before = Vec::new();
    let addr = loop {
        let line = lines
            .next()
            .unwrap_or_else(|| panic!("serve never said where it listens: {before:#?}"))
            .unwrap();
        if let Some((_, a)) = line.rsplit_once("listening on ") {
            break a.to_owned();
        }
        assert!(before.len() < 20, "no listening line in {before:#?}");
        before.push(line);
    };
    // Keep draining stderr so the agent never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    (Running(child), addr)
}

/// A PromQL instant query against a Prometheus-compatible API (Prometheus, VictoriaMetrics);
/// `Null` while the server is still starting.
pub fn promql(server: &str, query: &str) -> Value {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(std::time::Duration::from_secs(5)))
        .build()
        .into();
    let body = agent
        .get(&format!("{server}/api/v1/query"))
        .query("query", query)
        .call()
        .and_then(|mut r| r.body_mut().read_to_string());
    match body {
        Ok(b) => serde_json::from_str(&b).unwrap_or(Value::Null),
        Err(_) => Value::Null,
    }
}

/// Starts a real Prometheus (Debian's package) on a free port, scraping every second, with the
/// shipped rules and `config` (top-level YAML: `scrape_configs`, `remote_write`); returns it
/// with its URL.
pub fn prometheus(dir: &Path, config: &str) -> (Running, String) {
    let port = free_port();
    let file = dir.join("prometheus.yml");
    let rules =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus/gpuwatch-rules.yml");
    std::fs::write(
        &file,
        format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nrule_files: [{}]\n{config}",
            rules.display()
        ),
    )
    .unwrap();
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", file.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--log.level=warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect(
            "prometheus (Debian package `prometheus`, installed by `cargo xtask setup --test`)",
        );
    (Running(child), format!("http://127.0.0.1:{port}"))
}

/// The fake CUDA driver library (`libcuda.so.1`), the job that calls it (`cuda_job`) and a
/// tenant's mapper (`tenant_maps`), built once per test binary from `tests/fake-cuda` with the
/// host's C compiler.
pub fn fake_cuda_dir() -> &'static Path {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("gpuwatch-fake-cuda")
            .tempdir()
            .unwrap();
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("fake-cuda");
        run(Command::new("cc")
            // no identical-code folding: two entry points with the same body must keep two
            // addresses, as the real driver's do (its HtoD, DtoH and DtoD copies are apart)
            .args([
                "-shared",
                "-fPIC",
                "-O2",
                "-fno-ipa-icf",
                "-Wall",
                "-Werror",
                "-o",
            ])
            .arg(dir.path().join("libcuda.so.1"))
            .arg(src.join("fake_cuda.c")));
        run(Command::new("cc")
            .args(["-O2", "-Wall", "-Werror", "-o"])
            .arg(dir.path().join("cuda_job"))
            .arg(src.join("cuda_job.c"))
            .args(["-ldl", "-pthread"]));
        // static: a tenant runs it chrooted into a folder of its own
        run(Command::new("cc")
            .args(["-O2", "-static", "-Wall", "-Werror", "-o"])
            .arg(dir.path().join("tenant_maps"))
            .arg(src.join("tenant_maps.c")));
        // world-readable: the containers' processes open it through their own root
        let _ = std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        );
        dir
    })
    .path()
}

/// A container running `cuda_job ARGS` against the fake driver library, mounted at
/// `/opt/cuda` as the NVIDIA toolkit bind-mounts the host's library (one file, one inode, for
/// every container), with the host's C library for the dynamically linked job. `env` sets
/// the fake's knobs (`FAKE_CUDA_KERNEL_US`, `FAKE_CUDA_COPY_GBPS`); `extra` more `docker run`
/// arguments.
pub fn cuda_container(name: &str, env: &[(&str, &str)], extra: &[&str], job: &str) -> Container {
    let lib = format!("{}:/opt/cuda:ro", fake_cuda_dir().display());
    let mut args: Vec<String> = [
        "-v",
        &lib,
        "-v",
        "/lib/x86_64-linux-gnu:/lib/x86_64-linux-gnu:ro",
        "-v",
        "/lib64:/lib64:ro",
        "-e",
        "LD_LIBRARY_PATH=/opt/cuda",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for (k, v) in env {
        args.push("-e".into());
        args.push(format!("{k}={v}"));
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Container::start_with(name, &[], &args, &format!("exec /opt/cuda/cuda_job {job}"))
}

/// What a `cuda_job --report FILE` had done at one time: its running totals (seconds where
/// the job timed itself).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct JobTally {
    pub unix_ms: f64,
    pub launches: f64,
    pub h2d: f64,
    pub h2d_bytes: f64,
    pub d2h: f64,
    pub d2h_bytes: f64,
    pub syncs: f64,
    pub copy_s: f64,
    pub sync_s: f64,
    pub cpu_s: f64,
}

impl JobTally {
    fn minus(&self, o: &Self) -> Self {
        Self {
            unix_ms: self.unix_ms - o.unix_ms,
            launches: self.launches - o.launches,
            h2d: self.h2d - o.h2d,
            h2d_bytes: self.h2d_bytes - o.h2d_bytes,
            d2h: self.d2h - o.d2h,
            d2h_bytes: self.d2h_bytes - o.d2h_bytes,
            syncs: self.syncs - o.syncs,
            copy_s: self.copy_s - o.copy_s,
            sync_s: self.sync_s - o.sync_s,
            cpu_s: self.cpu_s - o.cpu_s,
        }
    }

    fn between(a: &Self, b: &Self, unix_ms: f64) -> Self {
        let f = if b.unix_ms > a.unix_ms {
            ((unix_ms - a.unix_ms) / (b.unix_ms - a.unix_ms)).clamp(0.0, 1.0)
        } else {
            0.0
        };
        let mix = |x: f64, y: f64| x + (y - x) * f;
        Self {
            unix_ms,
            launches: mix(a.launches, b.launches),
            h2d: mix(a.h2d, b.h2d),
            h2d_bytes: mix(a.h2d_bytes, b.h2d_bytes),
            d2h: mix(a.d2h, b.d2h),
            d2h_bytes: mix(a.d2h_bytes, b.d2h_bytes),
            syncs: mix(a.syncs, b.syncs),
            copy_s: mix(a.copy_s, b.copy_s),
            sync_s: mix(a.sync_s, b.sync_s),
            cpu_s: mix(a.cpu_s, b.cpu_s),
        }
    }
}

/// A job's own account of itself, written every 20 ms (`cuda_job --report`): what a test holds
/// gpuwatch's figures to, over the very window gpuwatch measured, however fast this machine ran
/// the job.
pub struct JobReport(Vec<JobTally>);

impl JobReport {
    pub fn read(path: &Path) -> Self {
        let text =
            std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let lines = text
            .lines()
            .filter_map(|l| {
                let v: Vec<f64> = l.split(' ').filter_map(|x| x.parse().ok()).collect();
                (v.len() == 10).then(|| JobTally {
                    unix_ms: v[0],
                    launches: v[1],
                    h2d: v[2],
                    h2d_bytes: v[3],
                    d2h: v[4],
                    d2h_bytes: v[5],
                    syncs: v[6],
                    copy_s: v[7] / 1e6,
                    sync_s: v[8] / 1e6,
                    cpu_s: v[9] / 1e6,
                })
            })
            .collect();
        Self(lines)
    }

    /// The totals at `unix_ms`, between the two lines around it.
    pub fn at(&self, unix_ms: f64) -> JobTally {
        let after = self.0.iter().position(|t| t.unix_ms >= unix_ms);
        match after {
            Some(0) | None => panic!(
                "the job's report does not cover {unix_ms} ms ({} lines, {:?} to {:?})",
                self.0.len(),
                self.0.first().map(|t| t.unix_ms),
                self.0.last().map(|t| t.unix_ms)
            ),
            Some(i) => JobTally::between(&self.0[i - 1], &self.0[i], unix_ms),
        }
    }

    /// Whether the job ran through the whole of a snapshot's window: its report begins before
    /// the window and goes on past it.
    pub fn covers(&self, snap: &Value) -> bool {
        let end = snap["taken_at_unix_ms"].as_f64().expect("taken_at_unix_ms");
        let window = snap["window_seconds"].as_f64().expect("window_seconds");
        let (Some(first), Some(last)) = (self.0.first(), self.0.last()) else {
            return false;
        };
        first.unix_ms < end - window * 1e3 && last.unix_ms > end
    }

    /// What the job did in a snapshot's window (`taken_at_unix_ms`, `window_seconds`).
    pub fn in_window(&self, snap: &Value) -> JobTally {
        let end = snap["taken_at_unix_ms"].as_f64().expect("taken_at_unix_ms");
        let window = snap["window_seconds"].as_f64().expect("window_seconds");
        self.at(end).minus(&self.at(end - window * 1e3))
    }
}

/// The time some task of the cgroup of `pid` waited for a CPU so far, in seconds: the `some`
/// line's `total=` (µs) of its `cpu.pressure` on the unified hierarchy, the kernel's own figure.
pub fn cgroup_cpu_pressure_seconds(pid: u32) -> f64 {
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let path = cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .expect("a unified-hierarchy line in /proc/<pid>/cgroup");
    let text = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .iter()
        .map(|root| format!("{root}{path}/cpu.pressure"))
        .find_map(|f| std::fs::read_to_string(f).ok())
        .unwrap_or_else(|| panic!("no cpu.pressure for {path}"));
    text.lines()
        .find_map(|l| l.strip_prefix("some "))
        .and_then(|l| l.split(' ').find_map(|f| f.strip_prefix("total=")))
        .and_then(|v| v.parse::<f64>().ok())
        .expect("some total= in cpu.pressure")
        / 1e6
}

/// The CPU time the cgroup of `pid` has used so far, in microseconds: `usage_usec` of its
/// `cpu.stat` on the unified hierarchy (`/sys/fs/cgroup/unified` on hybrid hosts) — the
/// kernel's own figure, a reference independent of the agent.
pub fn cgroup_cpu_usec(pid: u32) -> u64 {
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let path = cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .expect("a unified-hierarchy line in /proc/<pid>/cgroup");
    let stat = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .iter()
        .map(|root| format!("{root}{path}/cpu.stat"))
        .find_map(|f| std::fs::read_to_string(f).ok())
        .unwrap_or_else(|| panic!("no cpu.stat for {path}"));
    stat.lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .and_then(|v| v.trim().parse().ok())
        .expect("usage_usec in cpu.stat")
}

/// The time the CPU quota has held the cgroup of `pid` back so far, in seconds: the cpu
/// controller's `cpu.stat` (`throttled_time`, ns, on a v1 hierarchy; `throttled_usec` on v2).
pub fn cgroup_throttled_seconds(pid: u32) -> f64 {
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    for line in cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (_, controllers, path) = (f.next(), f.next().unwrap_or(""), f.next().unwrap_or(""));
        if controllers.split(',').any(|c| c == "cpu") {
            let stat =
                std::fs::read_to_string(format!("/sys/fs/cgroup/{controllers}{path}/cpu.stat"))
                    .unwrap();
            return stat
                .lines()
                .find_map(|l| l.strip_prefix("throttled_time "))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .expect("throttled_time in a v1 cpu.stat")
                / 1e9;
        }
        if controllers.is_empty() && path.starts_with('/') {
            if let Ok(stat) = std::fs::read_to_string(format!("/sys/fs/cgroup{path}/cpu.stat")) {
                if let Some(usec) = stat.lines().find_map(|l| l.strip_prefix("throttled_usec ")) {
                    return usec.trim().parse::<f64>().unwrap() / 1e6;
                }
            }
        }
    }
    panic!("no cpu controller for pid {pid}: {cgroup}");
}

/// A configuration that fetches the GPU series every second (the default is 10 s): for tests
/// that wait on what `serve` publishes.
pub fn fast_series_config() -> PathBuf {
    let path = std::env::temp_dir().join("gpuwatch-e2e-fast-series.yaml");
    let text = "sources:\n  nvml_series_interval: 1s\n";
    if std::fs::read_to_string(&path).ok().as_deref() != Some(text) {
        let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }
    path
}

/// Runs `cmd` under a limit of `n` open files, soft and hard (so it cannot raise its own).
pub fn limit_open_files(cmd: &mut Command, n: u64) {
    use std::os::unix::process::CommandExt;
    // SAFETY: setrlimit only, between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: n,
                rlim_max: n,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
