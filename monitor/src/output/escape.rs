//! Escaping what tenants control (container names, images, labels, cgroup paths, process names)
//! for each place it is shown, so a name can neither drive the operator's terminal, forge a line
//! of output, become a spreadsheet formula nor break a Markdown table.
use std::borrow::Cow;
use std::fmt::Write;

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

pub use crate::model::bounded::bounded;

/// For a Markdown table cell: the terminal escapes, then the characters Markdown or the HTML
/// inside it would act on (`|`, `` ` ``, `*`, `_`, `[`, `]`, `<`, `>`, `&`, `#`) escaped.
pub fn markdown(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in terminal(s).chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '|' | '`' | '*' | '_' | '[' | ']' | '#' => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_string_is_cut_at_a_character_with_an_ellipsis() {
        assert!(matches!(bounded("trainer", 7), Cow::Borrowed("trainer")));
        assert_eq!(bounded("trainer", 6), "train…");
        // multi-byte characters are never split
        assert_eq!(bounded("ééééé", 3), "éé…");
        let huge = "x".repeat(1 << 20);
        let cut = bounded(&huge, 256);
        assert_eq!(cut.chars().count(), 256);
        assert!(cut.ends_with('…'));
    }

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
    fn a_markdown_cell_stays_one_cell_of_plain_text() {
        assert_eq!(
            markdown("a|b <img src=x onerror=alert(1)> **x** [l](u)\n# h"),
            "a\\|b &lt;img src=x onerror=alert(1)&gt; \\*\\*x\\*\\* \\[l\\](u)\\u{a}\\# h"
        );
    }
}
