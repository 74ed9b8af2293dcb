//! The YAML configuration file: what the agent samples, how it judges, which alert rules run and
//! where their notifications go.
//!
//! Every key is optional (no file at all gives the defaults); unknown keys are errors, and every
//! error names the file, the line and the field. Each section's type lives beside the code that
//! uses it ([`crate::analysis::verdict::VerdictConfig`], [`crate::health::alerts::AlertsConfig`],
//! [`crate::notify::NotifyConfig`], ...); this module owns the file and the value formats
//! (durations like `90s`, sizes like `2GiB`). `gpuwatch check-config FILE` validates a file;
//! `docs/config.md` documents every key.
mod locate;

use crate::analysis::headroom::HeadroomConfig;
use crate::analysis::verdict::VerdictConfig;
use crate::field_error::FieldError;
use crate::health::alerts::AlertsConfig;
use crate::health::doctor_config::DoctorConfig;
use crate::notify::NotifyConfig;
use crate::units::duration;
use locate::KeyPlaces;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Time between samples for the continuous commands (`watch`, `record`, `top`).
    #[serde(with = "duration")]
    pub interval: Duration,
    /// Time between samples for `serve`. An exporter is scraped every 15 s or more, and the
    /// GPU's busy time comes from the driver's series whatever the round: 5-s rounds cost two
    /// thirds of 1-s ones (docs/performance.md) and lose no figure a scrape would see.
    #[serde(with = "duration")]
    pub serve_interval: Duration,
    pub sources: SourcesConfig,
    pub verdict: VerdictConfig,
    pub headroom: HeadroomConfig,
    pub doctor: DoctorConfig,
    pub alerts: AlertsConfig,
    pub notify: NotifyConfig,
    /// What a GPU-hour and a kWh cost, for `report`'s money figures.
    pub prices: crate::recording::summary::Prices,
}

/// `serve_interval`'s default.
pub const DEFAULT_SERVE_INTERVAL: Duration = Duration::from_secs(5);

impl Default for Config {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(1),
            serve_interval: DEFAULT_SERVE_INTERVAL,
            sources: SourcesConfig::default(),
            verdict: VerdictConfig::default(),
            headroom: HeadroomConfig::default(),
            doctor: DoctorConfig::default(),
            alerts: AlertsConfig::default(),
            notify: NotifyConfig::default(),
            prices: Default::default(),
        }
    }
}

/// Where the agent gets its data (the command-line flags override these).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SourcesConfig {
    pub nvml: bool,
    /// The NVML library to load; default: `libnvidia-ml.so.1` from the loader path.
    pub nvml_lib: Option<PathBuf>,
    /// Where the driver lists its GPUs, compared with NVML's to notice a GPU bound or unbound
    /// after start; default: `driver/nvidia/gpus` under `proc_root`.
    pub nvml_driver_list: Option<PathBuf>,
    pub docker: bool,
    pub docker_socket: PathBuf,
    /// containerd's running tasks, whose specs name the pods of containerd nodes; `null` turns
    /// it off.
    pub containerd_tasks: Option<PathBuf>,
    pub ebpf: bool,
    pub proc_root: PathBuf,
    /// How often the GPU utilisation series, GPM and the shared GPUs' per-process split are
    /// fetched (each call costs ~2 ms of CPU; the driver keeps ~14 s). Rounds are published
    /// once the series covers them: up to this much late. `top` fetches every round.
    #[serde(with = "duration")]
    pub nvml_series_interval: Duration,
    /// When the read-syscall and block programs are attached: `mode` adaptive (default),
    /// always or off, `linger`, `idle_share`, `active_share`.
    pub read_tracing: crate::sampler::io_tracing::IoTracingConfig,
    /// When the CUDA driver probes (uprobes on `libcuda.so`) are attached: `mode` adaptive
    /// (default), always or off, `linger`, `idle_share`, `active_share`.
    pub cuda_tracing: crate::sampler::cuda_tracing::CudaTracingConfig,
}

