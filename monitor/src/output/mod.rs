//! Renderings of a snapshot.
pub mod csv;
pub mod prometheus;
pub mod table;
