//! The linker script that puts the functions of monitor/hot-code.txt first in the release
//! binary's code. Included by monitor/build.rs, and by xtask for its tests.

/// The linker script for a hot-code list (`#` lines are comments); `None` when it names no
/// function. A name may hold only what a mangled name or its wildcard does.
pub fn script(list: &str) -> Result<Option<String>, String> {
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
        for prefix in [".text.", ".text.unlikely."] {
            sections.push_str("      ");
            sections.push_str(prefix);
            sections.push_str(name);
            sections.push('\n');
        }
    }
    if sections.is_empty() {
        return Ok(None);
    }
    Ok(Some(format!(
        "SECTIONS {{\n  .text.hot : {{\n    *(\n{sections}    )\n  }}\n}} INSERT BEFORE .text;\n"
    )))
}

#[cfg(test)]
mod tests {
    use super::script;

    #[test]
    fn names_become_one_block_of_sections_before_text() {
        let list = "# hot-code-bytes 10\n# a comment\n\n_RNvCs*_8gpuwatch4main\n__divti3\n";
        let script = script(list).unwrap().unwrap();
        assert_eq!(
            script,
            "SECTIONS {\n  .text.hot : {\n    *(\n      .text._RNvCs*_8gpuwatch4main\n      \
             .text.unlikely._RNvCs*_8gpuwatch4main\n      .text.__divti3\n      \
             .text.unlikely.__divti3\n    )\n  }\n} INSERT BEFORE .text;\n"
        );
    }

    #[test]
    fn a_list_without_names_links_as_before() {
        assert_eq!(script("# hot-code-bytes 0\n\n"), Ok(None));
    }

    #[test]
    fn a_name_that_could_break_the_script_is_refused_with_its_line() {
        assert_eq!(
            script("# header\n_RNvCs*_3foo\nbar) } /DISCARD/ : { *(\n"),
            Err("3: ')' cannot be in a function's name".to_owned())
        );
    }
}
