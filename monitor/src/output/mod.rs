//! Renderings of a snapshot.
pub mod csv;
pub mod plot;
pub mod prometheus;
pub mod report;
pub mod table;
