//! `gpuwatch plot`: charts from a recording, as PNG and SVG.
//!
//! - Per GPU, the chart of the GPU temperature and memory article: temperature on the left axis
//!   against memory use on the right, over time.
//! - Per container, three panels on one time axis:
//!   - GPU busy share, with the background shaded by the verdict of each sample;
//!   - GPU memory;
//!   - the loader-stall share (input-bound).
//!
//! Text is drawn with a bundled DejaVu Sans (through ab_glyph), so a machine without desktop
//! fonts renders the same PNGs. SVGs name the family and leave the glyphs to the viewer.
use crate::model::VerdictKind;
use crate::recording::{Recording, WorkloadSeries};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};

static FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");
const FAMILY: &str = "sans-serif";

#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("drawing {path}: {message}")]
    Draw { path: PathBuf, message: String },
    #[error("creating {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the recording has no {0} to plot")]
    Nothing(&'static str),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Png,
    Svg,
}

fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // A bundled, valid TTF: failure here is a build defect, reported on first draw.
        let _ = plotters::style::register_font(FAMILY, FontStyle::Normal, FONT);
    });
}

/// Writes every chart of `rec` into `dir`; returns the files written. `containers` is `rec`
/// summarised ([`crate::recording::summary::summarise`]): its GPU-hours by cause are the stacked bars, and a
/// caller that has the summary already (`report`) passes it rather than reading `rec` twice.
pub fn plot_all(
    rec: &Recording,
    containers: &[crate::recording::summary::ContainerSummary],
    dir: &Path,
    formats: &[Format],
) -> Result<Vec<PathBuf>, PlotError> {
    register_font();
    std::fs::create_dir_all(dir).map_err(|source| PlotError::Io {
        path: dir.to_owned(),
        source,
    })?;
    if rec.gpus.is_empty() && rec.workloads.is_empty() {
        return Err(PlotError::Nothing("GPU or container"));
    }
    let mut written = Vec::new();
    for &index in rec.gpus.keys() {
        for &f in formats {
            let path = dir.join(format!("gpu{index}-temperature-memory.{}", extension(f)));
            render(&path, f, (1200, 500), &GpuChart { rec, index })?;
            written.push(path);
        }
    }
    let bars = held_bars(containers);
    if !bars.is_empty() {
        for &f in formats {
            let path = dir.join(format!("{HELD_CHART_FILE}.{}", extension(f)));
            let size = (1200, 160 + 50 * bars.len() as u32);
            render(&path, f, size, &HeldChart { bars: &bars })?;
            written.push(path);
        }
    }
    for w in rec.workloads.values() {
        if w.samples.iter().all(|s| s.gpus.is_empty()) {
            continue; // no GPU: nothing this chart is about
        }
        for &f in formats {
            let path = dir.join(format!("container-{}.{}", file_name(&w.name), extension(f)));
            render(&path, f, (1200, 900), &ContainerChart { rec, w })?;
            written.push(path);
        }
    }
    Ok(written)
}

fn extension(f: Format) -> &'static str {
    match f {
        Format::Png => "png",
        Format::Svg => "svg",
    }
}

/// A container name as a file name: `/`, spaces and the like become `_`.
pub fn file_name(name: &str) -> String {
    let s: String = name
        .trim_start_matches('/')
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() {
        "unnamed".into()
    } else {
        s
    }
}

type DrawResult = Result<(), Box<dyn std::error::Error>>;

/// A chart, drawable on any plotters backend.
trait Chart {
    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> DrawResult
    where
        DB::ErrorType: 'static;
}

struct GpuChart<'r> {
    rec: &'r Recording,
    index: u32,
}

impl Chart for GpuChart<'_> {
    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        gpu_chart(self.rec, self.index, root)
    }
}

struct ContainerChart<'r> {
    rec: &'r Recording,
    w: &'r WorkloadSeries,
}

