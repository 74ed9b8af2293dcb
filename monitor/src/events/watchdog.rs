//! The agent's own loop.

internal_event! {
    /// A sampling round has not returned within the watchdog's limit: `stall` says which step.
    SourceHung { stall: String }
    |e| e.stall.clone()
}
