//! Tenant strings (container names, images, labels) cut to a length wherever they are shown or
//! stored: Docker takes a label of a megabyte, and one such label made every table row 10,400
//! characters wide, `/metrics` 17 MB and a 75-s recording 118 MB. The whole value stays in
//! the Docker cache and is served for one container at `/api/v1/containers/<id>`.
use serde::Serializer;
use std::borrow::Cow;

/// The most characters of one tenant string in the snapshot's JSON.
pub const JSON_MAX_CHARS: usize = 1024;

/// `s` cut to at most `max` characters, the last of them an ellipsis when cut.
pub fn bounded(s: &str, max: usize) -> Cow<'_, str> {
    match s.char_indices().nth(max) {
        None => Cow::Borrowed(s),
        Some(_) => {
            let cut = s
                .char_indices()
                .nth(max.saturating_sub(1))
                .map_or(0, |(i, _)| i);
            Cow::Owned(format!("{}…", &s[..cut]))
        }
    }
}

/// `#[serde(serialize_with = "crate::model::bounded::json")]`: the string cut to [`JSON_MAX_CHARS`].
pub fn json<S: Serializer>(s: &str, ser: S) -> Result<S::Ok, S::Error> {
    ser.serialize_str(&bounded(s, JSON_MAX_CHARS))
}

/// The same for an optional string.
pub fn json_opt<S: Serializer>(s: &Option<String>, ser: S) -> Result<S::Ok, S::Error> {
    match s {
        Some(s) => json(s, ser),
        None => ser.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_at_a_character_with_an_ellipsis() {
        assert_eq!(bounded("short", 10), "short");
        assert_eq!(bounded("abcdef", 4), "abc…");
        assert_eq!(bounded("日本語のラベル", 3), "日本…");
        assert_eq!(bounded(&"x".repeat(1 << 20), 1024).chars().count(), 1024);
    }
}
