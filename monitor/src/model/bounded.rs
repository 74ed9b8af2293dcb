//! Tenant strings (container names, images, labels) cut to a length wherever they are shown or
//! stored: Docker takes a label of a megabyte, and one such label made every table row 10,400
//! characters wide, `/metrics` 17 MB and a 75-s recording 118 MB. The whole value stays in
//! the Docker cache and is served for one container at `/api/v1/containers/<id>`.
//!
//! And made printable for a terminal or a log line ([`terminal`]): a tenant names files,
//! cgroups and processes with any bytes it likes.
use serde::Serializer;
use std::borrow::Cow;
use std::fmt::Write;

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

/// For a terminal or a line-oriented log: control characters (ESC, CR, LF, the C1 range, DEL)
/// are shown as `\u{1b}`-style escapes, so a name cannot move the cursor, recolour the screen
/// or start a line of its own. A backslash is doubled, so an escape cannot be forged either.
pub fn terminal(s: &str) -> Cow<'_, str> {
    if !s.chars().any(|c| c.is_control() || c == '\\') {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c == '\\' {
            out.push_str("\\\\");
        } else if c.is_control() {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_terminal_sees_no_control_character() {
        let hostile =
            "train\x1b[31mRED\x1b[0m\n2026-12-01T00:00:00Z FIRING critical\r\u{9b}2J\\u{1b}";
        let shown = terminal(hostile);
        assert!(!shown.chars().any(char::is_control), "{shown}");
        assert_eq!(
            shown,
            "train\\u{1b}[31mRED\\u{1b}[0m\\u{a}2026-12-01T00:00:00Z FIRING critical\\u{d}\\u{9b}2J\\\\u{1b}"
        );
        assert!(matches!(terminal("yolo-train [trainer]"), Cow::Borrowed(_)));
        assert_eq!(terminal("名前-ü"), "名前-ü");
    }

    #[test]
    fn cut_at_a_character_with_an_ellipsis() {
        assert_eq!(bounded("short", 10), "short");
        assert_eq!(bounded("abcdef", 4), "abc…");
        assert_eq!(bounded("日本語のラベル", 3), "日本…");
        assert_eq!(bounded(&"x".repeat(1 << 20), 1024).chars().count(), 1024);
    }
}
