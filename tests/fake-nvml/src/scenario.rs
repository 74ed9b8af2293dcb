//! The scenario file: what the fake GPUs report. Documented in `tests/fake-nvml/README.md`.
use serde::Deserialize;
use std::collections::HashMap;

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    #[serde(default = "default_driver")]
    pub driver_version: String,
    /// Make `nvmlInit*` fail with this error (e.g. `"DRIVER_NOT_LOADED"`).
    #[serde(default)]
    pub init_error: Option<String>,
    /// Errors for functions that take no device (e.g. `nvmlDeviceGetCount_v2`), by function name.
    #[serde(default)]
    pub errors: HashMap<String, String>,
    /// Milliseconds to sleep in a function before answering, by function name (every device): a
    /// hung or slow driver. Other calls go on meanwhile.
    #[serde(default)]
    pub delays_ms: HashMap<String, u64>,
    /// Microseconds of CPU to burn in a function, by function name: what each call costs the
    /// caller on a real driver (docs/gpu-sampling.md lists the H200's), so a benchmark can
    /// model the real floor.
    #[serde(default)]
    pub call_cost_us: HashMap<String, u64>,
    /// Utilisation records the driver keeps per GPU (72 on the H200, about 14 s): an agent
    /// that fetches less often than that loses part of the series.
    #[serde(default = "default_history")]
    pub history_records: usize,
    #[serde(default)]
    pub devices: Vec<Device>,
}

fn default_history() -> usize {
    crate::timeline::HISTORY_RECORDS
}