impl Default for SourcesConfig {
    fn default() -> Self {
        Self {
            nvml: true,
            nvml_lib: None,
            nvml_driver_list: None,
            docker: true,
            docker_socket: PathBuf::from("/var/run/docker.sock"),
            containerd_tasks: Some(PathBuf::from(crate::sources::containerd::DEFAULT_TASK_DIR)),
            ebpf: true,
            proc_root: PathBuf::from("/proc"),
            nvml_series_interval: crate::sampler::DEFAULT_SERIES_INTERVAL,
            read_tracing: Default::default(),
            cuda_tracing: Default::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A syntax, type or validation error at a known place.
    #[error("{path}: line {line}, column {column}, field `{field}`: {message}")]
    Invalid {
        path: PathBuf,
        line: u64,
        column: u64,
        /// The dotted path of the key at that line, e.g. `alerts.rules.gpu_memory_high.for`.
        field: String,
        message: String,
    },
    /// A validation error on a key the file does not spell out (a default).
    #[error("{path}: field `{field}`: {message}")]
    InvalidDefault {
        path: PathBuf,
        field: String,
        message: String,
    },
}

impl Config {
    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parses and validates `text`; `path` only names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let text = &unix_line_breaks(text);
        // An empty file (or only comments) is the defaults, like no file.
        let config: Config = from_yaml(text, path)?;
        config
            .validate()
            .map_err(|e| invalid_field(text, path, e.field, e.message))?;
        Ok(config)
    }

    /// Checks that values make sense together; returns the offending field's dotted path.
    fn validate(&self) -> Result<(), FieldError> {
        crate::units::check_interval(self.interval)
            .map_err(|e| FieldError::new("interval", e.to_string()))?;
        crate::units::check_interval(self.serve_interval)
            .map_err(|e| FieldError::new("serve_interval", e.to_string()))?;
        crate::units::check_interval(self.sources.nvml_series_interval)
            .map_err(|e| FieldError::new("sources.nvml_series_interval", e.to_string()))?;
        self.sources
            .read_tracing
            .validate()
            .map_err(|e| e.within("sources.read_tracing"))?;
        self.sources
            .cuda_tracing
            .validate()
            .map_err(|e| e.within("sources.cuda_tracing"))?;
        self.verdict.validate().map_err(|e| e.within("verdict"))?;
        self.alerts
            .rules
            .validate()
            .map_err(|e| e.within("alerts.rules"))?;
        self.notify.validate().map_err(|e| e.within("notify"))?;
        self.doctor.validate().map_err(|e| e.within("doctor"))?;
        self.prices.validate().map_err(|e| e.within("prices"))?;
        if self.alerts.max_notifications_per_minute == 0 {
            // 0 would hold back every notification and report each as rate-limited.
            return Err(FieldError::new(
                "alerts.max_notifications_per_minute",
                "0 sends nothing: to silence alerts, set `enabled: false` on the rules",
            ));
        }
        Ok(())
    }
}

/// `text` with CR LF and lone CR line breaks as LF. YAML counts a lone CR (old Mac files) as a
/// line break and Rust's `lines()` does not: the parser's line numbers and the locator's must
/// count the same lines. (Found by the config fuzz target: "line 131" of a 9-line file.)
pub fn unix_line_breaks(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains('\r') {
        text.replace("\r\n", "\n").replace('\r', "\n").into()
    } else {
        text.into()
    }
}

/// Deserialises `text` (the contents of `path`, its line breaks made LF: see
/// [`unix_line_breaks`]); an empty document is `T::default()`. Errors carry the line, column
/// and dotted field: the place from the parser, the field from the path serde was at.
pub fn from_yaml<T: serde::de::DeserializeOwned + Default>(
    text: &str,
    path: &Path,
) -> Result<T, ConfigError> {
    let text = &*unix_line_breaks(text);
    if text.lines().all(|l| {
        let l = l.trim();
        l.is_empty() || l.starts_with('#') || l == "---"
    }) {
        return Ok(T::default());
    }
    let mut field = String::new();
    serde_saphyr::with_deserializer_from_str(text, |de| {
        serde_path_to_error::deserialize(de).map_err(|e| {
            field = e.path().to_string();
            e.into_inner()
        })
    })
    .map_err(|e| {
        let (line, column) = e
            .location()
            .map(|l| (l.line(), l.column()))
            .unwrap_or((0, 0));
        ConfigError::Invalid {
            path: path.to_owned(),
            line,
            column,
            field: match field.as_str() {
                "" | "." => "(document)".to_owned(),
                f => f.to_owned(),
            },
            message: plain_message(&e.without_snippet().to_string()),
        }
    })
}

/// A validation error on the dotted `field`, placed at the key that spells it out (or its
/// nearest written ancestor).
pub fn invalid_field(text: &str, path: &Path, field: String, message: String) -> ConfigError {
    match KeyPlaces::of(text).find(&field) {
        Some((line, column)) => ConfigError::Invalid {
            path: path.to_owned(),
            line,
            column,
            field,
            message,
        },
        None => ConfigError::InvalidDefault {
            path: path.to_owned(),
            field,
            message,
        },
    }
}

/// serde-saphyr's message without its `error: line L column C: ` prefix (we give those apart).
fn plain_message(s: &str) -> String {
    let s = s.strip_prefix("error: ").unwrap_or(s);
    let s = match s.strip_prefix("line ") {
        Some(rest) => rest.split_once(": ").map_or(rest, |(_, m)| m),
        None => s,
    };
    let s = s.lines().next().unwrap_or(s).trim();
    // Some messages repeat the place at their end.
    match s.rfind(" at line ") {
        Some(i) if s[i..].contains(", column ") => s[..i].to_owned(),
        _ => s.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::demand::TracingMode;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("/etc/gpuwatch.yaml"))
    }

