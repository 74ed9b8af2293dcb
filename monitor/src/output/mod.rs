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