impl Chart for ContainerChart<'_> {
    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        container_chart(self.rec, self.w, root)
    }
}

fn render(
    path: &Path,
    format: Format,
    size: (u32, u32),
    chart: &impl Chart,
) -> Result<(), PlotError> {
    let err = |e: &dyn std::fmt::Display| PlotError::Draw {
        path: path.to_owned(),
        message: e.to_string(),
    };
    match format {
        Format::Png => {
            let root = BitMapBackend::new(path, size).into_drawing_area();
            root.fill(&WHITE).map_err(|e| err(&e))?;
            chart.draw(root.clone()).map_err(|e| err(&e))?;
            root.present().map_err(|e| err(&e))
        }
        Format::Svg => {
            let root = SVGBackend::new(path, size).into_drawing_area();
            root.fill(&WHITE).map_err(|e| err(&e))?;
            chart.draw(root.clone()).map_err(|e| err(&e))?;
            root.present().map_err(|e| err(&e))
        }
    }
}

/// Seconds since the recording began, or minutes for long recordings, over a span of it: the
/// whole recording for a GPU, a container's own life for its chart.
struct TimeAxis {
    start_ms: u64,
    divisor: f64,
    label: &'static str,
    min: f64,
    max: f64,
}

impl TimeAxis {
    fn of(rec: &Recording) -> Self {
        Self::over(rec, rec.first_ms, rec.last_ms)
    }

    /// The axis of `rec`, showing `first_ms` to `last_ms`.
    fn over(rec: &Recording, first_ms: u64, last_ms: u64) -> Self {
        let span = (rec.last_ms.saturating_sub(rec.first_ms)) as f64 / 1000.0;
        let (divisor, label) = if span > 600.0 {
            (60.0, "time since the recording began (min)")
        } else {
            (1.0, "time since the recording began (s)")
        };
        let mut t = Self {
            start_ms: rec.first_ms,
            divisor,
            label,
            min: 0.0,
            max: 0.0,
        };
        t.min = t.x(first_ms);
        t.max = t.x(last_ms).max(t.min + 1e-3);
        t
    }

    fn x(&self, unix_ms: u64) -> f64 {
        unix_ms.saturating_sub(self.start_ms) as f64 / 1000.0 / self.divisor
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.min..self.max
    }
}

