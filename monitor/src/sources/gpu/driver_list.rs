//! The driver's own list of its GPUs: one directory per GPU bound to the nvidia driver, named by
//! its PCI address, under `/proc/driver/nvidia/gpus/`. NVML enumerates its devices when it is
//! initialised, so an agent that keeps NVML open sees no GPU bound to the driver after that, and
//! a GPU unbound since reads as lost. Comparing this list with the one seen at open says when
//! NVML must be opened again. Reading it costs one directory listing.
use std::collections::BTreeSet;
use std::io;
use std::path::Path;

/// The PCI addresses of the GPUs the driver lists in `dir`, sorted.
pub fn read(dir: &Path) -> io::Result<BTreeSet<String>> {
    let mut gpus = BTreeSet::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            gpus.insert(entry.file_name().to_string_lossy().into_owned());
        }
    }
    Ok(gpus)
}

/// How the driver's list differs from the one NVML was opened on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListChange {
    /// PCI addresses listed now and not then.
    pub added: Vec<String>,
    /// Listed then and not now.
    pub removed: Vec<String>,
}

impl ListChange {
    /// The change from `then` to `now`; `None` when they are the same.
    pub fn between(then: &BTreeSet<String>, now: &BTreeSet<String>) -> Option<Self> {
        let change = Self {
            added: now.difference(then).cloned().collect(),
            removed: then.difference(now).cloned().collect(),
        };
        (change != Self::default()).then_some(change)
    }
}

impl std::fmt::Display for ListChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = |v: &[String]| {
            if v.is_empty() {
                "none".to_owned()
            } else {
                v.join(", ")
            }
        };
        write!(
            f,
            "bound since: {}; gone since: {}",
            list(&self.added),
            list(&self.removed)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_the_gpu_directories_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        for gpu in ["0000:18:00.0", "0000:2a:00.0"] {
            std::fs::create_dir(dir.path().join(gpu)).unwrap();
            std::fs::write(dir.path().join(gpu).join("information"), "Model: H200\n").unwrap();
        }
        std::fs::write(dir.path().join("stray-file"), "").unwrap();
        let gpus = read(dir.path()).unwrap();
        assert_eq!(
            gpus.into_iter().collect::<Vec<_>>(),
            ["0000:18:00.0", "0000:2a:00.0"]
        );
        assert!(read(&dir.path().join("absent")).is_err());
    }

    #[test]
    fn a_change_names_what_was_bound_and_what_went() {
        let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        let then = set(&["0000:18:00.0", "0000:2a:00.0"]);
        assert_eq!(ListChange::between(&then, &then.clone()), None);
        let change = ListChange::between(&then, &set(&["0000:18:00.0", "0000:3a:00.0"])).unwrap();
        assert_eq!(change.added, ["0000:3a:00.0"]);
        assert_eq!(change.removed, ["0000:2a:00.0"]);
        assert_eq!(
            change.to_string(),
            "bound since: 0000:3a:00.0; gone since: 0000:2a:00.0"
        );
    }
}
