//! The driver libraries the GPU processes map, found, checked and probed on a thread of its
//! own, so that nothing a tenant shapes runs on the sampling round.
//!
//! A container decides how many driver libraries its processes map, how large their symbol
//! tables claim to be, how long its `/proc/<pid>/maps` is, and when its processes exit (and
//! a detach costs ~70 ms a link on the development VM). So the round only hands this thread a
//! [`Plan`] (the live GPU processes, and whether the probes are wanted) and reads back an
//! [`AttachState`]; it waits for the plan to be carried out only up to a short settle time.
//! The thread's own work is bounded:
//! - at most [`Limits::per_process`] driver libraries of one process and
//!   [`Limits::per_host`] in all are probed (each costs a descriptor for the file and three
//!   for its links), fewer where the descriptor limit is low ([`Limits::for_descriptors`]);
//!   a process past them is named in a [`CudaProbeLimit`] event;
//! - `maps` and symbol tables are read up to fixed sizes (`library`, `elf`);
//! - a pass that has scanned for [`Limits::scan_budget`] publishes what it has and takes the
//!   newest plan before going on.
//!
//! Each library is opened by identity and probed through the agent's own descriptor
//! (`library`): a probe is never placed in a file a tenant names.
use super::library::{self, LibraryFile, MappedLibrary};
use super::{entry_points, Programs};
use crate::events::{CudaProbeAttachFailed, CudaProbeLimit, EventCounters};
use crate::model::DriverLibrary;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A library's key: the device and inode of its file.
pub type LibraryKey = (u64, u64);

/// How much of the host the attacher may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Distinct driver libraries probed per process: a real one maps one (a driver upgrade
    /// while it runs, two).
    pub per_process: usize,
    /// Distinct driver libraries probed on the host.
    pub per_host: usize,
    /// How long one pass may scan new processes before it publishes and looks for a newer plan.
    pub scan_budget: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            per_process: 8,
            per_host: 64,
            scan_budget: Duration::from_secs(1),
        }
    }
}

/// Descriptors one probed library holds: its file, and a link per program.
pub const DESCRIPTORS_PER_LIBRARY: u64 = 4;

impl Limits {
    /// The limits within a descriptor limit of `nofile`: the libraries may hold at most an
    /// eighth of it, the rest staying for the HTTP side's connections and the sources.
    pub fn for_descriptors(self, nofile: u64) -> Self {
        let fit = (nofile / 8 / DESCRIPTORS_PER_LIBRARY) as usize;
        Self {
            per_host: self.per_host.min(fit),
            ..self
        }
    }
}

/// The soft limit on this process's open files.
fn nofile_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid out-parameter for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return 1024;
    }
    limit.rlim_cur
}

/// What the round wants: the live GPU processes (PID, start time: together their identity) and
/// whether their libraries should be probed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub processes: Vec<(u32, Option<u64>)>,
    pub wanted: bool,
}

/// What the attacher has done, for the round to read.
#[derive(Clone, Debug, Default)]
pub struct AttachState {
    /// The newest plan carried out in full.
    pub generation: u64,
    /// The driver libraries the GPU processes map, and whether each is probed.
    pub libraries: Vec<DriverLibrary>,
    /// Whether any library is probed.
    pub attached: bool,
    /// Changes whenever a library is attached or detached: a window whose two counter reads
    /// saw the same epoch (and probes attached) was traced throughout.
    pub epoch: u64,
    /// What the thread is doing, and since when; `None` while it waits for a plan.
    pub busy: Option<(&'static str, Instant)>,
}

#[derive(Default)]
struct Wanted {
    generation: u64,
    plan: Plan,
}

struct Shared {
    wanted: Mutex<Wanted>,
    wake: Condvar,
    state: Mutex<AttachState>,
    done: Condvar,
    stop: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The round's handle on the attacher thread. Dropping it stops the thread (it detaches what
/// it attached on its way out; it is not waited for).
pub struct Attacher {
    shared: Arc<Shared>,
}

impl Attacher {
    /// Starts the thread that owns `programs`.
    pub fn spawn(
        programs: Programs,
        proc_root: PathBuf,
        limits: Limits,
        events: Arc<EventCounters>,
    ) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            wanted: Mutex::new(Wanted::default()),
            wake: Condvar::new(),
            state: Mutex::new(AttachState::default()),
            done: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let worker = Worker {
            programs,
            proc_root,
            limits: limits.for_descriptors(nofile_limit()),
            events,
            shared: shared.clone(),
            libraries: BTreeMap::new(),
            scanned: HashMap::new(),
            epoch: 0,
        };
        std::thread::Builder::new()
            .name("gpuwatch-cuda".into())
            .spawn(move || worker.run())?;
        Ok(Self { shared })
    }