    #[test]
    fn no_file_content_is_the_defaults() {
        let c = parse("# nothing here\n").expect("empty config");
        assert_eq!(c.interval, Duration::from_secs(1));
        assert_eq!(c.serve_interval, Duration::from_secs(5));
        assert!(c.sources.docker);
        assert!(c.alerts.rules.gpu_underutilized.enabled);
    }

    /// Old Mac (lone CR) and Windows (CR LF) line breaks: the error's line and field are the
    /// ones an editor shows. (The config fuzz target found "line 131" of a 9-line file.)
    #[test]
    fn errors_are_located_whatever_the_line_breaks() {
        for br in ["\n", "\r\n", "\r"] {
            let text = [
                "# comment",
                "interval: 5s",
                "sources:",
                "  docker: maybe",
                "",
            ]
            .join(br);
            let e = parse(&text).expect_err("not a bool");
            match e {
                ConfigError::Invalid { line, field, .. } => {
                    assert_eq!((line, field.as_str()), (4, "sources.docker"), "{br:?}");
                }
                other => panic!("{br:?}: {other}"),
            }
        }
    }

    #[test]
    fn values_override_defaults() {
        let c = parse(
            "interval: 5s\nalerts:\n  rules:\n    gpu_underutilized:\n      below_percent: 20\n      for: 2m\n",
        )
        .expect("valid config");
        assert_eq!(c.interval, Duration::from_secs(5));
        let r = &c.alerts.rules.gpu_underutilized;
        assert_eq!(r.below_percent, 20.0);
        assert_eq!(r.for_, Duration::from_secs(120));
    }

