//! Whether a source is delivering, and why not: a typed state the sampler sets from each
//! source's own error, and the outputs show as `{"up": …, "detail": …}`.
use serde::ser::SerializeStruct;
use serde::{Serialize, Serializer};
use std::fmt;

/// Why a source is not delivering.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceError {
    /// Turned off on purpose (a `--no-…` flag or the config file): no finding. `how` says which.
    Disabled { how: String },
    /// It could not be opened or read: what failed, and why.
    Failed { why: String },
}

impl SourceError {
    pub fn disabled(how: impl Into<String>) -> Self {
        Self::Disabled { how: how.into() }
    }

    pub fn failed(why: impl fmt::Display) -> Self {
        Self::Failed {
            why: why.to_string(),
        }
    }

    pub fn is_disabled(&self) -> bool {
        matches!(self, Self::Disabled { .. })
    }
}

impl fmt::Display for SourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Disabled { how } => f.write_str(how),
            Self::Failed { why } => f.write_str(why),
        }
    }
}

impl std::error::Error for SourceError {}

/// One source's state: up (perhaps with what it cannot do here), or down with its error.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SourceState {
    pub up: bool,
    /// Why it is down; `None` while it is up.
    pub error: Option<SourceError>,
    /// While up: what it cannot do on this host (programs this kernel cannot attach).
    pub partial: Option<String>,
}

impl SourceState {
    pub fn up() -> Self {
        Self {
            up: true,
            error: None,
            partial: None,
        }
    }

    /// Up, but without part of what it delivers elsewhere.
    pub fn partial(what: impl Into<String>) -> Self {
        Self {
            partial: Some(what.into()),
            ..Self::up()
        }
    }

    pub fn from_error(error: SourceError) -> Self {
        Self {
            up: false,
            error: Some(error),
            partial: None,
        }
    }

    /// Down: it failed, as `why` says.
    pub fn down(why: impl fmt::Display) -> Self {
        Self::from_error(SourceError::failed(why))
    }

    /// Down on purpose.
    pub fn disabled(how: impl Into<String>) -> Self {
        Self::from_error(SourceError::disabled(how))
    }

    pub fn is_disabled(&self) -> bool {
        self.error.as_ref().is_some_and(SourceError::is_disabled)
    }

    /// The words shown beside the state: the error while down, what it lacks while up.
    pub fn detail(&self) -> Option<String> {
        match &self.error {
            Some(e) => Some(e.to_string()),
            None => self.partial.clone(),
        }
    }
}

impl<T, E: fmt::Display> From<&Result<T, E>> for SourceState {
    fn from(r: &Result<T, E>) -> Self {
        match r {
            Ok(_) => Self::up(),
            Err(e) => Self::down(e),
        }
    }
}

impl Serialize for SourceState {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("SourceState", 2)?;
        st.serialize_field("up", &self.up)?;
        st.serialize_field("detail", &self.detail())?;
        st.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_json_keeps_up_and_detail_and_a_disabled_source_is_told_apart() {
        let json = |s: &SourceState| serde_json::to_string(s).unwrap();
        assert_eq!(json(&SourceState::up()), r#"{"up":true,"detail":null}"#);
        assert_eq!(
            json(&SourceState::partial("no block tracepoints")),
            r#"{"up":true,"detail":"no block tracepoints"}"#
        );
        let off = SourceState::disabled("stall tracing disabled");
        assert_eq!(
            json(&off),
            r#"{"up":false,"detail":"stall tracing disabled"}"#
        );
        assert!(off.is_disabled());
        // A failure whose words end in "disabled" is still a failure.
        let failed = SourceState::down("the BPF syscall is disabled");
        assert!(!failed.is_disabled() && !failed.up);
    }
}
