//! Renderings of a snapshot.
pub mod csv;
pub mod table;
