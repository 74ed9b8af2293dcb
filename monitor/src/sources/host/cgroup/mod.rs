//! Everything cgroup: which hierarchies the host has ([`layout`]), which workload a cgroup path
//! belongs to ([`classify`]), a process's memberships ([`membership`]), where a cgroup namespace of
//! the agent's own is rooted on the host ([`namespace`]) and a workload's CPU and memory counters
//! ([`stats`]).
pub mod classify;
pub mod layout;
pub mod membership;
pub mod namespace;
pub mod pressure;
pub mod stats;

pub use classify::classify;
pub use layout::CgroupLayout;
pub use membership::CgroupMembership;
