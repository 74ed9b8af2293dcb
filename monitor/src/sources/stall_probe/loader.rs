//! How the stall programs are loaded, in the shape of aya's `EbpfLoader`: the product takes
//! the defaults (or detaches the read and block programs for adaptive tracing); tests and the
//! cost benchmark turn the other settings.
use super::{ProbeError, StallProbe};

/// Settings for [`StallProbe::loader`]; `load` loads and attaches with them.
#[derive(Clone, Copy, Debug)]
pub struct StallProbeLoader {
    pub(super) filter_by_cgroup: bool,
    pub(super) empty: bool,
    pub(super) attach_io: bool,
    pub(super) task_entries: Option<u32>,
    pub(super) time_every_read: bool,
    pub(super) exit_ret_offset: Option<u32>,
}

impl Default for StallProbeLoader {
    /// Every program attached, tracking only the watched cgroups, maps sized for this host.
    fn default() -> Self {
        Self {
            filter_by_cgroup: true,
            empty: false,
            attach_io: true,
            task_entries: None,
            time_every_read: false,
            exit_ret_offset: None,
        }
    }
}

impl StallProbeLoader {
    /// Track only the cgroups passed to [`StallProbe::watch`] (the default), or every task.
    pub fn filter_by_cgroup(&mut self, on: bool) -> &mut Self {
        self.filter_by_cgroup = on;
        self
    }

    /// Attach the read and block programs now (the default), or load them detached: only the
    /// scheduler programs run until [`StallProbe::step_io`] asks for them.
    pub fn attach_io(&mut self, on: bool) -> &mut Self {
        self.attach_io = on;
        self
    }

    /// `entries` in each per-task map instead of what the host's CPUs allow: for tests that
    /// fill them.
    pub fn task_entries(&mut self, entries: u32) -> &mut Self {
        self.task_entries = Some(entries);
        self
    }

    /// The same programs on the same tracepoints, each returning at once: what the tracing
    /// mechanism costs by itself, below anything a program does. For the cost benchmark.
    pub fn empty_programs(&mut self, on: bool) -> &mut Self {
        self.empty = on;
        self
    }

    /// Time every read from entry to exit instead of the sample that `monitor_common::reads`
    /// describes: what the sample's estimates are checked against. For the cost benchmark.
    pub fn time_every_read(&mut self, on: bool) -> &mut Self {
        self.time_every_read = on;
        self
    }

    /// Read-family exits' return value (the bytes read) taken from `offset` in their record,
    /// as on a kernel whose records are laid out otherwise: for the test that a relocated load
    /// passes the verifier and reads there.
    pub fn exit_ret_offset(&mut self, offset: u32) -> &mut Self {
        self.exit_ret_offset = Some(offset);
        self
    }

    pub fn load(&self) -> Result<StallProbe, ProbeError> {
        StallProbe::load_programs(self)
    }
}
