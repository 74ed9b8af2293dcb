//! Renderings of a snapshot.
pub mod table;
