//! `gpuwatch plot`, `gpuwatch report` and `gpuwatch compare`: charts, summaries and
//! comparisons from recordings (CSV or JSON Lines).
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use std::io::Write;
use std::path::PathBuf;

#[derive(Args)]
pub(crate) struct PlotArgs {
    /// A CSV recording (`gpuwatch record -o gpu_log.csv`).
    pub(crate) recording: PathBuf,
    /// Where to write the charts (created if missing).
    #[arg(long, short, default_value = "plots")]
    pub(crate) output: PathBuf,
    /// Image formats.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [gpuwatch::output::plot::Format::Png, gpuwatch::output::plot::Format::Svg])]
    pub(crate) format: Vec<gpuwatch::output::plot::Format>,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum ReportFormat {
    /// Markdown, with PNG charts written beside it (see --plots).
    Markdown,
    /// One self-contained HTML page, charts inlined as SVG.
    Html,
    Json,
}

#[derive(Args)]
pub(crate) struct ReportArgs {
    /// A CSV recording (`gpuwatch record -o gpu_log.csv`).
    pub(crate) recording: PathBuf,
    #[arg(long, value_enum, default_value_t = ReportFormat::Markdown)]
    pub(crate) format: ReportFormat,
    /// Short for --format json.
    #[arg(long, conflicts_with = "format")]
    pub(crate) json: bool,
    /// Where to write the report; `-` is standard output.
    #[arg(long, short, default_value = "-")]
    pub(crate) output: PathBuf,
    /// Where the Markdown report's PNG charts go (default: `<output>-plots`, or `report-plots`
    /// when writing to standard output).
    #[arg(long)]
    pub(crate) plots: Option<PathBuf>,
}

/// Reads a recording, saying when its last row was cut off (and left out).
fn read(path: &std::path::Path) -> Result<gpuwatch::recording::Recording> {
    let rec = gpuwatch::recording::read(path)?;
    if let Some(line) = rec.cut_off_line {
        tracing::warn!(
            "{}: line {line} is cut off (the recording was interrupted there): left out, the \
             rows before it kept",
            path.display()
        );
    }
    Ok(rec)
}

pub(crate) fn plot(args: &PlotArgs) -> Result<()> {
    let rec = read(&args.recording)?;
    let summary = gpuwatch::recording::summary::summarise(&rec, "", &Default::default());
    let files =
        gpuwatch::output::plot::plot_all(&rec, &summary.containers, &args.output, &args.format)
            .with_context(|| format!("plotting {}", args.recording.display()))?;
    // Made while NVML was down: containers, but no chart is about any of them.
    if files.is_empty() {
        bail!(
            "{}: the recording has no GPU data to plot: {} workload(s) in it, none holding a \
             GPU, and no GPU rows (was NVML down while it recorded?)",
            args.recording.display(),
            rec.workloads.len()
        );
    }
    let mut stdout = std::io::stdout().lock();
    for f in files {
        writeln!(stdout, "{}", f.display()).context("writing to stdout")?;
    }
    Ok(())
}

pub(crate) fn report(
    args: &ReportArgs,
    prices: &gpuwatch::recording::summary::Prices,
) -> Result<()> {
    use gpuwatch::output::plot::{self, Format};
    use gpuwatch::output::report;
    let rec = read(&args.recording)?;
    let name = args.recording.file_name().map_or_else(
        || args.recording.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let summary = gpuwatch::recording::summary::summarise(&rec, &name, prices);
    let to_stdout = args.output.as_os_str() == "-";
    let chart_key = |file: &std::path::Path| {
        file.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    // `container-<name>` / `gpu<N>-temperature-memory` → the key the report asks for.
    let key_for = |k: &str| {
        if k == report::HELD_CHART {
            return plot::HELD_CHART_FILE.to_owned();
        }
        if let Some(rest) = k.strip_prefix("gpu") {
            if rest.chars().all(|c| c.is_ascii_digit()) {
                return format!("{k}-temperature-memory");
            }
        }
        format!("container-{}", plot::file_name(k))
    };
    let format = if args.json {
        ReportFormat::Json
    } else {
        args.format
    };
    let text = match format {
        ReportFormat::Json => {
            serde_json::to_string_pretty(&summary).context("encoding the report")? + "\n"
        }
        ReportFormat::Markdown => {
            let plots = args.plots.clone().unwrap_or_else(|| {
                if to_stdout {
                    PathBuf::from("report-plots")
                } else {
                    let mut p = args.output.clone().into_os_string();
                    p.push("-plots");
                    PathBuf::from(p)
                }
            });
            let files = plot::plot_all(&rec, &summary.containers, &plots, &[Format::Png])?;
            // Links relative to where the Markdown lands.
            let base = if to_stdout {
                PathBuf::from(".")
            } else {
                args.output
                    .parent()
                    .map(std::path::Path::to_owned)
                    .unwrap_or_default()
            };
            report::markdown(&summary, &|k| {
                let want = key_for(k);
                files
                    .iter()
                    .find(|f| chart_key(f) == want)
                    .map(|f| f.strip_prefix(&base).unwrap_or(f).display().to_string())
            })
        }
        ReportFormat::Html => {
            let dir = private_temp_dir()?;
            let files = plot::plot_all(&rec, &summary.containers, dir.path(), &[Format::Svg])?;
            let page = report::html(&summary, &|k| {
                let want = key_for(k);
                let f = files.iter().find(|f| chart_key(f) == want)?;
                let svg = std::fs::read_to_string(f).ok()?;
                // Inline: drop the XML declaration, keep the <svg> element.
                Some(svg[svg.find("<svg").unwrap_or(0)..].to_owned())
            });
            page
        }
    };
    if to_stdout {
        std::io::stdout()
            .write_all(text.as_bytes())
            .context("writing the report")?;
    } else {
        std::fs::write(&args.output, text)
            .with_context(|| format!("writing {}", args.output.display()))?;
    }
    Ok(())
}

#[derive(Args)]
pub(crate) struct CompareArgs {
    /// The recording before the change (`gpuwatch record`, CSV or JSON Lines).
    pub(crate) before: PathBuf,
    /// The recording after it.
    pub(crate) after: PathBuf,
    /// A Markdown table for people, JSON for programs.
    #[arg(long, value_enum, default_value_t = CompareFormat::Markdown)]
    pub(crate) format: CompareFormat,
    /// Short for --format json.
    #[arg(long, conflicts_with = "format")]
    pub(crate) json: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum CompareFormat {
    Markdown,
    Json,
}

pub(crate) fn compare(args: &CompareArgs) -> Result<()> {
    use gpuwatch::output::compare;
    let summary = |path: &std::path::Path| -> Result<gpuwatch::recording::summary::Report> {
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        Ok(gpuwatch::recording::summary::summarise(
            &read(path)?,
            &name,
            &Default::default(),
        ))
    };
    let c = compare::compare(&summary(&args.before)?, &summary(&args.after)?);
    let text = if args.json || args.format == CompareFormat::Json {
        serde_json::to_string_pretty(&c).context("encoding the comparison")? + "\n"
    } else {
        compare::markdown(&c)
    };
    std::io::stdout()
        .write_all(text.as_bytes())
        .context("writing the comparison")
}

/// A fresh private directory for intermediate files.
pub(crate) fn private_temp_dir() -> Result<tempfile::TempDir> {
    // mkdtemp: a name no other user can guess or plant first, mode 0700, removed on drop.
    tempfile::Builder::new()
        .prefix("gpuwatch-report-")
        .tempdir()
        .context("creating a private temporary directory")
}
