//! The layering rules of docs/architecture.md, held by reading the sources: what each layer
//! may name with `crate::`. A rule broken here is a data flow that runs the wrong way.
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../monitor/src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level modules a file names through `crate::` (in `use` lines and paths alike).
fn named_modules(file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap();
    let mut names = Vec::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `use crate::{a, b::c}`: every top-level name in the group
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                names.push(name);
            }
        } else {
            names.push(
                rest.chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect(),
            );
        }
    }
    names.retain(|n| !n.is_empty());
    names.sort();
    names.dedup();
    names
}

/// Every file under `layer` (a module folder or file, relative to src/) names only `allowed`.
fn layer_names_only(layer: &str, allowed: &[&str]) {
    let root = src().join(layer);
    let mut files = Vec::new();
    if root.is_dir() {
        rust_files(&root, &mut files);
    } else {
        files.push(root.with_extension("rs"));
    }
    assert!(!files.is_empty(), "no sources under {layer}");
    let own = layer.split('/').next().unwrap();
    for file in files {
        for name in named_modules(&file) {
            assert!(
                name == own || allowed.contains(&name.as_str()),
                "{} names crate::{name}: the {layer} layer may name only {allowed:?}",
                file.display()
            );
        }
    }
}

#[test]
fn the_model_and_the_units_import_nothing_above_them() {
    layer_names_only("model", &[]);
    layer_names_only("units", &[]);
    layer_names_only("field_error", &[]);
}

#[test]
fn sources_never_name_the_sampler_analysis_health_or_outputs() {
    layer_names_only("sources", &["model", "units", "events", "caps"]);
}

#[test]
fn the_sampler_assembles_facts_and_judges_nothing() {
    layer_names_only(
        "sampler",
        &[
            "model",
            "units",
            "sources",
            "events",
            "heartbeat",
            "field_error",
        ],
    );
}

/// The sampler asks its sources and joins: every read of `/proc`, cgroupfs or any other file is
/// a source's (`sources/host/` for the host's kernel), so a new source is a folder of its own
/// and the sampler's rounds can be tested without a filesystem.
#[test]
fn the_sampler_does_no_io_of_its_own() {
    let mut files = Vec::new();
    rust_files(&src().join("sampler"), &mut files);
    assert!(!files.is_empty());
    let io = [
        "std::fs",
        "libc::",
        "LiveFile",
        "File::open",
        ".exists()",
        "read_dir(",
        "read_to_string(",
    ];
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            for call in io {
                assert!(
                    !line.contains(call),
                    "{}:{}: `{call}` in the sampler; read it through a source (sources/host/)",
                    file.display(),
                    n + 1
                );
            }
        }
    }
}

/// The error type of every `Result<…>` written in `text`, whatever the lines it spans.
fn result_error_types(text: &str) -> Vec<String> {
    let code: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = Vec::new();
    let mut rest = code.as_str();
    while let Some(i) = rest.find("Result<") {
        rest = &rest[i + "Result<".len()..];
        let (mut depth, mut commas, mut end) = (1, Vec::new(), None);
        for (j, c) in rest.char_indices() {
            match c {
                '<' | '(' | '[' => depth += 1,
                '>' | ')' | ']' => depth -= 1,
                ',' if depth == 1 => commas.push(j),
                _ => {}
            }
            if depth == 0 {
                end = Some(j);
                break;
            }
        }
        let Some(end) = end else { break };
        // The last argument, or the one before a trailing comma.
        let mut bounds: Vec<usize> = commas;
        bounds.push(end);
        if let [.., a, b] = bounds[..] {
            let last = rest[a + 1..b].trim();
            let error = match (last.is_empty(), bounds.len()) {
                (true, n) if n >= 3 => rest[bounds[n - 3] + 1..a].trim(),
                _ => last,
            };
            out.push(error.to_owned());
        }
    }
    out
}

/// Errors are types that say what failed (thiserror in the library), never bare text.
#[test]
fn no_result_in_the_product_carries_its_error_as_a_string() {
    assert_eq!(
        result_error_types("fn f() -> Result<\n    HashMap<String, String>,\n    String,\n> {}"),
        ["String"]
    );
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for error in result_error_types(&text) {
            assert!(
                error != "String" && error != "&'static str" && error != "&str",
                "{}: a Result whose error is {error}; give it an error type",
                file.display()
            );
        }
    }
}

#[test]
fn the_analysis_reads_the_model_only() {
    layer_names_only("analysis", &["model", "units", "field_error"]);
}

#[test]
fn health_judges_snapshots_and_names_no_source_output_or_config_file() {
    layer_names_only("health", &["model", "units", "field_error", "analysis"]);
}

#[test]
fn nothing_below_the_runtime_names_it() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let top = [
        src().join("runtime"),
        src().join("cli"),
        src().join("main.rs"),
    ];
    for file in files
        .iter()
        .filter(|f| !top.iter().any(|t| f.starts_with(t)))
    {
        assert!(
            !named_modules(file)
                .iter()
                .any(|n| n == "runtime" || n == "cli"),
            "{} names the runtime or the command line, which sit above every stage",
            file.display()
        );
    }
}

#[test]
fn the_reader_of_the_rules_finds_what_it_checks() {
    // The scanner itself: a file naming `crate::{a, b::c}` and `crate::d::e` names a, b and d.
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("x.rs");
    std::fs::write(&f, "use crate::{a, b::c};\nfn f() { crate::d::e(); }\n").unwrap();
    assert_eq!(named_modules(&f), ["a", "b", "d"]);
}

/// The doctor's registry names the conditions; no condition, nor the check they share, nor the
/// doctor's configuration names the registry back (each condition's levels sit beside its alert
/// rule, and the registry gathers them): no import circle in `health/`.
#[test]
fn the_conditions_never_name_the_doctors_registry() {
    let health = src().join("health");
    let mut files = vec![health.join("check.rs"), health.join("doctor_config.rs")];
    rust_files(&health.join("conditions"), &mut files);
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            assert!(
                !code.contains("doctor::") && !code.ends_with("doctor;"),
                "{}:{}: {line}",
                file.display(),
                n + 1
            );
        }
    }
}
