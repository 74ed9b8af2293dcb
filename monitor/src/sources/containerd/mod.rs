//! Pod and container names on containerd nodes. The kubelet describes each container to
//! containerd's CRI plugin, which writes the pod's name, namespace and uid and the container's
//! name and image into the OCI spec of the container's task as annotations
//! (`io.kubernetes.cri.*`); containerd's runtime v2 keeps that spec, for as long as the task
//! runs, at `<task dir>/<namespace>/<container id>/config.json`. A Kubernetes workload that
//! holds a GPU (its cgroup names the pod's uid and the container's id) is named from there.
//!
//! The annotations are containerd's to write, not the tenant's: a pod's own annotations reach
//! the spec only where the runtime is configured to pass them, and never over these keys. The
//! pod uid in the spec must still match the one the container's cgroup carries.
use crate::model::{ContainerInfo, Engine, KubernetesPod, WorkloadId, WorkloadKind};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where containerd's runtime v2 keeps its running tasks' bundles.
pub const DEFAULT_TASK_DIR: &str = "/run/containerd/io.containerd.runtime.v2.task";
/// The containerd namespace the CRI plugin uses, looked in first.
const CRI_NAMESPACE: &str = "k8s.io";
/// A spec larger than this is not read (an environment of megabytes would make it so).
const MAX_SPEC_BYTES: u64 = 4 << 20;

const SANDBOX_NAME: &str = "io.kubernetes.cri.sandbox-name";
const SANDBOX_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";
const SANDBOX_UID: &str = "io.kubernetes.cri.sandbox-uid";
const CONTAINER_NAME: &str = "io.kubernetes.cri.container-name";
const IMAGE_NAME: &str = "io.kubernetes.cri.image-name";

#[derive(Debug, thiserror::Error)]
pub enum CriSpecError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {size} bytes, more than the {MAX_SPEC_BYTES} read")]
    TooLarge { path: PathBuf, size: u64 },
    #[error("{path}: not an OCI spec: {source}")]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
}

/// The running tasks' specs, read once per container.
pub struct CriTasks {
    dir: PathBuf,
    /// Named containers by id; a container is read again only after it was forgotten.
    known: HashMap<Arc<str>, Arc<ContainerInfo>>,
}

impl CriTasks {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            known: HashMap::new(),
        }
    }

    /// The container of a Kubernetes workload as containerd's CRI plugin described it, where a
    /// task of that id runs with the CRI annotations and the pod uid its cgroup names. `Ok(None)`
    /// where no such task runs here (a Docker-based node, a pod-level cgroup).
    pub fn container(
        &mut self,
        workload: &WorkloadId,
    ) -> Result<Option<Arc<ContainerInfo>>, CriSpecError> {
        if workload.kind != WorkloadKind::Kubernetes {
            return Ok(None);
        }
        let Some((uid, id)) = workload.id.split_once('/') else {
            return Ok(None);
        };
        if let Some(c) = self.known.get(id) {
            return Ok(Some(c.clone()));
        }
        let Some(spec) = self.spec_path(id) else {
            return Ok(None);
        };
        let annotations = read_annotations(&spec)?;
        let Some(info) = container_info(id, &annotations).filter(|c| {
            c.kubernetes
                .as_ref()
                .is_some_and(|k| k.uid.as_deref().is_none_or(|u| u == uid))
        }) else {
            return Ok(None);
        };
        let info = Arc::new(info);
        self.known.insert(id.into(), info.clone());
        Ok(Some(info))
    }

    /// Forgets the containers `keep` does not name (their tasks ended or hold no GPU now).
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.known.retain(|id, _| keep(id));
    }

    /// `<dir>/<namespace>/<id>/config.json` of the namespace that runs `id`, CRI's first.
    fn spec_path(&self, id: &str) -> Option<PathBuf> {
        // The id comes from a cgroup path: only a plain name may join the path.
        if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return None;
        }
        let in_namespace = |ns: &Path| ns.join(id).join("config.json");
        let cri = in_namespace(&self.dir.join(CRI_NAMESPACE));
        if cri.is_file() {
            return Some(cri);
        }
        std::fs::read_dir(&self.dir)
            .ok()?
            .flatten()
            .map(|e| in_namespace(&e.path()))
            .find(|p| p.is_file())
    }
}

fn read_annotations(path: &Path) -> Result<HashMap<String, String>, CriSpecError> {
    #[derive(serde::Deserialize)]
    struct Spec {
        #[serde(default)]
        annotations: HashMap<String, String>,
    }
    let read = |source| CriSpecError::Read {
        path: path.to_owned(),
        source,
    };
    let size = std::fs::metadata(path).map_err(read)?.len();
    if size > MAX_SPEC_BYTES {
        return Err(CriSpecError::TooLarge {
            path: path.to_owned(),
            size,
        });
    }
    let text = std::fs::read(path).map_err(read)?;
    let spec: Spec = serde_json::from_slice(&text).map_err(|source| CriSpecError::Parse {
        path: path.to_owned(),
        source,
    })?;
    Ok(spec.annotations)
}

