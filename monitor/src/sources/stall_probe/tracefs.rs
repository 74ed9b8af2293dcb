//! tracefs: finding (and if need be mounting) it, and reading tracepoint field offsets from the
//! `format` files, since offsets move between kernels.
use std::path::{Path, PathBuf};

const CANDIDATES: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

#[derive(Debug, thiserror::Error)]
pub enum TracefsError {
    #[error("tracefs is not mounted at /sys/kernel/tracing and mounting it failed: {0} (run `mount -t tracefs nodev /sys/kernel/tracing`)")]
    NotMounted(std::io::Error),
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: no field {field:?}")]
    NoField { path: PathBuf, field: String },
}

/// A tracepoint field's place in the record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FieldLayout {
    pub offset: u32,
    pub size: u32,
}

fn populated(p: &Path) -> bool {
    p.join("events").is_dir()
}

/// Returns the tracefs mount point, mounting it at `/sys/kernel/tracing` when it is not mounted
/// anywhere (this needs CAP_SYS_ADMIN; the agent runs as root).
pub fn ensure_mounted() -> Result<PathBuf, TracefsError> {
    if let Some(p) = CANDIDATES.iter().map(Path::new).find(|p| populated(p)) {
        return Ok(p.to_owned());
    }
    let target = Path::new(CANDIDATES[0]);
    let c = |s: &str| std::ffi::CString::new(s).expect("no NUL in constant");
    let (source, dir, fstype) = (c("nodev"), c(CANDIDATES[0]), c("tracefs"));
    // SAFETY: valid NUL-terminated strings; no data argument.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            dir.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(TracefsError::NotMounted(std::io::Error::last_os_error()));
    }
    tracing::info!(path = %target.display(), "mounted tracefs");
    Ok(target.to_owned())
}

/// Reads `field`'s offset and size from `<tracefs>/events/<category>/<event>/format`.
pub fn field_layout(
    tracefs: &Path,
    category: &str,
    event: &str,
    field: &str,
) -> Result<FieldLayout, TracefsError> {
    let path = tracefs
        .join("events")
        .join(category)
        .join(event)
        .join("format");
    let text = std::fs::read_to_string(&path).map_err(|source| TracefsError::Read {
        path: path.clone(),
        source,
    })?;
    parse_field(&text, field).ok_or(TracefsError::NoField {
        path,
        field: field.to_owned(),
    })
}

/// Finds `field` in a format file's text. Lines look like
/// `\tfield:long prev_state;\toffset:24;\tsize:8;\tsigned:1;`.
pub fn parse_field(text: &str, field: &str) -> Option<FieldLayout> {
    text.lines().find_map(|line| {
        let mut parts = line.trim().split(';').map(str::trim);
        let decl = parts.next()?.strip_prefix("field:")?;
        // the name is the last word of the declaration, before any array suffix
        let name = decl.rsplit(' ').next()?.split('[').next()?;
        if name != field {
            return None;
        }
        let mut offset = None;
        let mut size = None;
        for p in parts {
            if let Some(v) = p.strip_prefix("offset:") {
                offset = v.parse().ok();
            } else if let Some(v) = p.strip_prefix("size:") {
                size = v.parse().ok();
            }
        }
        Some(FieldLayout {
            offset: offset?,
            size: size?,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // sched_switch's format on kernel 6.18 (the development machine).
    const SCHED_SWITCH: &str = "name: sched_switch
ID: 316
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t prev_pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:int prev_prio;\toffset:28;\tsize:4;\tsigned:1;
\tfield:long prev_state;\toffset:32;\tsize:8;\tsigned:1;
\tfield:char next_comm[16];\toffset:40;\tsize:16;\tsigned:0;
";

    #[test]
    fn finds_fields() {
        assert_eq!(
            parse_field(SCHED_SWITCH, "prev_state"),
            Some(FieldLayout {
                offset: 32,
                size: 8
            })
        );
        assert_eq!(
            parse_field(SCHED_SWITCH, "prev_comm"),
            Some(FieldLayout {
                offset: 8,
                size: 16
            })
        );
        assert_eq!(parse_field(SCHED_SWITCH, "prev"), None);
    }
}
