//! `gpuwatch plot` and `gpuwatch report` on a real recording: a real container, the fake GPU
//! warming up, an alert rule firing and resolving during the recording.

use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use support::*;

fn gpuwatch(args: &[&str], scenario: Option<&Path>) -> std::process::Output {
    let mut cmd = Command::new(support::gpuwatch_bin());
    cmd.args(args).env("NO_COLOR", "1");
    if let Some(s) = scenario {
        cmd.env("GPUWATCH_NVML_LIB", fake_nvml_lib())
            .env("FAKE_NVML_SCENARIO", s);
    }
    cmd.output().unwrap()
}

/// Decodes a PNG; returns (width, height, share of pixels that are not white, distinct colours).
fn png_stats(path: &Path) -> (u32, u32, f64, usize) {
    let decoder = png::Decoder::new(std::fs::File::open(path).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let px = info.color_type.samples();
    let pixels: Vec<&[u8]> = buf[..info.buffer_size()].chunks(px).collect();
    let non_white = pixels.iter().filter(|p| p[..3] != [255, 255, 255]).count();
    let mut colours: Vec<[u8; 3]> = pixels.iter().map(|p| [p[0], p[1], p[2]]).collect();
    colours.sort_unstable();
    colours.dedup();
    (
        info.width,
        info.height,
        non_white as f64 / pixels.len() as f64,
        colours.len(),
    )
}

/// How many pixels of `path` are exactly `rgb`: a series drawn in its colour leaves many.
fn pixels_of(path: &Path, rgb: [u8; 3]) -> usize {
    let decoder = png::Decoder::new(std::fs::File::open(path).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    buf[..info.buffer_size()]
        .chunks(info.color_type.samples())
        .filter(|p| p[..3] == rgb)
        .count()
}

#[test]
fn plots_and_reports_a_real_recording() {
    require_root();
    let c = Container::start(
        &unique("plot"),
        &[("com.docker.compose.service", "trainer")],
        "sleep 3600",
    );
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.json");
    let (pid, path) = (c.pid, scenario.clone());
    let write = move |temp: u32, mem_gib: u64| {
        let s = json!({"devices": [{"uuid": "GPU-plot", "temperature": temp,
            "processes": [{"pid": pid, "used_memory_bytes": mem_gib * GIB, "sm_util": 70}]}]});
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, serde_json::to_vec(&s).unwrap()).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    };
    write(50, 10);
    let config = dir.path().join("gpuwatch.yaml");
    std::fs::write(
        &config,
        "alerts:\n  rules:\n    gpu_temperature_high: {above_celsius: 83, for: 0s}\n",
    )
    .unwrap();
    let csv = dir.path().join("gpu_log.csv");
    // The GPU heats past 83 °C and cools again while recording; memory climbs.
    let script = std::thread::spawn({
        move || {
            for (temp, mem) in [(60, 12), (75, 14), (86, 16), (88, 18), (70, 18), (65, 18)] {
                std::thread::sleep(Duration::from_millis(700));
                write(temp, mem);
            }
        }
    });
    let out = gpuwatch(
        &[
            "-c",
            config.to_str().unwrap(),
            "record",
            "--interval",
            "250ms",
            "--duration",
            "5s",
            "-o",
            csv.to_str().unwrap(),
        ],
        Some(&scenario),
    );
    script.join().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&csv).unwrap();
    assert!(
        text.lines()
            .any(|l| l.contains(",alert,") && l.contains("gpu_temperature_high")),
        "alert rows recorded:\n{text}"
    );

    // plot: real PNG and SVG files, drawn, with text.
    let plots = dir.path().join("plots");
    let out = gpuwatch(
        &["plot", csv.to_str().unwrap(), "-o", plots.to_str().unwrap()],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let gpu_png = plots.join("gpu0-temperature-memory.png");
    let (w, h, ink, colours) = png_stats(&gpu_png);
    assert_eq!((w, h), (1200, 500));
    assert!(ink > 0.02 && colours > 20, "ink {ink}, {colours} colours");
    let container_png = plots.join(format!("container-{}.png", c.name));
    let (w, h, ink, _) = png_stats(&container_png);
    assert_eq!((w, h), (1200, 900));
    assert!(ink > 0.05, "GPU memory area and verdict bands drawn: {ink}");
    // The data, not only axes and titles: each series in its own colour. GPU chart: the
    // temperature line (red) and the memory line (blue); container chart: the GPU busy line
    // (blue) and the GPU memory area's border (green).
    for (png, rgb, what) in [
        (&gpu_png, [214, 39, 40], "temperature line"),
        (&gpu_png, [31, 119, 180], "memory line"),
        (&container_png, [31, 119, 180], "GPU busy line"),
        (&container_png, [44, 160, 44], "GPU memory area"),
    ] {
        let n = pixels_of(png, rgb);
        assert!(
            n > 200,
            "{what}: {n} pixels of {rgb:?} in {}",
            png.display()
        );
    }
    // GPU-hours held, busy and idle by cause: one bar, the busy part in its blue (the fake
    // GPU is 70 % busy with this container's work).
    let held_png = plots.join("gpu-hours-by-cause.png");
    let (w, _, ink, _) = png_stats(&held_png);
    assert_eq!(w, 1200);
    assert!(ink > 0.05, "bars drawn: {ink}");
    let busy_px = pixels_of(&held_png, [31, 119, 180]);
    assert!(busy_px > 2000, "busy segment: {busy_px} pixels");
    let svg = std::fs::read_to_string(plots.join("gpu0-temperature-memory.svg")).unwrap();
    assert!(svg.contains("<svg") && svg.contains("Temperature") && svg.contains("<polyline"));
    // The temperature line is a polyline in its colour with a point per GPU sample.
    let line = svg
        .split("<polyline")
        .skip(1)
        .find(|p| p.contains("#D62728"))
        .unwrap_or_else(|| panic!("no temperature polyline in\n{svg}"));
    let points = line
        .split("points=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap();
    assert!(points.split_whitespace().count() >= 10, "{points}");

    // report: JSON figures, Markdown with the charts beside it, self-contained HTML.
    let out = gpuwatch(&["report", csv.to_str().unwrap(), "--format", "json"], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mine = r["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == c.name.as_str())
        .expect("the container is in the report");
    assert_eq!(mine["compose_service"], "trainer");
    assert_eq!(mine["gpus"], json!([0]));
    let hours = mine["gpu_hours"].as_f64().unwrap();
    assert!(
        (hours * 3600.0 - 5.0).abs() < 1.5,
        "about 5 GPU-seconds: {hours}"
    );
    assert!(mine["peak_gpu_memory_bytes"].as_f64().unwrap() >= (16 * GIB) as f64);
    assert_eq!(mine["alerts"]["gpu_temperature_high"]["fired"], 1);
    assert_eq!(mine["alerts"]["gpu_temperature_high"]["resolved"], 1);
    assert_eq!(r["gpus"][0]["peak_temperature_celsius"], 88.0);
    // Busy and idle GPU-hours by cause: the fake GPU is 70 % busy with its work; the advice
    // of its verdict, written where the verdict first came, is in the report.
    let busy = mine["busy_gpu_hours"].as_f64().unwrap();
    let idle: f64 = mine["idle_gpu_hours"]
        .as_object()
        .unwrap()
        .values()
        .filter_map(Value::as_f64)
        .sum();
    assert!(busy + idle <= hours + 1e-9, "{mine:#}");
    assert!((busy / (busy + idle) - 0.7).abs() < 0.1, "{mine:#}");
    assert!(
        mine["advice"].as_str().is_some_and(|a| a.len() > 20),
        "{mine:#}"
    );
    assert!(text.lines().next().unwrap().contains(",advice,"));

    let md = dir.path().join("report.md");
    let out = gpuwatch(
        &["report", csv.to_str().unwrap(), "-o", md.to_str().unwrap()],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&md).unwrap();
    assert!(
        text.find("## Findings") < text.find("## Containers"),
        "{text}"
    );
    let link = format!("](report.md-plots/container-{}.png)", c.name);
    assert!(text.contains(&link), "{text}");
    assert!(dir
        .path()
        .join(format!("report.md-plots/container-{}.png", c.name))
        .exists());
    let html = dir.path().join("report.html");
    // The charts go through a private temporary directory: where another user planted the old
    // predictable name (`gpuwatch-report-<pid>`, here for every pid this host can give, up to
    // 65,536) nothing is written through it, and nothing is left behind.
    let tmp = tempfile::tempdir().unwrap();
    let planted = tempfile::tempdir().unwrap();
    let pid_max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let links = pid_max.min(65_536);
    for pid in 1..=links {
        let _ = std::os::unix::fs::symlink(
            planted.path(),
            tmp.path().join(format!("gpuwatch-report-{pid}")),
        );
    }
    let out = Command::new(support::gpuwatch_bin())
        .args(["report", csv.to_str().unwrap(), "--format", "html", "-o"])
        .arg(&html)
        .env("TMPDIR", tmp.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_dir(planted.path()).unwrap().count(),
        0,
        "nothing written through a planted link"
    );
    assert_eq!(
        std::fs::read_dir(tmp.path()).unwrap().count(),
        links as usize,
        "only the planted links are left in TMPDIR"
    );
    let page = std::fs::read_to_string(&html).unwrap();
    assert_eq!(
        page.matches("<svg").count(),
        3,
        "the three charts inlined: GPU, container, GPU-hours by cause"
    );
    assert!(
        !page.contains("src=\""),
        "self-contained: no external files"
    );

    // A broken recording: the file and line are named.
    let recorded = std::fs::read_to_string(&csv).unwrap();
    std::fs::write(&csv, text_with_bad_cell(&recorded, "hot")).unwrap();
    let out = gpuwatch(&["report", csv.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("gpu_log.csv: line 2: column temperature_celsius"),
        "{err}"
    );
    // An infinite value (which once made the chart's axis loop forever) is refused at once.
    std::fs::write(&csv, text_with_bad_cell(&recorded, "1e309")).unwrap();
    let started = std::time::Instant::now();
    let mut child = Command::new(support::gpuwatch_bin())
        .args(["plot", csv.to_str().unwrap(), "-o"])
        .arg(dir.path().join("inf-plots"))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("plot still running after 30 s on an infinite value");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("line 2: column temperature_celsius: \"1e309\" is not a finite number"),
        "{err}"
    );
}

/// The recording with the first GPU row's temperature replaced by text.
fn text_with_bad_cell(csv: &str, cell: &str) -> String {
    let mut lines: Vec<String> = csv.lines().map(str::to_owned).collect();
    let header: Vec<&str> = lines[0].split(',').collect();
    let col = header
        .iter()
        .position(|h| *h == "temperature_celsius")
        .unwrap();
    let mut cells: Vec<String> = lines[1].split(',').map(str::to_owned).collect();
    cells[col] = cell.into();
    lines[1] = cells.join(",");
    lines.join("\n") + "\n"
}

/// A real recording of a container on a fake GPU drawing 300 W at 40 % busy: `report` charges
/// it the GPU's energy (all of it: it holds the GPU alone), 60 % of it idle, and prices both.
#[test]
fn report_charges_the_gpus_energy_to_its_holder_and_prices_it() {
    require_root();
    let c = Container::start(&unique("energy"), &[], "sleep 3600");
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.json");
    std::fs::write(
        &scenario,
        serde_json::to_vec(&json!({"devices": [{"uuid": "GPU-energy",
            "utilization_gpu": 40, "power_mw": 300_000,
            "processes": [{"pid": c.pid, "used_memory_bytes": GIB, "sm_util": 40}]}]}))
        .unwrap(),
    )
    .unwrap();
    let config = dir.path().join("gpuwatch.yaml");
    std::fs::write(
        &config,
        "prices:\n  per_gpu_hour: 3.6\n  per_kwh: 1000\n  currency: EUR\n",
    )
    .unwrap();
    let csv = dir.path().join("run.jsonl");
    let cfg = config.to_str().unwrap();
    let out = gpuwatch(
        &[
            "-c",
            cfg,
            "record",
            "--interval",
            "500ms",
            "--duration",
            "4s",
            "--format",
            "jsonl",
            "-o",
            csv.to_str().unwrap(),
        ],
        Some(&scenario),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = gpuwatch(
        &["-c", cfg, "report", "--json", csv.to_str().unwrap()],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();

    // The GPU: 300 W over the rows' windows.
    let windows: f64 = std::fs::read_to_string(&csv)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["window_seconds"]
                .as_f64()
                .unwrap_or(0.0)
        })
        .sum();
    let gpu_kwh = r["gpus"][0]["energy_kwh"].as_f64().unwrap();
    let want = 300.0 * windows / 3.6e6;
    assert!(
        (gpu_kwh / want - 1.0).abs() < 1e-9,
        "{gpu_kwh} kWh for {want}"
    );

    let mine = r["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == c.name.as_str())
        .unwrap();
    let kwh = mine["energy_kwh"].as_f64().unwrap();
    assert!(
        (kwh / gpu_kwh - 1.0).abs() < 1e-6,
        "{kwh} of the GPU's {gpu_kwh}"
    );
    let idle: f64 = mine["idle_energy_kwh"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_f64().unwrap())
        .sum();
    assert!((idle / kwh - 0.6).abs() < 0.05, "idle {idle} of {kwh} kWh");
    let cost = &mine["cost"];
    assert_eq!(cost["currency"], "EUR");
    let held = mine["gpu_hours"].as_f64().unwrap() * 3.6 + kwh * 1000.0;
    assert!(
        (cost["held"].as_f64().unwrap() - held).abs() < 1e-9,
        "{cost}"
    );
    let idle_hours: f64 = mine["idle_gpu_hours"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_f64().unwrap())
        .sum();
    let idle_cost = idle_hours * 3.6 + idle * 1000.0;
    assert!(
        (cost["idle"].as_f64().unwrap() - idle_cost).abs() < 1e-9,
        "{cost}"
    );
}
