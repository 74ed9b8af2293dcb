//! The block family: disk requests from issue to completion, charged to the issuing task.
use crate::TaskKey;

/// A block request in flight, keyed by device and sector.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RequestKey {
    pub sector: u64,
    pub dev: u32,
    pub pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestStart {
    pub issued_ns: u64,
    pub task: TaskKey,
    pub bytes: u64,
}
