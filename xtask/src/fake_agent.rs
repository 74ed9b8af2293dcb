//! `gpuwatch serve` (the release build) on the fake NVML library, for the tasks that run the
//! agent without a GPU (`soak`, `demo`): started, its listening address read from its log,
//! stopped on drop.
use crate::workspace_root;
use anyhow::{bail, Context, Result};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// The agent, stopped (SIGTERM, then waited for) on drop.
pub struct FakeAgent {
    child: Child,
    /// `http://host:port`.
    pub url: String,
}

impl FakeAgent {
    /// Starts `serve` on `listen` every `interval` over `scenario`; returns once it listens.
    pub fn start(scenario: &Path, listen: &str, interval: &str) -> Result<Self> {
        let binary = workspace_root().join("target/release/gpuwatch");
        Self::start_binary(&binary, scenario, listen, Some(interval))
    }

    /// Starts `serve` from `binary`, at `interval` or its default.
    pub fn start_binary(
        binary: &Path,
        scenario: &Path,
        listen: &str,
        interval: Option<&str>,
    ) -> Result<Self> {
        let root = workspace_root();
        let mut command = Command::new(binary);
        command.args(["serve", "--web.listen-address", listen]);
        if let Some(interval) = interval {
            command.args(["--interval", interval]);
        }
        let mut child = command
            .env(
                "GPUWATCH_NVML_LIB",
                root.join("target/release/libnvidia_ml_fake.so"),
            )
            .env("FAKE_NVML_SCENARIO", scenario)
            .stderr(Stdio::piped())
            .spawn()
            .context("starting gpuwatch serve")?;
        let stderr = child.stderr.take().context("the agent's stderr")?;
        // Owned from here: stopped on drop if it never says where it listens.
        let mut agent = Self {
            child,
            url: String::new(),
        };
        let mut lines = BufReader::new(stderr).lines();
        agent.url = loop {
            let Some(line) = lines.next() else {
                bail!("gpuwatch serve ended before it listened");
            };
            if let Some((_, a)) = line?.rsplit_once("listening on ") {
                break a.to_owned();
            }
        };
        std::thread::spawn(move || for _ in lines {});
        Ok(agent)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `host:port`.
    pub fn addr(&self) -> &str {
        self.url.trim_start_matches("http://")
    }
}

impl Drop for FakeAgent {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}
