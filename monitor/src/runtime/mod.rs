//! The runtime: starts the sources ([`Agent`]) and runs the one loop of rounds every command
//! shares ([`rounds`]); [`daemon`] adds the alert rules and notifications for `watch` and `serve`.
pub mod agent;
pub mod daemon;
pub mod privileges;
mod rounds;
pub mod socket_access;

pub use agent::{Agent, AgentConfig};
pub use rounds::{rounds, Schedule};
