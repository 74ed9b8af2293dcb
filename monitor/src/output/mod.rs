//! Renderings of a snapshot.
pub mod csv;
pub mod escape;
pub mod plot;
pub mod process_metrics;
pub mod prometheus;
pub mod report;
pub mod table;

/// RFC 3339 (UTC) of a Unix time in milliseconds; empty if out of range.
pub fn rfc3339(unix_ms: u64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(unix_ms) * 1_000_000)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

/// Escapes text for HTML element content.
pub fn html_escape(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