fn gpu_chart<DB: DrawingBackend>(
    rec: &Recording,
    index: u32,
    root: DrawingArea<DB, Shift>,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let series = &rec.gpus[&index];
    let t = TimeAxis::of(rec);
    let temps: Vec<(f64, f64)> = series
        .samples
        .iter()
        .filter_map(|s| Some((t.x(s.unix_ms), s.temperature_celsius?)))
        .collect();
    let mem: Vec<(f64, f64)> = series
        .samples
        .iter()
        .filter_map(|s| Some((t.x(s.unix_ms), s.memory_percent()?)))
        .collect();
    let (lo, hi) = temps.iter().fold((f64::MAX, f64::MIN), |(lo, hi), (_, v)| {
        (lo.min(*v), hi.max(*v))
    });
    let (lo, hi) = if temps.is_empty() {
        (20.0, 90.0)
    } else {
        ((lo - 5.0).floor().min(30.0), (hi + 5.0).ceil().max(90.0))
    };
    let title = format!(
        "GPU {index} ({}): temperature and memory use",
        if series.name.is_empty() {
            &series.uuid
        } else {
            &series.name
        }
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FAMILY, 24))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .right_y_label_area_size(60)
        .build_cartesian_2d(t.range(), lo..hi)?
        .set_secondary_coord(t.range(), 0f64..100f64);
    chart
        .configure_mesh()
        .x_desc(t.label)
        .y_desc("Temperature (°C)")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .label_style((FAMILY, 15))
        .axis_desc_style((FAMILY, 16))
        .draw()?;
    chart
        .configure_secondary_axes()
        .y_desc("Memory used (%)")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style((FAMILY, 15))
        .axis_desc_style((FAMILY, 16))
        .draw()?;
    let red = RGBColor(214, 39, 40);
    let blue = RGBColor(31, 119, 180);
    chart
        .draw_series(LineSeries::new(temps, red.stroke_width(2)))?
        .label("GPU temperature (°C)")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], red.stroke_width(2)));
    chart
        .draw_secondary_series(DashedLineSeries::new(mem, 8, 5, blue.stroke_width(2)))?
        .label("Memory used (%)")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], blue.stroke_width(2)));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font((FAMILY, 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// Background colour of a verdict in the busy panel (none for `unknown`, or a label that names
/// no verdict).
fn verdict_color(kind: VerdictKind) -> Option<RGBColor> {
    match kind {
        VerdictKind::InputBoundIo => Some(RGBColor(253, 208, 162)),
        VerdictKind::InputBoundCpu => Some(RGBColor(218, 200, 240)),
        VerdictKind::InputBoundMemory => Some(RGBColor(240, 180, 200)),
        VerdictKind::HostTransfers => Some(RGBColor(166, 206, 227)),
        VerdictKind::HostLaunches => Some(RGBColor(251, 154, 153)),
        VerdictKind::HostCpu => Some(RGBColor(202, 178, 214)),
        VerdictKind::HostSync => Some(RGBColor(178, 223, 138)),
        VerdictKind::Contention => Some(RGBColor(255, 187, 120)),
        VerdictKind::GpuBound => Some(RGBColor(199, 233, 192)),
        VerdictKind::LowSmActivity => Some(RGBColor(255, 237, 160)),
        VerdictKind::Idle => Some(RGBColor(224, 224, 224)),
        VerdictKind::Unknown => None,
    }
}

fn container_chart<DB: DrawingBackend>(
    rec: &Recording,
    w: &WorkloadSeries,
    root: DrawingArea<DB, Shift>,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    // The container's own life: its chart starts at its first sample and ends at its last.
    let first = w.samples.first().map_or(rec.first_ms, |s| s.unix_ms);
    let last = w.samples.last().map_or(rec.last_ms, |s| s.unix_ms);
    let t = TimeAxis::over(rec, first, last);
    let mut title = format!("Container {}", w.name);
    if !w.image.is_empty() {
        title.push_str(&format!(" ({})", w.image));
    }
    if !w.compose_service.is_empty() {
        title.push_str(&format!(", service {}", w.compose_service));
    }
    let root = root.titled(&title, (FAMILY, 24))?;
    let panels = root.split_evenly((3, 1));
    busy_panel(w, &t, &panels[0])?;
    memory_panel(w, &t, &panels[1])?;
    input_bound_panel(w, &t, &panels[2])
}

/// One band per run of equal verdicts, from its first sample to the next run's first, the
/// last ending at the container's last sample.
fn verdict_bands(w: &WorkloadSeries, t: &TimeAxis) -> Vec<(f64, f64, RGBColor)> {
    let mut bands = Vec::new();
    let mut i = 0;
    while i < w.samples.len() {
        let v = w.samples[i].verdict;
        let mut j = i + 1;
        while j < w.samples.len() && w.samples[j].verdict == v {
            j += 1;
        }
        if let Some(c) = v.and_then(verdict_color) {
            let x0 = t.x(w.samples[i].unix_ms);
            let x1 = w.samples.get(j).map_or(t.max, |s| t.x(s.unix_ms));
            bands.push((x0, x1, c));
        }
        i = j;
    }
    bands
}

/// GPU busy, over the verdict bands, with a legend entry per verdict shown.
fn busy_panel<DB: DrawingBackend>(
    w: &WorkloadSeries,
    t: &TimeAxis,
    area: &DrawingArea<DB, Shift>,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let blue = RGBColor(31, 119, 180);
    let mut busy = ChartBuilder::on(area)
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(t.range(), 0f64..100f64)?;
    busy.configure_mesh()
        .y_desc("GPU busy (%)")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .label_style((FAMILY, 14))
        .axis_desc_style((FAMILY, 15))
        .draw()?;
    let bands = verdict_bands(w, t);
    busy.draw_series(
        bands
            .iter()
            .map(|(x0, x1, c)| Rectangle::new([(*x0, 0.0), (*x1, 100.0)], c.filled())),
    )?;
    for kind in VerdictKind::ALL {
        if let Some(c) = verdict_color(kind) {
            if bands.iter().any(|b| b.2 == c) {
                busy.draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())?
                    .label(kind.label())
                    .legend(move |(x, y)| {
                        Rectangle::new([(x, y - 6), (x + 16, y + 6)], c.filled())
                    });
            }
        }
    }
    busy.draw_series(LineSeries::new(
        w.samples
            .iter()
            .filter_map(|s| Some((t.x(s.unix_ms), s.gpu_busy_fraction? * 100.0))),
        blue.stroke_width(2),
    ))?
    .label("GPU busy")
    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], blue.stroke_width(2)));
    busy.configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font((FAMILY, 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

fn memory_panel<DB: DrawingBackend>(
    w: &WorkloadSeries,
    t: &TimeAxis,
    area: &DrawingArea<DB, Shift>,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let green = RGBColor(44, 160, 44);
    let mem: Vec<(f64, f64)> = w
        .samples
        .iter()
        .map(|s| (t.x(s.unix_ms), crate::units::gib(s.gpu_memory_bytes)))
        .collect();
    let top = mem.iter().map(|p| p.1).fold(0.0, f64::max).max(1.0) * 1.15;
    let mut m = ChartBuilder::on(area)
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(t.range(), 0f64..top)?;
    m.configure_mesh()
        .y_desc("GPU memory (GiB)")
        .y_label_formatter(&|v| format!("{v:.1}"))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .label_style((FAMILY, 14))
        .axis_desc_style((FAMILY, 15))
        .draw()?;
    m.draw_series(AreaSeries::new(mem, 0.0, green.mix(0.25)).border_style(green.stroke_width(2)))?;
    Ok(())
}

fn input_bound_panel<DB: DrawingBackend>(
    w: &WorkloadSeries,
    t: &TimeAxis,
    area: &DrawingArea<DB, Shift>,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let orange = RGBColor(255, 127, 14);
    let mut l = ChartBuilder::on(area)
        .margin(10)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(t.range(), 0f64..100f64)?;
    l.configure_mesh()
        .x_desc(t.label)
        .y_desc("Input-bound (%)")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .label_style((FAMILY, 14))
        .axis_desc_style((FAMILY, 15))
        .draw()?;
    l.draw_series(LineSeries::new(
        w.samples
            .iter()
            .filter_map(|s| Some((t.x(s.unix_ms), s.input_bound_share? * 100.0))),
        orange.stroke_width(2),
    ))?;
    Ok(())
}

/// The file stem of the chart of GPU-hours held, busy and idle by cause, per container.
pub const HELD_CHART_FILE: &str = "gpu-hours-by-cause";

/// One container's bar: its name and its GPU-hours, busy first, then idle by verdict, each
/// segment (label, hours, colour).
#[derive(Debug, PartialEq)]
struct HeldBar {
    name: String,
    segments: Vec<(String, f64, RGBColor)>,
}

const BUSY_COLOR: RGBColor = RGBColor(31, 119, 180);
/// Idle under a verdict with no colour of its own (`unknown`).
const UNKNOWN_COLOR: RGBColor = RGBColor(160, 160, 160);

/// The bars of the containers that held GPUs, the most GPU-hours held first.
fn held_bars(containers: &[crate::recording::summary::ContainerSummary]) -> Vec<HeldBar> {
    let mut bars: Vec<HeldBar> = containers
        .iter()
        .map(|c| {
            let mut segments = vec![("busy".to_owned(), c.busy_gpu_hours, BUSY_COLOR)];
            let mut idle: Vec<(&String, &f64)> = c.idle_gpu_hours.iter().collect();
            idle.sort_by(|a, b| b.1.total_cmp(a.1));
            for (label, hours) in idle {
                let color = VerdictKind::ALL
                    .into_iter()
                    .find(|k| k.label() == label.as_str())
                    .and_then(verdict_color)
                    .unwrap_or(UNKNOWN_COLOR);
                segments.push((format!("idle: {label}"), *hours, color));
            }
            segments.retain(|s| s.1 > 0.0);
            HeldBar {
                name: c.name.clone(),
                segments,
            }
        })
        .filter(|b| !b.segments.is_empty())
        .collect();
    let held = |b: &HeldBar| b.segments.iter().map(|s| s.1).sum::<f64>();
    bars.sort_by(|a, b| held(b).total_cmp(&held(a)));
    bars
}

struct HeldChart<'b> {
    bars: &'b [HeldBar],
}

impl Chart for HeldChart<'_> {
    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        held_chart(self.bars, root)
    }
}