fn default_driver() -> String {
    "580.159.04".to_owned()
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Device {
    pub uuid: String,
    /// The minor number of its `/dev/nvidiaN` node (default: its index).
    #[serde(default)]
    pub minor_number: Option<u32>,
    #[serde(default = "default_name")]
    pub name: String,
    #[serde(default = "default_total")]
    pub memory_total_bytes: u64,
    /// Defaults to the processes' memory plus the driver's own: 480 MiB and 7 MiB per process,
    /// as an H100 measured.
    #[serde(default)]
    pub memory_used_bytes: Option<u64>,
    /// The device's utilisation (percent), fixed. Absent: the processes' shares, added per
    /// sample period and capped at 100, as time-slicing does.
    #[serde(default)]
    pub utilization_gpu: Option<u32>,
    #[serde(default)]
    pub utilization_memory: u32,
    #[serde(default = "default_temp")]
    pub temperature: u32,
    #[serde(default = "default_power")]
    pub power_mw: u32,
    #[serde(default = "default_power_limit")]
    pub power_limit_mw: u32,
    #[serde(default = "default_clock")]
    pub sm_clock_mhz: u32,
    /// Raw `nvmlClocksEventReasons` bits (e.g. 4 = SW power cap).
    #[serde(default)]
    pub clocks_event_reasons: u64,
    /// Volatile uncorrected ECC errors (since the driver loaded). Only grows: a scenario
    /// rewritten with fewer keeps the most seen, as the driver resets it only with the GPU.
    #[serde(default)]
    pub ecc_uncorrected_volatile: u64,
    /// Xid error codes, delivered once each, in order, through the event set (append to
    /// deliver more; those listed before the agent registered are not delivered).
    #[serde(default)]
    pub xid_events: Vec<u64>,
    /// Persistence mode (`nvidia-smi -pm`); on by default, as on a well-set-up server.
    #[serde(default = "default_true")]
    pub persistence_mode: bool,
    /// Every call on this device returns GPU_IS_LOST. Once lost, it stays lost however the
    /// scenario is rewritten: the driver gets a GPU back only through a reset, which the fake
    /// does not model (it cannot be measured on a GPU that may not be reset).
    #[serde(default)]
    pub lost: bool,
    /// A recorded utilisation series played back as this device's records, from the moment the
    /// fake starts: a JSON file `[[offset_ms, percent], ...]` (e.g. made from
    /// tests/fixtures/h200-three-phase). Overrides `utilization_gpu`; the first live process
    /// is credited with every period.
    #[serde(default)]
    pub replay_series: Option<String>,
    /// When playback of `replay_series` began, in Unix milliseconds (default: when the fake
    /// first polls the device). A test that times its own windows sets it, so that the fake and
    /// the test measure offsets from the same instant however long the agent took to start.
    #[serde(default)]
    pub replay_started_unix_ms: Option<u64>,
    /// The driver's sample period (200 ms on the H200).
    #[serde(default = "default_period")]
    pub sample_period_ms: u64,
    /// Whether GPM (`nvmlGpmQueryDeviceSupport`) is supported, as on Hopper and newer.
    #[serde(default = "default_true")]
    pub gpm_supported: bool,
    /// Errors by function name for this device (`"NOT_SUPPORTED"`, `"GPU_IS_LOST"`, ...).
    #[serde(default)]
    pub errors: HashMap<String, String>,
    #[serde(default)]
    pub processes: Vec<Process>,
}

impl Scenario {
    /// What the driver undoes only by resetting the GPU stays from `before` (the scenario this
    /// one replaces): a lost GPU stays lost, a volatile ECC count never drops.
    pub fn keep_what_only_a_reset_undoes(&mut self, before: &Scenario) {
        for (now, then) in self.devices.iter_mut().zip(&before.devices) {
            if now.uuid == then.uuid {
                now.lost |= then.lost;
                now.ecc_uncorrected_volatile = now
                    .ecc_uncorrected_volatile
                    .max(then.ecc_uncorrected_volatile);
            }
        }
    }
}

fn default_true() -> bool {
    true
}
fn default_name() -> String {
    "Fake NVIDIA H200".to_owned()
}
fn default_total() -> u64 {
    150_754_820_096
}
fn default_temp() -> u32 {
    40
}
fn default_power() -> u32 {
    120_000
}
fn default_power_limit() -> u32 {
    700_000
}
fn default_clock() -> u32 {
    1_980
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    #[default]
    Compute,
    Graphics,
    Both,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Process {
    pub pid: u32,
    #[serde(default)]
    pub kind: Kind,
    /// `null` reports NVML_VALUE_NOT_AVAILABLE.
    #[serde(default)]
    pub used_memory_bytes: Option<u64>,
    /// The share of the GPU's time the process keeps it busy (percent); absent: idle.
    #[serde(default)]
    pub sm_util: Option<u32>,
    /// A file the workload writes its current figure to (`95` while it computes, `0` while it
    /// waits); the fake reads it every 10 ms. Overrides `sm_util`.
    #[serde(default)]
    pub sm_util_file: Option<String>,
    #[serde(default)]
    pub mem_util: u32,
    /// While its kernels run: the share of the SMs busy, of the time in tensor instructions, of
    /// the warp slots occupied, and of DRAM bandwidth (GPM). The defaults are a large bf16
    /// matmul's on the H200 (GPM 93.3 / 90.6 / 13.8 / 15.9 at 97.0 % engine activity); a
    /// single-thread spinning kernel read SM activity 0.8 at 99.5.
    #[serde(default = "default_sm_activity")]
    pub sm_activity_percent: f64,
    #[serde(default = "default_tensor")]
    pub tensor_percent: f64,
    #[serde(default = "default_occupancy")]
    pub occupancy_percent: f64,
    #[serde(default = "default_dram")]
    pub dram_percent: f64,
    /// PCIe traffic the process moves while alive, MiB/s to the GPU (receive) and from it
    /// (transmit), whether or not it computes: copies go on while the GPU idles. GPM read on
    /// the H100 host (tests/fixtures/cuda-calls-h100): a pageable-copy step 5,070 / 305, pinned
    /// copies under compute 11,258 / 677, a one-element-kernel loop 197 / 23, a matmul loop
    /// 15.5 / 5.4, an idle process 0.14 / 0.28. Default 0.
    #[serde(default)]
    pub pcie_rx_mib_s: f64,
    #[serde(default)]
    pub pcie_tx_mib_s: f64,
}

fn default_sm_activity() -> f64 {
    96.0
}
fn default_tensor() -> f64 {
    93.0
}
fn default_occupancy() -> f64 {
    14.0
}
fn default_dram() -> f64 {
    16.0
}

fn default_period() -> u64 {
    200
}

#[cfg(test)]
mod reset_tests {
    use super::*;

    fn scenario(lost: bool, ecc: u64) -> Scenario {
        serde_json::from_value(serde_json::json!({"devices": [
            {"uuid": "GPU-a", "lost": lost, "ecc_uncorrected_volatile": ecc}]}))
        .unwrap()
    }

    #[test]
    fn a_lost_gpu_stays_lost_and_a_volatile_ecc_count_never_drops() {
        let mut now = scenario(false, 1);
        now.keep_what_only_a_reset_undoes(&scenario(true, 3));
        assert!(now.devices[0].lost);
        assert_eq!(now.devices[0].ecc_uncorrected_volatile, 3);
        let mut grown = scenario(false, 5);
        grown.keep_what_only_a_reset_undoes(&scenario(false, 3));
        assert_eq!(grown.devices[0].ecc_uncorrected_volatile, 5);
    }
}
