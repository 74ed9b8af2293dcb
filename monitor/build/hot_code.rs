//! The linker script that puts the functions of monitor/hot-code.txt first in the release
//! binary's code. Included by monitor/build.rs, and by xtask for its tests.

/// Set to `1` by `cargo xtask hot-code` for the build it profiles: the functions then laid out
/// [`Layout::PagePerFunction`].
pub const PROFILE_LAYOUT: &str = "GPUWATCH_HOT_CODE_PROFILE";

/// How the listed functions are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// One block, as release builds link them.
    Packed,
    /// Each function on pages of its own, for profiling (`cargo xtask hot-code`): a resident
    /// page then names the one function that was run, not its neighbours too.
    PagePerFunction,
}

/// The linker script for a hot-code list (`#` lines are comments); `None` when it names no
/// function. A name may hold only what a mangled name or its wildcard does.
pub fn script(list: &str, layout: Layout) -> Result<Option<String>, String> {
    let mut sections = String::new();
    for (i, line) in list.lines().enumerate() {
        let name = line.trim();
        if name.is_empty() || name.starts_with('#') {
            continue;
        }
        if let Some(c) = name
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '.' | '*')))
        {
            return Err(format!("{}: {c:?} cannot be in a function's name", i + 1));
        }
        // LLVM names the section of a function it thinks cold `.text.unlikely.<name>`.
        let both = format!(".text.{name} .text.unlikely.{name}");
        match layout {
            Layout::Packed => sections.push_str(&format!("      {both}\n")),
            Layout::PagePerFunction => {
                sections.push_str(&format!("    *({both})\n    . = ALIGN(4096);\n"));
            }
        }
    }
    if sections.is_empty() {
        return Ok(None);
    }
    let body = match layout {
        Layout::Packed => format!("    *(\n{sections}    )\n"),
        Layout::PagePerFunction => sections,
    };
    Ok(Some(format!(
        "SECTIONS {{\n  .text.hot : {{\n{body}  }}\n}} INSERT BEFORE .text;\n"
    )))
}

#[cfg(test)]
mod tests {
    use super::{script, Layout};

    #[test]
    fn names_become_one_block_of_sections_before_text() {
        let list = "# hot-code-bytes 10\n# a comment\n\n_RNvCs*_8gpuwatch4main\n__divti3\n";
        let script = script(list, Layout::Packed).unwrap().unwrap();
        assert_eq!(
            script,
            "SECTIONS {\n  .text.hot : {\n    *(\n      .text._RNvCs*_8gpuwatch4main \
             .text.unlikely._RNvCs*_8gpuwatch4main\n      .text.__divti3 \
             .text.unlikely.__divti3\n    )\n  }\n} INSERT BEFORE .text;\n"
        );
    }

    #[test]
    fn for_profiling_each_name_starts_a_page_of_its_own() {
        let list = "# hot-code-bytes 10\n_RNvCs*_8gpuwatch4main\n__divti3\n";
        let script = script(list, Layout::PagePerFunction).unwrap().unwrap();
        assert_eq!(
            script,
            "SECTIONS {\n  .text.hot : {\n    \
             *(.text._RNvCs*_8gpuwatch4main .text.unlikely._RNvCs*_8gpuwatch4main)\n    \
             . = ALIGN(4096);\n    *(.text.__divti3 .text.unlikely.__divti3)\n    \
             . = ALIGN(4096);\n  }\n} INSERT BEFORE .text;\n"
        );
    }

    #[test]
    fn a_list_without_names_links_as_before() {
        for layout in [Layout::Packed, Layout::PagePerFunction] {
            assert_eq!(script("# hot-code-bytes 0\n\n", layout), Ok(None));
        }
    }

    #[test]
    fn a_name_that_could_break_the_script_is_refused_with_its_line() {
        assert_eq!(
            script(
                "# header\n_RNvCs*_3foo\nbar) } /DISCARD/ : { *(\n",
                Layout::PagePerFunction
            ),
            Err("3: ')' cannot be in a function's name".to_owned())
        );
    }
}