/// A horizontal bar per container: its GPU-hours busy, then idle by the verdict of each sample.
fn held_chart<DB: DrawingBackend>(bars: &[HeldBar], root: DrawingArea<DB, Shift>) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let root = root.titled("GPU-hours held: busy, and idle by cause", (FAMILY, 24))?;
    let max = bars
        .iter()
        .map(|b| b.segments.iter().map(|s| s.1).sum::<f64>())
        .fold(0.0, f64::max)
        .max(1e-6);
    let n = bars.len() as f64;
    // The most held at the top: bar i on row n - 1 - i.
    let names: Vec<String> = bars.iter().rev().map(|b| b.name.clone()).collect();
    let mut chart = ChartBuilder::on(&root)
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(200)
        .build_cartesian_2d(0f64..max * 1.3, 0f64..n)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(bars.len() * 2 + 1)
        .y_label_formatter(&|y| {
            let i = y.floor() as usize;
            if (y - i as f64 - 0.5).abs() < 1e-6 {
                names.get(i).map_or(String::new(), |n| truncate(n, 28))
            } else {
                String::new()
            }
        })
        .x_desc("GPU-hours")
        .label_style((FAMILY, 14))
        .axis_desc_style((FAMILY, 15))
        .draw()?;
    let mut shown: Vec<(String, RGBColor)> = Vec::new();
    for (i, b) in bars.iter().enumerate() {
        let mut x = 0.0;
        for (label, hours, color) in &b.segments {
            let row = (bars.len() - 1 - i) as f64;
            let (y0, y1) = (row + 0.2, row + 0.8);
            chart.draw_series(std::iter::once(Rectangle::new(
                [(x, y0), (x + hours, y1)],
                color.filled(),
            )))?;
            x += hours;
            if !shown.iter().any(|s| &s.0 == label) {
                shown.push((label.clone(), *color));
            }
        }
    }
    for (label, color) in shown {
        chart
            .draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())?
            .label(label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 16, y + 6)], color.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .label_font((FAMILY, 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// At most `max` characters of `s`, an ellipsis marking a cut.
fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut t: String = s.chars().take(max - 1).collect();
    t.push('…');
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::WorkloadSample;

    /// A recording of 0–100 s in which the container lives from 20 s to 60 s.
    fn short_lived() -> (Recording, WorkloadSeries) {
        let rec = Recording {
            first_ms: 1_000_000,
            last_ms: 1_100_000,
            ..Default::default()
        };
        let verdicts = [
            VerdictKind::InputBoundIo,
            VerdictKind::InputBoundIo,
            VerdictKind::Unknown,
            VerdictKind::GpuBound,
            VerdictKind::GpuBound,
        ];
        let samples = verdicts
            .iter()
            .enumerate()
            .map(|(i, v)| WorkloadSample {
                unix_ms: 1_020_000 + i as u64 * 10_000,
                verdict: Some(*v),
                ..Default::default()
            })
            .collect();
        let w = WorkloadSeries {
            samples,
            ..Default::default()
        };
        (rec, w)
    }

    #[test]
    fn each_container_gets_a_bar_of_busy_then_idle_by_cause_most_held_first() {
        // 100 one-second samples on one GPU: "io" at 10 % busy, input-bound: I/O for 60 and
        // unknown for 40; "gpu" at 90 %, GPU-bound; "cpu-only" holds no GPU.
        let mut rec = Recording {
            first_ms: 0,
            last_ms: 99_000,
            ..Default::default()
        };
        let series =
            |name: &str, busy: f64, verdict: &dyn Fn(u64) -> VerdictKind, gpus: Vec<u32>| {
                WorkloadSeries {
                    id: name.into(),
                    name: name.into(),
                    samples: (0..100u64)
                        .map(|i| WorkloadSample {
                            unix_ms: i * 1000,
                            gpus: gpus.clone(),
                            gpu_busy_fraction: Some(busy),
                            verdict: Some(verdict(i)),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                }
            };
        let io = |i: u64| {
            if i < 60 {
                VerdictKind::InputBoundIo
            } else {
                VerdictKind::Unknown
            }
        };
        rec.workloads
            .insert("io".into(), series("io", 0.1, &io, vec![0, 1]));
        rec.workloads.insert(
            "gpu".into(),
            series("gpu", 0.9, &|_| VerdictKind::GpuBound, vec![2]),
        );
        rec.workloads.insert(
            "cpu-only".into(),
            series("cpu-only", 0.0, &|_| VerdictKind::Idle, vec![]),
        );
        let bars = held_bars(
            &crate::recording::summary::summarise(&rec, "r", &Default::default()).containers,
        );
        let names: Vec<&str> = bars.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(
            names,
            ["io", "gpu"],
            "two GPUs held outrank one; no GPU, no bar"
        );
        let h = |s: f64| s / 3600.0;
        let io_bar = &bars[0].segments;
        let labels: Vec<&str> = io_bar.iter().map(|s| s.0.as_str()).collect();
        assert_eq!(labels, ["busy", "idle: input-bound: I/O", "idle: unknown"]);
        // 2 GPUs × 100 s: busy 10 %, idle 90 % split 60 / 40 by verdict.
        assert!((io_bar[0].1 - h(20.0)).abs() < 1e-9, "{io_bar:?}");
        assert!((io_bar[1].1 - h(108.0)).abs() < 1e-9, "{io_bar:?}");
        assert!((io_bar[2].1 - h(72.0)).abs() < 1e-9, "{io_bar:?}");
        assert_eq!(io_bar[0].2, BUSY_COLOR);
        assert_eq!(Some(io_bar[1].2), verdict_color(VerdictKind::InputBoundIo));
        assert_eq!(io_bar[2].2, UNKNOWN_COLOR);
        assert_eq!(truncate("a-very-long-container-name", 10), "a-very-lo…");
    }

    #[test]
    fn a_containers_chart_spans_its_own_life_and_its_last_band_ends_with_it() {
        let (rec, w) = short_lived();
        let t = TimeAxis::over(&rec, 1_020_000, 1_060_000);
        assert_eq!(t.range(), 20.0..60.0, "seconds since the recording began");
        let bands = verdict_bands(&w, &t);
        let io = verdict_color(VerdictKind::InputBoundIo).unwrap();
        let gpu = verdict_color(VerdictKind::GpuBound).unwrap();
        // I/O from 20 s to the unknown sample at 40 s; no band for unknown; GPU-bound from 50 s
        // to the container's last sample at 60 s, not to the recording's end.
        assert_eq!(bands, [(20.0, 40.0, io), (50.0, 60.0, gpu)]);
        assert_eq!(TimeAxis::of(&rec).range(), 0.0..100.0);
    }
}
