//! The Prometheus exposition of a snapshot (OpenMetrics text, through prometheus-client).
//!
//! Every scrape renders the latest snapshot, so the series of a container that exited are gone
//! from the next scrape on: nothing to expire by hand, no unbounded growth. Names follow the
//! Prometheus conventions: a `gpuwatch_` prefix, base units (bytes, seconds, celsius, watts,
//! hertz, ratios 0–1), `_total` for counters, `_info` for metadata. Labels name containers
//! (`container_id`, `container_name`, `image`, `compose_service`, `kind`) and GPUs (`gpu`,
//! `uuid`); never PIDs, whose values are unbounded. `docs/metrics.md` lists every metric.
//!
//! One file per family group, each a function of the published round: [`agent`] (the agent
//! and its sources), [`gpu`], [`container`], [`alerts`].
mod agent;
mod alerts;
mod container;
mod gpu;

use super::escape;
use super::published::Published;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use std::sync::Arc;

/// Renders `e` in the OpenMetrics text format.
pub fn render(e: &Arc<Published>) -> Result<String, std::fmt::Error> {
    render_live(e, None)
}

/// [`render`], with the source a round in progress is hung in (`nvml`, told by the
/// heartbeat): `gpuwatch_up` reads 0 for it, though the last published round found it up.
pub fn render_live(
    e: &Arc<Published>,
    hung_source: Option<&'static str>,
) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(SnapshotCollector(e.clone(), hung_source)));
    let mut out = String::with_capacity(64 * 1024);
    prometheus_client::encoding::text::encode(&mut out, &registry)?;
    Ok(out)
}

pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The Prometheus text format, for a client that does not ask for OpenMetrics.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Whether a request's `Accept` header asks for OpenMetrics (Prometheus does by default); any
/// other client gets the text format, which every Prometheus-compatible tool reads.
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| a.contains("application/openmetrics-text"))
}