    /// Hands the thread `plan`; returns its generation (the current one when the plan is the
    /// one already handed over).
    pub fn request(&self, plan: Plan) -> u64 {
        let mut w = lock(&self.shared.wanted);
        if w.generation == 0 || w.plan != plan {
            w.generation += 1;
            w.plan = plan;
            self.shared.wake.notify_one();
        }
        w.generation
    }

    /// The state once plan `generation` is carried out, or as it is after `timeout`.
    pub fn settle(&self, generation: u64, timeout: Duration) -> AttachState {
        let state = lock(&self.shared.state);
        let (state, _) = self
            .shared
            .done
            .wait_timeout_while(state, timeout, |s| s.generation < generation)
            .unwrap_or_else(|p| p.into_inner());
        state.clone()
    }

    /// The state as it is now.
    pub fn state(&self) -> AttachState {
        lock(&self.shared.state).clone()
    }
}

impl Drop for Attacher {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        let _guard = lock(&self.shared.wanted);
        self.shared.wake.notify_one();
    }
}

/// What a GPU process maps: its start time (with the PID, its identity) and its libraries.
struct Scanned {
    start: Option<u64>,
    libraries: Vec<LibraryKey>,
}

/// A driver library the GPU processes map.
struct Library {
    info: DriverLibrary,
    /// Open while it can be probed.
    file: Option<LibraryFile>,
    points: Vec<(u64, u64)>,
}

struct Worker {
    programs: Programs,
    proc_root: PathBuf,
    limits: Limits,
    events: Arc<EventCounters>,
    shared: Arc<Shared>,
    libraries: BTreeMap<LibraryKey, Library>,
    scanned: HashMap<u32, Scanned>,
    epoch: u64,
}

impl Worker {
    fn run(mut self) {
        let mut done = 0;
        loop {
            let (generation, plan) = {
                let w = lock(&self.shared.wanted);
                let (w, _) = self
                    .shared
                    .wake
                    .wait_timeout_while(w, Duration::from_secs(1), |w| {
                        w.generation == done && !self.shared.stop.load(Ordering::Relaxed)
                    })
                    .unwrap_or_else(|p| p.into_inner());
                (w.generation, w.plan.clone())
            };
            if self.shared.stop.load(Ordering::Relaxed) {
                self.programs.detach_all();
                return;
            }
            if generation == done {
                continue;
            }
            if self.carry_out(&plan) {
                done = generation;
            }
            self.publish(done);
        }
    }

    fn busy(&self, doing: &'static str) {
        lock(&self.shared.state).busy = Some((doing, Instant::now()));
    }

    fn publish(&self, generation: u64) {
        let mut s = lock(&self.shared.state);
        s.generation = generation;
        s.libraries = self.libraries.values().map(|l| l.info.clone()).collect();
        s.attached = self.libraries.values().any(|l| l.info.attached);
        s.epoch = self.epoch;
        s.busy = None;
        self.shared.done.notify_all();
    }

    /// One pass over `plan`; false when the scan ran out of its budget before the end.
    fn carry_out(&mut self, plan: &Plan) -> bool {
        let live: HashMap<u32, Option<u64>> = plan.processes.iter().copied().collect();
        self.scanned
            .retain(|pid, s| live.get(pid) == Some(&s.start));
        let complete = self.scan(&plan.processes);
        self.drop_unmapped();
        if plan.wanted {
            self.attach_all();
        } else if self.libraries.values().any(|l| l.info.attached) {
            self.busy("detaching the probes");
            self.programs.detach_all();
            self.epoch += 1;
        }
        for (key, lib) in self.libraries.iter_mut() {
            lib.info.attached = self.programs.is_attached(*key);
        }
        complete
    }

    /// Reads the mappings of processes not seen before, within the scan budget.
    fn scan(&mut self, processes: &[(u32, Option<u64>)]) -> bool {
        let started = Instant::now();
        for &(pid, start) in processes {
            if self.scanned.contains_key(&pid) {
                continue;
            }
            if started.elapsed() >= self.limits.scan_budget {
                return false;
            }
            self.busy("reading a GPU process's mappings");
            let Ok(mapped) = library::mapped_by(&self.proc_root, pid) else {
                continue; // gone meanwhile; the next plan says
            };
            if mapped.truncated {
                self.events.emit(CudaProbeLimit {
                    pid,
                    detail: format!(
                        "its memory map is larger than {} MiB; only the first {} MiB were read",
                        library::MAPS_MAX_BYTES >> 20,
                        library::MAPS_MAX_BYTES >> 20
                    ),
                });
            }
            let libraries = self.known(pid, mapped.libraries);
            self.scanned.insert(pid, Scanned { start, libraries });
        }
        true
    }

