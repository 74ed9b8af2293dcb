//! Pressure stall information (PSI) of one cgroup: `cpu.pressure`, `io.pressure` and
//! `memory.pressure` in its unified-hierarchy directory (cgroup v2, and the `unified` tree of a
//! hybrid host, where Docker's cgroupfs driver also makes each container a directory).
//!
//! Each file has a `some` line (the time at least one of the cgroup's tasks was stalled on the
//! resource) and, except `cpu.pressure` outside the root, a `full` line (all of its non-idle
//! tasks stalled at once), with a cumulative `total=` in microseconds. The kernel counts time a
//! CPU quota throttles a cgroup as its CPU pressure: a spinning container under `--cpus 0.3`
//! gained 2.08 s of `cpu.pressure some` over 3 s in which `cpu.stat` counted 2.05 s throttled
//! (kernel 6.18, hybrid host).
use crate::model::PressureTotals;
use crate::sources::host::live_file::LiveFile;
use std::path::Path;

/// The three pressure files of a cgroup, kept open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PressureFiles {
    cpu: LiveFile,
    io: LiveFile,
    memory: LiveFile,
}

impl PressureFiles {
    pub fn new(unified_dir: &Path) -> Self {
        Self {
            cpu: LiveFile::new(unified_dir.join("cpu.pressure")),
            io: LiveFile::new(unified_dir.join("io.pressure")),
            memory: LiveFile::new(unified_dir.join("memory.pressure")),
        }
    }

    /// The cumulative totals now; `None` when a file cannot be read (a kernel without PSI, or
    /// booted with `psi=0`, has none) or does not parse.
    pub fn read(&mut self) -> Option<PressureTotals> {
        let (cpu_some_us, _) = totals(&self.cpu.read_string().ok()?)?;
        let (io_some_us, io_full_us) = totals(&self.io.read_string().ok()?)?;
        let (memory_some_us, memory_full_us) = totals(&self.memory.read_string().ok()?)?;
        Some(PressureTotals {
            cpu_some_us,
            io_some_us,
            io_full_us: io_full_us?,
            memory_some_us,
            memory_full_us: memory_full_us?,
        })
    }
}

/// The `some` and `full` totals of one pressure file (`full` absent in older kernels'
/// `cpu.pressure`).
fn totals(text: &str) -> Option<(u64, Option<u64>)> {
    let total = |kind: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(kind)?.strip_prefix(' '))
            .and_then(|rest| {
                rest.split_whitespace()
                    .find_map(|f| f.strip_prefix("total="))?
                    .parse()
                    .ok()
            })
    };
    Some((total("some")?, total("full")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_totals_of_the_three_files() {
        let dir = tempfile::tempdir().unwrap();
        // As read from a throttled container's directory on the development host.
        std::fs::write(
            dir.path().join("cpu.pressure"),
            "some avg10=11.59 avg60=2.09 avg300=0.43 total=2076137\n\
             full avg10=11.59 avg60=2.09 avg300=0.43 total=2075778\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("io.pressure"),
            "some avg10=0.00 avg60=0.00 avg300=0.00 total=150\n\
             full avg10=0.00 avg60=0.00 avg300=0.00 total=100\n",
        )
        .unwrap();
        let mut files = PressureFiles::new(dir.path());
        assert_eq!(files.read(), None, "no memory.pressure");
        std::fs::write(
            dir.path().join("memory.pressure"),
            "some avg10=0.00 avg60=0.00 avg300=0.00 total=7\n\
             full avg10=0.00 avg60=0.00 avg300=0.00 total=3\n",
        )
        .unwrap();
        assert_eq!(
            files.read(),
            Some(PressureTotals {
                cpu_some_us: 2076137,
                io_some_us: 150,
                io_full_us: 100,
                memory_some_us: 7,
                memory_full_us: 3,
            })
        );
        std::fs::write(dir.path().join("io.pressure"), "some avg10=0.00\n").unwrap();
        assert_eq!(files.read(), None, "a line without its total");
    }
}