/// The OpenMetrics rendering in the Prometheus text format (0.0.4): no `# EOF` or `# UNIT`
/// lines, and a counter's `HELP` and `TYPE` named as its samples are, with `_total` (under
/// OpenMetrics they name the family without it, which `promtool check metrics` reads as a
/// counter without help).
pub fn to_text_format(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut lines = openmetrics.lines().peekable();
    while let Some(line) = lines.next() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or("");
            // The TYPE line follows its HELP line; UNIT lines may come between.
            let counter = lines
                .clone()
                .find(|l| l.starts_with("# TYPE "))
                .is_some_and(|t| t == format!("# TYPE {name} counter"));
            if counter {
                out.push_str(&format!("# HELP {name}_total{}\n", &rest[name.len()..]));
                continue;
            }
        }
        if let Some(name) = line
            .strip_prefix("# TYPE ")
            .and_then(|r| r.strip_suffix(" counter"))
        {
            out.push_str(&format!("# TYPE {name}_total counter\n"));
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[derive(Debug)]
struct SnapshotCollector(Arc<Published>, Option<&'static str>);

impl Collector for SnapshotCollector {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let e = &self.0;
        agent::encode(&mut enc, &e.snapshot, self.1)?;
        gpu::encode(&mut enc, &e.snapshot, &e.xid_totals, &e.accounting)?;
        container::encode(&mut enc, &e.snapshot, &e.accounting)?;
        alerts::encode(&mut enc, &e.alerts)
    }
}

type Labels = Vec<(&'static str, String)>;

/// One family: a descriptor, then one sample per label set.
/// The most characters a label value carries: tenants choose names, images and compose labels,
/// and a megabyte of label repeats in every series of its container (17 MB of `/metrics` for
/// two containers before this).
const LABEL_MAX_CHARS: usize = 256;

fn family<I>(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    kind: MetricType,
    samples: I,
) -> Result<(), std::fmt::Error>
where
    I: IntoIterator<Item = (Labels, f64)>,
{
    let mut m = enc.encode_descriptor(name, help, unit.as_ref(), kind)?;
    for (mut labels, v) in samples {
        for (_, value) in &mut labels {
            if let std::borrow::Cow::Owned(cut) = escape::bounded(value, LABEL_MAX_CHARS) {
                *value = cut;
            }
            if let std::borrow::Cow::Owned(shown) = escape::label_value(value) {
                *value = shown;
            }
        }
        let sample = m.encode_family(&labels)?;
        match kind {
            MetricType::Counter => ConstCounter::new(v).encode(sample)?,
            _ => ConstGauge::new(v).encode(sample)?,
        }
    }
    Ok(())
}

/// `labels` and then `extra`.
fn with(mut labels: Labels, extra: &[(&'static str, String)]) -> Labels {
    labels.extend(extra.iter().cloned());
    labels
}

/// The unit of a share, 0–1.
fn ratio_unit() -> Option<Unit> {
    Some(Unit::Other("ratio".into()))
}

fn bool_value(b: bool) -> f64 {
    if b {
        1.0
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::{container, gpu, snapshot};
    use crate::model::WorkloadGpuShare;
    use std::collections::BTreeMap;

    /// A container with every part the encoder reads: 8 GPUs, CPU and memory, stall windows,
    /// a verdict, a Kubernetes pod.
    fn full_container(i: usize, gpus: u32) -> crate::model::Workload {
        use crate::model::{
            CpuUsage, IoSummary, KubernetesPod, MemoryUsage, StallWindow, Verdict, VerdictKind,
        };
        let mut w = container(&format!("train-{i:04}"));
        let mut info = (**w.container.as_ref().unwrap()).clone();
        info.kubernetes = Some(KubernetesPod {
            namespace: "ml".into(),
            pod: format!("train-{i}"),
            container: Some("trainer".into()),
            uid: None,
        });
        w.container = Some(Arc::new(info));
        w.gpu.processes = gpus as usize;
        w.gpu.busy_fraction = Some(0.8);
        w.gpu.per_gpu = (0..gpus)
            .map(|g| WorkloadGpuShare {
                memory_bytes: 1 << 30,
                busy_fraction: Some(0.8),
                split: Some(crate::model::SplitMethod::SoleHolder),
                device_busy_fraction: Some(0.8),
                sm_activity_percent: Some(90.0),
                pids: vec![1000 + g],
                ..WorkloadGpuShare::new(g, Some(format!("GPU-{g:08}")))
            })
            .collect();
        w.cpu = Some(CpuUsage {
            usage_seconds_total: 10.0,
            cores: Some(2.0),
            limit_cores: Some(4.0),
            cpuset_cpus: None,
            throttled_seconds_total: Some(1.0),
            throttled_fraction: Some(0.1),
            quota_periods: None,
        });
        w.memory = Some(MemoryUsage {
            usage_bytes: 1 << 30,
            limit_bytes: Some(4 << 30),
            page_cache_bytes: Some(1 << 20),
            own_bytes: None,
        });
        let io = IoSummary {
            count: 10,
            bytes: 1 << 20,
            mean_latency_ms: Some(1.0),
            ..Default::default()
        };
        w.stalls = Some(StallWindow {
            cgroup_id: 1,
            processes: Vec::new(),
            reads: io,
            disk: io,
            io_traced: true,
        });
        let calls = crate::model::CudaCalls {
            launches: 12_000,
            ..Default::default()
        };
        w.cuda = Some(crate::model::CudaWindow {
            traced: true,
            total: calls,
            processes: Vec::new(),
        });
        w.straggler = Some(crate::model::Straggler {
            pid: 1000,
            gpu: 0,
            by: crate::model::StragglerBasis::SmActivity,
            spread_points: 20.0,
        });
        w.verdict = Some(Verdict {
            kind: VerdictKind::InputBoundIo,
            basis: crate::model::VerdictBasis::StallTracing,
            gpu_busy_fraction: 0.2,
            gpu_idle_fraction: 0.8,
            input_bound_share: Some(0.7),
            trainer_wait_fraction: Some(0.7),
            sm_activity_fraction: Some(0.9),
            loader: None,
            host: None,
            host_bound_share: Some(0.4),
            idle_explained_fraction: None,
            cpu_throttled_fraction: Some(0.1),
            contention: None,
            speedup: None,
            evidence: Vec::new(),
            advice: String::new(),
        });
        w
    }

    /// The cardinality budget (docs/metrics.md): at 1,000 containers on 8 GPUs, no series
    /// carries more than 15 labels (Mimir's default cap is 30), and a container costs at most
    /// 32 series plus 4 per GPU it holds (15 gauges and 4 per GPU, 4 of them only while the
    /// CUDA probes are attached; the accounting counters with an idle series for every verdict
    /// there is, the worst case).
    #[test]
    fn a_thousand_containers_stay_within_the_cardinality_budget() {
        const CONTAINERS: usize = 1_000;
        const GPUS: u32 = 8;
        let workloads: Vec<_> = (0..CONTAINERS).map(|i| full_container(i, GPUS)).collect();
        let mut accounting = crate::output::accounting::Accounting::default();
        for w in &workloads {
            let t = accounting.workloads.entry(w.id.clone()).or_default();
            t.gpu_busy_seconds = 1.0;
            t.loader_on_cpu_seconds = 1.0;
            for kind in crate::model::VerdictKind::ALL {
                t.gpu_idle_seconds.insert(kind, 1.0);
            }
        }
        let e = Arc::new(Published {
            snapshot: snapshot(1_700_000_000_000, (0..GPUS).map(gpu).collect(), workloads),
            alerts: Vec::new(),
            xid_totals: BTreeMap::new(),
            accounting,
            recent: Default::default(),
        });
        let text = render(&e).expect("render");
        let mut per_container: std::collections::HashMap<&str, usize> = Default::default();
        let mut most_labels = 0;
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let labels = line
                .split_once('{')
                .map_or("", |(_, rest)| rest.rsplit_once('}').map_or("", |(l, _)| l));
            // Label values here hold no `",`: a label ends at each `",`.
            let count = if labels.is_empty() {
                0
            } else {
                labels.matches("\",").count() + 1
            };
            most_labels = most_labels.max(count);
            if let Some(at) = labels.find("container_name=\"") {
                let name = &labels[at + 16..];
                let name = &name[..name.find('"').unwrap()];
                *per_container.entry(name).or_default() += 1;
            }
        }
        assert_eq!(per_container.len(), CONTAINERS);
        let worst = per_container.values().copied().max().unwrap();
        let budget = 32 + 4 * GPUS as usize;
        assert!(
            worst <= budget,
            "{worst} series for one container, budget {budget}"
        );
        assert!(most_labels <= 15, "a series with {most_labels} labels");
        eprintln!("worst container: {worst} series; most labels on a series: {most_labels}");
        let per_container = text.len() / CONTAINERS;
        eprintln!("{} bytes, {per_container} per container", text.len());
        assert!(
            per_container <= TYPICAL_BYTES_PER_CONTAINER,
            "{per_container} bytes a container"
        );
    }

    /// /metrics' size a container adds, with typical names (train-0001, trainer:latest) and
    /// with every tenant string at its longest (cut at [`LABEL_MAX_CHARS`]): a tenant can make
    /// its own series at most this large, whatever its names. Measured at 8 GPUs: 11,602 and
    /// 44,585 bytes (`container_name`, `image` and `compose_service` are on every series).
    const TYPICAL_BYTES_PER_CONTAINER: usize = 12 << 10;
    const LONGEST_BYTES_PER_CONTAINER: usize = 48 << 10;

    /// The rendered size is in the budget (docs/metrics.md) however long a tenant makes its
    /// names: 100 containers on 8 GPUs whose name, image, compose project and service, pod,
    /// namespace and container name are each 4,096 characters.
    #[test]
    fn tenant_names_at_their_longest_stay_within_the_size_budget() {
        const CONTAINERS: usize = 100;
        const GPUS: u32 = 8;
        let long = |c: char, i: usize| format!("{i:04}{}", c.to_string().repeat(4096));
        let workloads: Vec<_> = (0..CONTAINERS)
            .map(|i| {
                let mut w = full_container(i, GPUS);
                let mut info = (**w.container.as_ref().unwrap()).clone();
                info.name = long('n', i);
                info.image = long('i', i);
                info.compose_project = Some(long('p', i));
                info.compose_service = Some(long('s', i));
                info.kubernetes = Some(crate::model::KubernetesPod {
                    namespace: long('m', i),
                    pod: long('o', i),
                    container: Some(long('c', i)),
                    uid: None,
                });
                w.name = info.name.clone();
                w.container = Some(Arc::new(info));
                w
            })
            .collect();
        let e = Arc::new(Published {
            snapshot: snapshot(1_700_000_000_000, (0..GPUS).map(gpu).collect(), workloads),
            alerts: Vec::new(),
            xid_totals: BTreeMap::new(),
            accounting: Default::default(),
            recent: Default::default(),
        });
        let text = render(&e).expect("render");
        let per_container = text.len() / CONTAINERS;
        eprintln!("{} bytes, {per_container} per container", text.len());
        assert!(
            per_container <= LONGEST_BYTES_PER_CONTAINER,
            "{per_container} bytes a container"
        );
    }

    #[test]
    fn a_megabyte_label_value_is_cut_in_every_series() {
        // Two containers with 1 MiB compose labels made /metrics 17 MB.
        let mut workloads = Vec::new();
        for i in 0..2 {
            let mut w = full_container(i, 1);
            let mut info = (**w.container.as_ref().unwrap()).clone();
            info.compose_service = Some("s".repeat(1 << 20));
            info.name = format!("{}{i}", "n".repeat(1 << 20));
            w.container = Some(Arc::new(info));
            w.name = w.container.as_ref().unwrap().name.clone();
            workloads.push(w);
        }
        let e = Arc::new(Published {
            snapshot: snapshot(1_700_000_000_000, vec![gpu(0)], workloads),
            alerts: Vec::new(),
            xid_totals: BTreeMap::new(),
            accounting: Default::default(),
            recent: Default::default(),
        });
        let text = render(&e).expect("render");
        assert!(text.len() < 200_000, "{} bytes", text.len());
        let cut = format!("compose_service=\"{}…\"", "s".repeat(LABEL_MAX_CHARS - 1));
        assert!(text.contains(&cut));
    }

    #[test]
    fn a_tenants_control_bytes_never_reach_the_exposition() {
        // `curl …/metrics` in a terminal ran the OSC sequence of a pod's namespace.
        let mut w = full_container(0, 1);
        let mut info = (**w.container.as_ref().unwrap()).clone();
        info.kubernetes.as_mut().unwrap().namespace = "ns\x1b]0;pwned\x07\u{9b}2J".into();
        w.container = Some(Arc::new(info));
        let e = Arc::new(Published {
            snapshot: snapshot(1_700_000_000_000, vec![gpu(0)], vec![w]),
            alerts: Vec::new(),
            xid_totals: BTreeMap::new(),
            accounting: Default::default(),
            recent: Default::default(),
        });
        let text = render(&e).expect("render");
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "a control character in /metrics"
        );
        assert!(text.contains(r#"pod_namespace="ns\\u{1b}]0;pwned\\u{7}\\u{9b}2J""#));
    }

    #[test]
    fn renders_conventional_names_units_and_labels() {
        let mut w = container("yolo");
        w.gpu.processes = 1;
        w.gpu.per_gpu.push(WorkloadGpuShare {
            memory_bytes: 3 << 30,
            busy_fraction: Some(0.8),
            split: Some(crate::model::SplitMethod::SoleHolder),
            device_busy_fraction: Some(0.8),
            sm_activity_percent: Some(90.0),
            pids: vec![42],
            ..WorkloadGpuShare::new(0, Some("GPU-00000000".into()))
        });
        let e = Arc::new(Published {
            snapshot: snapshot(1_700_000_000_000, vec![gpu(0)], vec![w]),
            alerts: Vec::new(),
            xid_totals: BTreeMap::from([(0, 2)]),
            accounting: Default::default(),
            recent: Default::default(),
        });
        let text = render(&e).expect("render");
        let line = |prefix: &str| {
            text.lines()
                .find(|l| l.starts_with(prefix))
                .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
                .to_owned()
        };
        assert!(text.contains("# UNIT gpuwatch_gpu_memory_used_bytes bytes"));
        assert!(line("gpuwatch_gpu_memory_used_bytes{").ends_with(" 10737418240.0"));
        assert!(line("gpuwatch_gpu_utilization_ratio{").ends_with(" 0.5"));
        assert!(line("gpuwatch_gpu_xid_errors_total{").ends_with(" 2.0"));
        let mem = line("gpuwatch_container_gpu_memory_bytes{");
        for label in [
            "container_name=\"yolo\"",
            "image=\"trainer:latest\"",
            "compose_service=\"train\"",
            "gpu=\"0\"",
            "uuid=\"GPU-00000000\"",
        ] {
            assert!(mem.contains(label), "{label} in {mem}");
        }
        assert!(!text.contains("pid="), "no PID labels");
        assert!(line("gpuwatch_up{source=\"nvml\"}").ends_with(" 1.0"));
        let build = line("gpuwatch_build_info{");
        assert!(
            build.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION")))
                && build.contains("revision=\""),
            "{build}"
        );
        let rss: f64 = line("process_resident_memory_bytes ")
            .rsplit(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(rss > 1e6, "{rss}");
        assert!(
            text.contains("# TYPE process_cpu_seconds counter"),
            "{text}"
        );
        assert!(text.trim_end().ends_with("# EOF"));
    }

    #[test]
    fn the_text_format_names_a_counters_help_and_type_as_its_samples() {
        let om = "# HELP gpuwatch_gpu_busy_seconds Seconds busy.\n\
                  # TYPE gpuwatch_gpu_busy_seconds counter\n\
                  # UNIT gpuwatch_gpu_busy_seconds seconds\n\
                  gpuwatch_gpu_busy_seconds_total{gpu=\"0\"} 7.0\n\
                  # HELP gpuwatch_gpu_busy_ratio Share busy.\n\
                  # TYPE gpuwatch_gpu_busy_ratio gauge\n\
                  gpuwatch_gpu_busy_ratio{gpu=\"0\"} 0.7\n\
                  # EOF\n";
        assert_eq!(
            to_text_format(om),
            "# HELP gpuwatch_gpu_busy_seconds_total Seconds busy.\n\
             # TYPE gpuwatch_gpu_busy_seconds_total counter\n\
             gpuwatch_gpu_busy_seconds_total{gpu=\"0\"} 7.0\n\
             # HELP gpuwatch_gpu_busy_ratio Share busy.\n\
             # TYPE gpuwatch_gpu_busy_ratio gauge\n\
             gpuwatch_gpu_busy_ratio{gpu=\"0\"} 0.7\n"
        );
        assert!(wants_openmetrics(Some(
            "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"
        )));
        assert!(!wants_openmetrics(Some("text/plain;version=0.0.4")));
        assert!(!wants_openmetrics(None));
    }

    /// Every `gpuwatch_*` name the shipped Prometheus rules and Grafana dashboard use is one this
    /// exporter writes, and docs/metrics.md lists every one it writes.
    #[test]
    fn deploy_and_docs_match_the_exported_metrics() {
        let e = Arc::new(Published {
            snapshot: snapshot(0, vec![], vec![]),
            alerts: Vec::new(),
            xid_totals: BTreeMap::new(),
            accounting: Default::default(),
            recent: Default::default(),
        });
        let text = render(&e).expect("render");
        let mut exported = std::collections::BTreeSet::new();
        for l in text.lines() {
            if let Some(rest) = l.strip_prefix("# TYPE ") {
                let mut it = rest.split(' ');
                let (name, kind) = (it.next().unwrap_or(""), it.next().unwrap_or(""));
                exported.insert(if kind == "counter" {
                    format!("{name}_total")
                } else {
                    name.to_owned()
                });
            }
        }
        let docs = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/metrics.md"),
        )
        .expect("docs/metrics.md");
        for name in &exported {
            assert!(
                docs.contains(&format!("| `{name}` |")),
                "docs/metrics.md does not list {name}"
            );
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
        for file in [
            "prometheus/gpuwatch-rules.yml",
            "grafana/gpuwatch-dashboard.json",
        ] {
            let body = std::fs::read_to_string(root.join(file)).expect(file);
            if file.ends_with(".json") {
                serde_json::from_str::<serde_json::Value>(&body).expect("valid JSON");
            }
            let mut used = 0;
            for (i, _) in body.match_indices("gpuwatch_") {
                let name: String = body[i..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                if name.ends_with('_') {
                    continue; // prose, e.g. "gpuwatch_ prefix"
                }
                used += 1;
                assert!(exported.contains(&name), "{file} uses {name}, not exported");
            }
            assert!(used > 5, "{file} references the metrics");
        }
    }
}