    /// The keys of `pid`'s driver libraries, each opened and read if new, within the limits.
    fn known(&mut self, pid: u32, mapped: Vec<MappedLibrary>) -> Vec<LibraryKey> {
        if mapped.len() > self.limits.per_process {
            self.events.emit(CudaProbeLimit {
                pid,
                detail: format!(
                    "it maps {} driver libraries; only the first {} are probed (at most {} a \
                     process)",
                    mapped.len(),
                    self.limits.per_process,
                    self.limits.per_process
                ),
            });
        }
        let mut keys = Vec::new();
        for m in mapped.into_iter().take(self.limits.per_process) {
            let key = (m.device, m.inode);
            if self.libraries.contains_key(&key) {
                keys.push(key);
                continue;
            }
            if self.libraries.len() >= self.limits.per_host {
                self.events.emit(CudaProbeLimit {
                    pid,
                    detail: format!(
                        "its driver library {} is not probed: the host's GPU processes map {} \
                         already (at most {})",
                        m.path,
                        self.libraries.len(),
                        self.limits.per_host
                    ),
                });
                break;
            }
            self.busy("opening a driver library");
            match library::open(&self.proc_root, pid, &m) {
                Ok(file) => {
                    keys.push(key);
                    self.libraries.insert(key, known(file, &self.events));
                }
                Err(e) => self.events.emit(CudaProbeAttachFailed {
                    library: format!("process {pid}'s driver library {}", m.path),
                    error: e.to_string(),
                }),
            }
        }
        keys
    }

    /// Detaches and forgets the libraries no live GPU process maps any longer.
    fn drop_unmapped(&mut self) {
        let in_use: HashSet<LibraryKey> = self
            .scanned
            .values()
            .flat_map(|s| s.libraries.iter().copied())
            .collect();
        let gone: Vec<LibraryKey> = self
            .libraries
            .keys()
            .filter(|k| !in_use.contains(k))
            .copied()
            .collect();
        for key in gone {
            if self.programs.is_attached(key) {
                self.busy("detaching a library no process maps");
                self.programs.detach(key);
                self.epoch += 1;
            }
            self.libraries.remove(&key);
        }
    }

    fn attach_all(&mut self) {
        for (key, lib) in self.libraries.iter_mut() {
            let Some(file) = &lib.file else { continue };
            if self.programs.is_attached(*key) {
                continue;
            }
            lock(&self.shared.state).busy = Some(("attaching the probes", Instant::now()));
            match self.programs.attach(file, &lib.points) {
                Ok(()) => self.epoch += 1,
                Err(e) => {
                    self.events.emit(CudaProbeAttachFailed {
                        library: lib.info.path.to_string(),
                        error: e.to_string(),
                    });
                    lib.info.error = Some(e.to_string());
                    lib.file = None; // not tried again each pass
                }
            }
        }
    }
}

/// A library seen for the first time: its entry points, or why it cannot be probed.
fn known(file: LibraryFile, events: &EventCounters) -> Library {
    let mut info = DriverLibrary {
        path: file.mapped.path.clone(),
        device: file.device,
        inode: file.inode,
        entry_points: 0,
        attached: false,
        error: None,
    };
    match entry_points(&file) {
        Ok(points) => {
            info.entry_points = points.len();
            Library {
                info,
                file: Some(file),
                points,
            }
        }
        Err(e) => {
            events.emit(CudaProbeAttachFailed {
                library: info.path.to_string(),
                error: e.to_string(),
            });
            info.error = Some(e.to_string());
            Library {
                info,
                file: None,
                points: Vec::new(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_libraries_keep_to_an_eighth_of_the_descriptor_limit() {
        let l = Limits::default();
        assert_eq!(l.for_descriptors(1 << 20).per_host, 64);
        // 1024 descriptors: 128 for the libraries, 4 each.
        assert_eq!(l.for_descriptors(1024).per_host, 32);
        assert_eq!(l.for_descriptors(16).per_host, 0);
        assert_eq!(l.for_descriptors(1024).per_process, 8);
    }
}
