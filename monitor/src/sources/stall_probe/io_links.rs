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
//! the reads in flight complete. Only a read blocked across a whole step can still be missed;
//! when the programs come back after such a gap, the starts left from before it are voided
//! ([`void_starts_before_gap`]), so an end never meets a start older than the gap.
use super::{tracepoint, ProbeError};
use crate::model::IoTracing;
use aya::maps::{Array, HashMap, MapError, PerCpuArray, PerCpuValues};
use aya::programs::trace_point::TracePointLinkId;
use aya::Ebpf;
use monitor_common::{CpuCurrent, RequestKey, RequestStart};
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
            (Off, true) => {
                void_starts_before_gap(ebpf)?;
                self.start_links = attach(ebpf, &self.starts)?;
                Starting
            }
            // the ends never went: nothing was missed
            (Stopping, true) => {
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

/// Before the start programs come back after a gap in which the end programs were off: a read
/// or request whose end fell in the gap left its start behind, and a later end must not meet
/// it. Each place a start waits is voided while no program can write one (every start program
/// is off):
/// - a read switched out mid-read keeps its start in the thread's task-local entry, which
///   userspace cannot reach: the read generation is bumped, and an end meeting a start moved
///   there under an older one takes it as unmatched;
/// - a read that did not switch out keeps it in its CPU's slot (until the thread switches out,
///   which can be never on an idle CPU): the slots are cleared;
/// - a block request's start waits in `REQUESTS`, keyed by device and sector, which a later
///   request can reuse: it is emptied.
pub(super) fn void_starts_before_gap(ebpf: &mut Ebpf) -> Result<(), ProbeError> {
    fn map<'a>(
        ebpf: &'a mut Ebpf,
        name: &'static str,
    ) -> Result<&'a mut aya::maps::Map, ProbeError> {
        ebpf.map_mut(name).ok_or(ProbeError::Missing(name))
    }
    let err = |name| move |source: MapError| ProbeError::Map { name, source };

    let mut generation: Array<_, u32> =
        Array::try_from(map(ebpf, "READ_GENERATION")?).map_err(err("READ_GENERATION"))?;
    let next = generation
        .get(&0, 0)
        .map_err(err("READ_GENERATION"))?
        .wrapping_add(1);
    generation
        .set(0, &next, 0)
        .map_err(err("READ_GENERATION"))?;

    // Clearing a slot whole is safe even while the scheduler program writes it: a slot that
    // names no thread is claimed afresh by the next event.
    let mut slots: PerCpuArray<_, CpuCurrent> =
        PerCpuArray::try_from(map(ebpf, "CPU_CURRENT")?).map_err(err("CPU_CURRENT"))?;
    let cpus = super::batch::possible_cpus().unwrap_or(0);
    let cleared = PerCpuValues::try_from(vec![CpuCurrent::default(); cpus]).map_err(|source| {
        ProbeError::PerCpuValues {
            name: "CPU_CURRENT",
            source,
        }
    })?;
    slots.set(0, cleared, 0).map_err(err("CPU_CURRENT"))?;

    let mut requests: HashMap<_, RequestKey, RequestStart> =
        HashMap::try_from(map(ebpf, "REQUESTS")?).map_err(err("REQUESTS"))?;
    let keys: Vec<RequestKey> = requests.keys().filter_map(Result::ok).collect();
    for key in keys {
        // a key gone since it was listed is what was wanted
        let _ = requests.remove(&key);
    }
    Ok(())
}
