//! The read-syscall and block-request programs, attached and detached while the agent runs.
//!
//! An attached syscall tracepoint sends every system call of every task on the host through the
//! kernel's slow path, whatever the program then decides (a loader reading 16 KiB files keeps
//! 0.80–0.83 of its throughput with them, empty programs or not), so adaptive tracing keeps
//! them off until a workload needs the evidence.
//!
//! Each start/end pair moves in two steps, one call apart (the sampler makes one a round), so
//! that an end event never meets a start recorded before a gap: attaching, the start programs
//! (`sys_enter_*`, `block_rq_issue`) go first and the end programs a step later, once every read
//! in flight has a fresh start; detaching, the starts go first and the ends a step later, so
//! the reads in flight complete. Only a read blocked across a whole step can still be missed.
use super::{tracepoint, ProbeError};
use crate::model::IoTracing;
use aya::programs::trace_point::TracePointLinkId;
use aya::Ebpf;
use std::path::Path;

struct Point {
    program: &'static str,
    category: &'static str,
    event: String,
}

/// The attachable programs and their links.
pub struct IoLinks {
    starts: Vec<Point>,
    ends: Vec<Point>,
    start_links: Vec<(&'static str, TracePointLinkId)>,
    end_links: Vec<(&'static str, TracePointLinkId)>,
    state: IoTracing,
}

impl IoLinks {
    /// The points for the parts this kernel can trace (`reads`: the read-family syscalls whose
    /// two tracepoints exist under `tracefs`; `disk`: block requests). Nothing is attached yet.
    pub fn new(tracefs: &Path, read_syscalls: &[&str], reads: bool, disk: bool) -> Self {
        let mut starts = Vec::new();
        let mut ends = Vec::new();
        let exists = |s: &str| {
            ["enter", "exit"].iter().all(|w| {
                tracefs
                    .join(format!("events/syscalls/sys_{w}_{s}"))
                    .exists()
            })
        };
        if reads {
            for s in read_syscalls.iter().filter(|s| exists(s)) {
                starts.push(Point {
                    program: "sys_enter_read",
                    category: "syscalls",
                    event: format!("sys_enter_{s}"),
                });
                ends.push(Point {
                    program: "sys_exit_read",
                    category: "syscalls",
                    event: format!("sys_exit_{s}"),
                });
            }
        }
        if disk {
            starts.push(Point {
                program: "block_rq_issue",
                category: "block",
                event: "block_rq_issue".into(),
            });
            ends.push(Point {
                program: "block_rq_complete",
                category: "block",
                event: "block_rq_complete".into(),
            });
        }
        Self {
            starts,
            ends,
            start_links: Vec::new(),
            end_links: Vec::new(),
            state: IoTracing::Off,
        }
    }

    /// Whether there is anything to attach on this kernel.
    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }

    pub fn state(&self) -> IoTracing {
        self.state
    }

    /// Attaches every program at once: at load, when nothing has been recorded yet.
    pub fn attach_all(&mut self, ebpf: &mut Ebpf) -> Result<(), ProbeError> {
        self.start_links = attach(ebpf, &self.starts)?;
        self.end_links = attach(ebpf, &self.ends)?;
        self.state = if self.is_empty() {
            IoTracing::Off
        } else {
            IoTracing::On
        };
        Ok(())
    }

    /// Moves one step toward `on` and says where it now stands.
    pub fn step(&mut self, ebpf: &mut Ebpf, on: bool) -> Result<IoTracing, ProbeError> {
        use IoTracing::*;
        if self.is_empty() {
            return Ok(Off);
        }
        self.state = match (self.state, on) {
            (Off, true) | (Stopping, true) => {
                self.start_links = attach(ebpf, &self.starts)?;
                Starting
            }
            (Starting, true) => {
                if self.end_links.is_empty() {
                    self.end_links = attach(ebpf, &self.ends)?;
                }
                On
            }
            (On, false) | (Starting, false) => {
                detach(ebpf, &mut self.start_links)?;
                if self.end_links.is_empty() {
                    Off // Starting: no end was attached
                } else {
                    Stopping
                }
            }
            (Stopping, false) => {
                detach(ebpf, &mut self.end_links)?;
                Off
            }
            (s, _) => s,
        };
        Ok(self.state)
    }
}

fn attach(
    ebpf: &mut Ebpf,
    points: &[Point],
) -> Result<Vec<(&'static str, TracePointLinkId)>, ProbeError> {
    let mut links = Vec::with_capacity(points.len());
    for p in points {
        let tp = tracepoint(ebpf, p.program)?;
        match tp.attach(p.category, &p.event) {
            Ok(id) => links.push((p.program, id)),
            Err(source) => {
                // All or none: a half-attached pair would count starts it never ends.
                detach(ebpf, &mut links)?;
                return Err(ProbeError::Program {
                    name: p.program,
                    source,
                });
            }
        }
    }
    Ok(links)
}

fn detach(
    ebpf: &mut Ebpf,
    links: &mut Vec<(&'static str, TracePointLinkId)>,
) -> Result<(), ProbeError> {
    for (name, id) in links.drain(..) {
        tracepoint(ebpf, name)?
            .detach(id)
            .map_err(|source| ProbeError::Program { name, source })?;
    }
    Ok(())
}
