//! What the GPU processes asked of the CUDA driver in one window: kernel launches, copies and
//! synchronisations, from uprobes on the driver library (see `sources::cuda_probe`).
use serde::{Deserialize, Serialize};

/// One direction of copies in a window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Transfer {
    pub count: u64,
    pub bytes: u64,
    /// Time the calling threads spent inside the copy calls (a copy from pageable memory
    /// returns only once the driver has staged it; one from pinned memory with
    /// `non_blocking=True` at once).
    pub call_seconds: f64,
    /// Time in the synchronisations that waited for these copies right after them (a
    /// blocking `tensor.to("cuda")` is a copy and a stream synchronise).
    pub wait_seconds: f64,
    /// The calling thread's own time between back-to-back copies (a loop of `tensor.to()`):
    /// issuing them.
    #[serde(default)]
    pub between_seconds: f64,
}

impl Transfer {
    pub const ZERO: Self = Self {
        count: 0,
        bytes: 0,
        call_seconds: 0.0,
        wait_seconds: 0.0,
        between_seconds: 0.0,
    };

    /// The time the thread was held by these copies: in the calls and waiting for them.
    pub fn seconds(&self) -> f64 {
        self.call_seconds + self.wait_seconds
    }

    /// That, and its own time issuing them back to back.
    pub fn with_issuing(&self) -> f64 {
        self.seconds() + self.between_seconds
    }

    pub fn add(&mut self, o: &Self) {
        self.count += o.count;
        self.bytes += o.bytes;
        self.call_seconds += o.call_seconds;
        self.wait_seconds += o.wait_seconds;
        self.between_seconds += o.between_seconds;
    }
}

/// CUDA driver calls of one thread or set of threads in a window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CudaCalls {
    /// Kernel launches (`cuLaunchKernel`, `cuLaunchKernelEx`, cooperative launches).
    pub launches: u64,
    /// CUDA graph launches (`cuGraphLaunch`): each runs many kernels.
    pub graph_launches: u64,
    pub h2d: Transfer,
    pub d2h: Transfer,
    pub d2d: Transfer,
    /// Copies whose call does not say the direction (`cuMemcpy`, `cuMemcpyAsync`).
    pub other_copies: Transfer,
    /// Stream, context and event synchronisations (not those that waited for a copy).
    pub syncs: u64,
    pub sync_seconds: f64,
}

impl CudaCalls {
    pub fn add(&mut self, o: &Self) {
        self.launches += o.launches;
        self.graph_launches += o.graph_launches;
        self.h2d.add(&o.h2d);
        self.d2h.add(&o.d2h);
        self.d2d.add(&o.d2d);
        self.other_copies.add(&o.other_copies);
        self.syncs += o.syncs;
        self.sync_seconds += o.sync_seconds;
    }

    /// Time held by copies between host and device (either way, or of unknown direction).
    pub fn host_copy_seconds(&self) -> f64 {
        self.h2d.seconds() + self.d2h.seconds() + self.other_copies.seconds()
    }

    /// That, and the thread's own time issuing them back to back.
    pub fn host_copy_seconds_with_issuing(&self) -> f64 {
        self.h2d.with_issuing() + self.d2h.with_issuing() + self.other_copies.with_issuing()
    }

    /// Calls made: launches (graph launches too), copies, synchronisations.
    pub fn calls(&self) -> u64 {
        self.launches
            + self.graph_launches
            + self.h2d.count
            + self.d2h.count
            + self.d2d.count
            + self.other_copies.count
            + self.syncs
    }
}

/// One GPU process's calls in a window.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct CudaProcessCalls {
    pub pid: u32,
    /// All its threads.
    pub calls: CudaCalls,
    /// Its main thread alone, where a training loop runs.
    pub main_thread: CudaCalls,
}

/// A workload's CUDA driver calls in one window.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CudaWindow {
    /// Whether the probes were attached for the whole window: without it the figures are
    /// partial (attached during it) or empty (not attached), not zero.
    pub traced: bool,
    /// All its GPU processes together.
    pub total: CudaCalls,
    pub processes: Vec<CudaProcessCalls>,
}

/// Where the CUDA driver probes stand (the config's `sources.cuda_tracing`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct CudaTracingState {
    /// `adaptive`, `always` or `off`.
    pub mode: &'static str,
    /// Attached now.
    pub attached: bool,
    /// When they were last attached, Unix ms.
    pub on_since_unix_ms: Option<u64>,
    /// Why they are wanted now, or `None`.
    pub reason: Option<String>,
    /// The driver libraries the GPU processes map, and whether each is probed.
    pub libraries: Vec<DriverLibrary>,
    /// Returns without their entry (entered before attach, or evicted), since load.
    pub unmatched_returns: u64,
    /// Map updates that failed in the kernel, since load.
    pub map_update_failed: u64,
}

/// A CUDA driver library file (one inode, however many containers map it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DriverLibrary {
    /// Its path as a process that maps it sees it.
    pub path: String,
    pub device: u64,
    pub inode: u64,
    /// Probed entry points found in it.
    pub entry_points: usize,
    pub attached: bool,
    /// Why it could not be probed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}
