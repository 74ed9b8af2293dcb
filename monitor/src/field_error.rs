//! A config value that does not make sense: the dotted field it sits at and why. Every
//! section's `validate` returns one; the config file places it at the line that spells the
//! field out. Imports nothing from the crate.

/// A bad value at `field` (dotted, relative to the section that found it).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    /// `rules.gpu_memory_high.above_percent`, `webhook.url`, ...
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }

    /// The same error seen from one section further out: `section.field`.
    #[must_use]
    pub fn within(self, section: &str) -> Self {
        Self {
            field: format!("{section}.{}", self.field),
            message: self.message,
        }
    }
}

/// The first of `fields` that is not a share (0–1, NaN refused), as an error at its field.
pub fn check_shares(fields: &[(&str, f64)]) -> Result<(), FieldError> {
    match fields.iter().find(|(_, v)| !(0.0..=1.0).contains(v)) {
        Some((field, v)) => Err(FieldError::new(*field, format!("{v} is not a share (0–1)"))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_climbs_out_through_its_sections() {
        let e = FieldError::new("above_percent", "120 is not a percentage (0–100)")
            .within("gpu_memory_high")
            .within("rules");
        assert_eq!(e.field, "rules.gpu_memory_high.above_percent");
        assert_eq!(
            e.to_string(),
            "rules.gpu_memory_high.above_percent: 120 is not a percentage (0–100)"
        );
    }
}
