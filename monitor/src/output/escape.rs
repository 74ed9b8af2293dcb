//! Escaping what tenants control (container names, images, labels, cgroup paths, process names)
//! for each place it is shown, so a name can neither drive the operator's terminal, forge a line
//! of output, become a spreadsheet formula nor break a Markdown table.

pub use crate::model::bounded::{bounded, terminal};

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

/// For a Prometheus label value: control characters (ESC, CR, the C1 range, DEL) shown as
/// `\u{1b}`-style text, so `curl …/metrics` in a terminal cannot be driven by a tenant's name.
/// Backslashes are left to the exposition format's own escaping (`\\`), which keeps the value
/// as the tenant wrote it otherwise.
pub fn label_value(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c.is_control() {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::borrow::Cow;

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
    fn a_label_value_carries_no_control_character() {
        let hostile = "ns\x1b]0;pwned\x07\nx\\y\u{9b}";
        let v = label_value(hostile);
        assert!(!v.chars().any(char::is_control), "{v}");
        assert_eq!(v, "ns\\u{1b}]0;pwned\\u{7}\\u{a}x\\y\\u{9b}");
        assert!(matches!(label_value("ml/train-1"), Cow::Borrowed(_)));
    }

    #[test]
    fn a_markdown_cell_stays_one_cell_of_plain_text() {
        assert_eq!(
            markdown("a|b <img src=x onerror=alert(1)> **x** [l](u)\n# h"),
            "a\\|b &lt;img src=x onerror=alert(1)&gt; \\*\\*x\\*\\* \\[l\\](u)\\u{a}\\# h"
        );
    }
}
