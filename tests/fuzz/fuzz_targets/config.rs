//! The config file and its error locator: any text gives a config or an error whose line is
//! within the text, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|text: &str| {
    let path = Path::new("fuzz.yaml");
    if let Err(gpuwatch::config::ConfigError::Invalid { line, .. }) =
        gpuwatch::config::Config::parse(text, path)
    {
        // Lines as YAML counts them: LF, CR LF and a lone CR each end one.
        let lines = gpuwatch::config::unix_line_breaks(text).lines().count() as u64;
        assert!(line <= lines + 1, "line {line} of {lines}");
    }
    // The locator alone, for a field named by the input.
    let field = text.lines().next().unwrap_or("").replace(':', ".");
    let _ = gpuwatch::config::invalid_field(text, path, field, "fuzz".into());
});
