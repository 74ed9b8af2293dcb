//! Renderings of a snapshot.
pub mod accounting;
pub mod compare;
pub mod escape;
pub mod plot;
pub mod process_metrics;
pub mod prometheus;
pub mod published;
pub mod recent;
pub mod report;
pub mod table;
pub mod web_page;
pub mod why;

/// Escapes text for HTML element content.
pub fn html_escape(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