    #[test]
    fn cuda_tracing_and_the_host_side_thresholds_are_checked_where_written() {
        let c = parse("{}\n").unwrap();
        assert_eq!(c.sources.cuda_tracing.mode, TracingMode::Adaptive);
        assert_eq!(
            c.sources.cuda_tracing.for_one_shot().mode,
            TracingMode::Always
        );
        let c = parse("sources:\n  cuda_tracing: {mode: off}\n").unwrap();
        assert_eq!(c.sources.cuda_tracing.for_one_shot().mode, TracingMode::Off);
        for (text, field) in [
            (
                "sources:\n  cuda_tracing: {active_share: 2}\n",
                "sources.cuda_tracing.active_share",
            ),
            (
                "verdict:\n  copy_share_min: 1.5\n",
                "verdict.copy_share_min",
            ),
            (
                "verdict:\n  launch_host_max_us: 0\n",
                "verdict.launch_host_max_us",
            ),
            (
                "verdict:\n  contention_share_min: -0.1\n",
                "verdict.contention_share_min",
            ),
            (
                "verdict:\n  pressure_io_min: 1.01\n",
                "verdict.pressure_io_min",
            ),
            (
                "alerts:\n  max_notifications_per_minute: 0\n",
                "alerts.max_notifications_per_minute",
            ),
        ] {
            let e = parse(text).expect_err(text);
            assert!(e.to_string().contains(field), "{text}: {e}");
            assert!(e.to_string().contains("line 2"), "{text}: {e}");
        }
        // (the key locator does not place a `.nan` value's key: the field is named alone)
        let e = parse("verdict:\n  pcie_busy_bytes_per_second: .nan\n").expect_err("NaN");
        assert!(
            e.to_string()
                .contains("verdict.pcie_busy_bytes_per_second`: NaN is not a positive number"),
            "{e}"
        );
    }

    #[test]
    fn read_tracing_is_adaptive_by_default_and_checked() {
        let c = parse("{}\n").unwrap();
        assert_eq!(c.sources.read_tracing.mode, TracingMode::Adaptive);
        assert_eq!(c.sources.read_tracing.linger, Duration::from_secs(300));
        let one_shot = c.sources.read_tracing.for_one_shot();
        assert_eq!(one_shot.mode, TracingMode::Always);
        let c = parse("sources:\n  read_tracing: {mode: off, linger: 1m}\n").unwrap();
        assert_eq!(c.sources.read_tracing.mode, TracingMode::Off);
        assert_eq!(c.sources.read_tracing.for_one_shot().mode, TracingMode::Off);
        let e = parse("sources:\n  read_tracing: {idle_share: 2}\n").expect_err("not a share");
        assert!(
            e.to_string().contains("sources.read_tracing.idle_share"),
            "{e}"
        );
    }

    #[test]
    fn unknown_key_names_file_line_and_field() {
        let e = parse(
            "interval: 1s\nalerts:\n  rules:\n    gpu_memory_high:\n      abve_percent: 90\n",
        )
        .expect_err("unknown key");
        let s = e.to_string();
        assert!(
            s.starts_with("/etc/gpuwatch.yaml: line 5, column 7, field `alerts.rules.gpu_memory_high.abve_percent`: unknown field `abve_percent`"),
            "{s}"
        );
    }

    #[test]
    fn bad_value_names_its_field() {
        let e = parse("alerts:\n  rules:\n    gpu_temperature_high:\n      for: soon\n")
            .expect_err("bad duration");
        let ConfigError::Invalid {
            line,
            field,
            message,
            ..
        } = e
        else {
            panic!("expected a located error, got {e}");
        };
        assert_eq!(line, 4);
        assert_eq!(field, "alerts.rules.gpu_temperature_high.for");
        assert!(message.contains("\"soon\" is not a duration"), "{message}");
    }

    #[test]
    fn syntax_error_has_a_line() {
        let e = parse("notify:\n  webhook: [\n").expect_err("broken YAML");
        let ConfigError::Invalid { line, .. } = e else {
            panic!("expected a located error, got {e}");
        };
        assert!(line >= 2, "{line}");
    }