/// A container named by the CRI annotations; `None` unless the pod's name and namespace are
/// there (a task containerd runs for something else than the kubelet).
fn container_info(id: &str, annotations: &HashMap<String, String>) -> Option<ContainerInfo> {
    let text = |key: &str| annotations.get(key).filter(|v| !v.is_empty()).cloned();
    let pod = KubernetesPod {
        namespace: text(SANDBOX_NAMESPACE)?,
        pod: text(SANDBOX_NAME)?,
        container: text(CONTAINER_NAME),
        uid: text(SANDBOX_UID),
    };
    // As the kubelet names a container to a person: the pod's container, or the pod itself for
    // its sandbox.
    let name = match &pod.container {
        Some(c) => format!("{}/{c}", pod.pod),
        None => pod.pod.clone(),
    };
    let image = text(IMAGE_NAME).unwrap_or_default();
    Some(ContainerInfo {
        kubernetes: Some(pod),
        ..ContainerInfo::named(id, Engine::Containerd, name, image)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const UID: &str = "5d0f7f2e-1c2b-4c3d-9e8f-0a1b2c3d4e5f";

    fn task(dir: &Path, namespace: &str, id: &str, spec: &serde_json::Value) {
        let bundle = dir.join(namespace).join(id);
        std::fs::create_dir_all(&bundle).unwrap();
        std::fs::write(bundle.join("config.json"), spec.to_string()).unwrap();
    }

    fn cri_spec(uid: &str) -> serde_json::Value {
        serde_json::json!({"ociVersion": "1.0.2", "process": {"args": ["python"]}, "annotations": {
            "io.kubernetes.cri.container-type": "container",
            SANDBOX_NAME: "trainer-0", SANDBOX_NAMESPACE: "ml", SANDBOX_UID: uid,
            CONTAINER_NAME: "trainer", IMAGE_NAME: "registry.example/yolo:8"}})
    }

    fn workload(uid: &str, id: &str) -> WorkloadId {
        WorkloadId::new(WorkloadKind::Kubernetes, format!("{uid}/{id}"))
    }

    #[test]
    fn a_cri_task_names_its_pod_and_container() {
        let dir = tempfile::tempdir().unwrap();
        task(dir.path(), "k8s.io", ID, &cri_spec(UID));
        let mut tasks = CriTasks::new(dir.path());
        let c = tasks.container(&workload(UID, ID)).unwrap().unwrap();
        assert_eq!(c.name, "trainer-0/trainer");
        assert_eq!(c.image, "registry.example/yolo:8");
        assert_eq!(c.engine, Engine::Containerd);
        let pod = c.kubernetes.as_ref().unwrap();
        assert_eq!(
            (pod.namespace.as_str(), pod.pod.as_str()),
            ("ml", "trainer-0")
        );
        assert_eq!(pod.container.as_deref(), Some("trainer"));
        // Read once: the spec may go; the name stays until the container is forgotten.
        std::fs::remove_dir_all(dir.path().join("k8s.io")).unwrap();
        assert!(tasks.container(&workload(UID, ID)).unwrap().is_some());
        tasks.retain(|_| false);
        assert!(tasks.container(&workload(UID, ID)).unwrap().is_none());
    }

    #[test]
    fn a_spec_whose_pod_uid_is_not_the_cgroups_names_nothing() {
        let dir = tempfile::tempdir().unwrap();
        task(
            dir.path(),
            "k8s.io",
            ID,
            &cri_spec("ffffffff-1c2b-4c3d-9e8f-0a1b2c3d4e5f"),
        );
        let mut tasks = CriTasks::new(dir.path());
        assert!(tasks.container(&workload(UID, ID)).unwrap().is_none());
    }

    #[test]
    fn tasks_without_cri_annotations_or_outside_kubernetes_name_nothing() {
        let dir = tempfile::tempdir().unwrap();
        // Docker's own containerd namespace: a task with no CRI annotations.
        task(
            dir.path(),
            "moby",
            ID,
            &serde_json::json!({"ociVersion": "1.0.2"}),
        );
        let mut tasks = CriTasks::new(dir.path());
        assert!(tasks.container(&workload(UID, ID)).unwrap().is_none());
        let docker = WorkloadId::new(WorkloadKind::Docker, ID);
        assert!(tasks.container(&docker).unwrap().is_none());
        // A pod-level cgroup has no container id; an id that is not a plain name joins no path.
        let pod_level = WorkloadId::new(WorkloadKind::Kubernetes, UID);
        assert!(tasks.container(&pod_level).unwrap().is_none());
        assert!(tasks
            .container(&workload(UID, "../moby/x"))
            .unwrap()
            .is_none());
    }

    #[test]
    fn a_task_in_another_namespace_is_found() {
        let dir = tempfile::tempdir().unwrap();
        task(dir.path(), "custom", ID, &cri_spec(UID));
        let mut tasks = CriTasks::new(dir.path());
        assert!(tasks.container(&workload(UID, ID)).unwrap().is_some());
    }

    #[test]
    fn a_broken_or_oversized_spec_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = dir.path().join("k8s.io").join(ID);
        std::fs::create_dir_all(&bundle).unwrap();
        std::fs::write(bundle.join("config.json"), "{\"annotations\": ").unwrap();
        let mut tasks = CriTasks::new(dir.path());
        let e = tasks.container(&workload(UID, ID)).unwrap_err();
        assert!(matches!(e, CriSpecError::Parse { .. }), "{e}");
        assert!(e.to_string().contains("config.json"), "{e}");
        let big = std::fs::File::create(bundle.join("config.json")).unwrap();
        big.set_len(MAX_SPEC_BYTES + 1).unwrap();
        let e = tasks.container(&workload(UID, ID)).unwrap_err();
        assert!(matches!(e, CriSpecError::TooLarge { .. }), "{e}");
    }
}
