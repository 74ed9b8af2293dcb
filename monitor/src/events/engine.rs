//! The container engines: Docker's (or Podman's) API, containerd's task specs.

internal_event! {
    /// A request to the engine's API failed.
    DockerRequestFailed { error: String }
    |e| e.error.clone()
}

internal_event! {
    /// The engine's event stream ended; the cache is rebuilt from a fresh listing.
    DockerEventStreamLost { error: String }
    |e| e.error.clone()
}

internal_event! {
    /// A containerd task's OCI spec could not be read for its pod's names.
    CriSpecUnreadable { error: String }
    |e| e.error.clone()
}