    #[test]
    fn validation_errors_point_at_the_key() {
        let e = parse("notify:\n  webhook:\n    url: ftp://example.org/hook\n")
            .expect_err("bad scheme");
        let s = e.to_string();
        assert!(
            s.contains("line 3") && s.contains("field `notify.webhook.url`"),
            "{s}"
        );
        for text in [
            "interval: 0s\n",
            "interval: 1ns\n",
            "interval: 99ms\n",
            "interval: 300000000000y\n",
            "interval: 25h\n",
        ] {
            let e = parse(text).expect_err(text);
            let s = e.to_string();
            assert!(
                s.contains("line 1") && s.contains("field `interval`"),
                "{text}: {s}"
            );
            assert!(s.contains("outside 100ms to 24h"), "{text}: {s}");
        }
        for text in ["interval: 100ms\n", "interval: 24h\n"] {
            parse(text).expect(text);
        }
        let e = parse("interval: 2s\nserve_interval: 50ms\n").expect_err("serve_interval");
        let s = e.to_string();
        assert!(
            s.contains("line 2") && s.contains("field `serve_interval`"),
            "{s}"
        );
        let e = parse("sources:\n  nvml_series_interval: 50ms\n").expect_err("series");
        assert!(e.to_string().contains("line 2"), "{e}");
    }

    #[test]
    fn the_shipped_example_is_valid_and_spells_out_the_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/gpuwatch.yaml");
        let c = Config::load(&path).expect("deploy/gpuwatch.yaml");
        let d = Config::default();
        assert_eq!(format!("{:?}", c.alerts), format!("{:?}", d.alerts));
        assert_eq!(format!("{:?}", c.doctor), format!("{:?}", d.doctor));
        assert_eq!(format!("{:?}", c.verdict), format!("{:?}", d.verdict));
        assert_eq!(format!("{:?}", c.sources), format!("{:?}", d.sources));
        assert_eq!(c.headroom.baseline, d.headroom.baseline);
        assert_eq!(
            (c.interval, c.serve_interval),
            (d.interval, d.serve_interval)
        );
    }

    /// Flow style, and flow mappings spread over lines: the error's line, column and field are
    /// the ones an editor shows (a line-based reading named the wrong field here).
    #[test]
    fn flow_style_errors_are_located() {
        let e = parse("alerts: {rules: {gpu_temperature_high: {for: soon}}}\n")
            .expect_err("bad duration");
        let ConfigError::Invalid { line, field, .. } = &e else {
            panic!("{e}");
        };
        assert_eq!(
            (*line, field.as_str()),
            (1, "alerts.rules.gpu_temperature_high.for")
        );
        let e = parse(
            "alerts:\n  rules: {gpu_memory_high: {above_percent: 90},\n          gpu_temperature_high: {for: soon}}\n",
        )
        .expect_err("bad duration");
        let ConfigError::Invalid { line, field, .. } = &e else {
            panic!("{e}");
        };
        assert_eq!(
            (*line, field.as_str()),
            (3, "alerts.rules.gpu_temperature_high.for")
        );
        // A validation error on a flow key: its own line and column.
        let e = parse("sources:\n  read_tracing: {mode: off,\n    idle_share: 2}\n")
            .expect_err("not a share");
        let ConfigError::Invalid {
            line,
            column,
            field,
            ..
        } = &e
        else {
            panic!("{e}");
        };
        assert_eq!(
            (*line, *column, field.as_str()),
            (3, 5, "sources.read_tracing.idle_share")
        );
    }

    #[test]
    fn key_paths_and_messages() {
        let text = "a:\n  b:\n    - c: 1\n  d: 2\n";
        let places = KeyPlaces::of(text);
        assert_eq!(places.find("a.b.c").map(|p| p.0), Some(3));
        assert_eq!(places.find("a.d").map(|p| p.0), Some(4));
        assert_eq!(places.find("a.b.zz").map(|p| p.0), Some(2));
        assert_eq!(
            plain_message("error: line 4 column 5: unknown field `fr`"),
            "unknown field `fr`"
        );
        assert_eq!(
            plain_message("unknown field `x`, expected y at line 3, column 5"),
            "unknown field `x`, expected y"
        );
    }
}
