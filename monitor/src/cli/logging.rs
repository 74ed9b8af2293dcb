//! The log: stderr, text or JSON, with the `--log` directives, and a cap no directive lifts on
//! the clients whose debug events carry tenants' secrets.
use super::LogFormat;
use anyhow::{Context, Result};

/// Libraries whose debug and trace events carry tenant data, capped at INFO whatever `--log`
/// asks: bollard logs every inspect body (a container's environment: its secrets) at DEBUG, the
/// HTTP stacks headers and bodies. A filter of its own beside the directives, so that no more
/// specific directive (`bollard::docker=debug`) can raise them.
const CAPPED_AT_INFO: [&str; 5] = ["bollard", "hyper", "hyper_util", "ureq", "ureq_proto"];

/// Whether `target` is one of [`CAPPED_AT_INFO`] or a module of one.
fn capped(target: &str) -> bool {
    CAPPED_AT_INFO.iter().any(|c| {
        target
            .strip_prefix(c)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
    })
}

/// The log layer: `filter`'s directives, and the cap, over `writer`.
fn log_layer<S, W>(
    format: LogFormat,
    filter: &str,
    ansi: bool,
    writer: W,
) -> Result<Box<dyn tracing_subscriber::Layer<S> + Send + Sync>>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    use tracing_subscriber::filter::{filter_fn, FilterExt};
    use tracing_subscriber::Layer;
    let directives = tracing_subscriber::EnvFilter::try_new(filter)
        .with_context(|| format!("invalid --log filter {filter:?}"))?;
    let cap = filter_fn(|m| !capped(m.target()) || *m.level() <= tracing::Level::INFO);
    let layer = tracing_subscriber::fmt::layer()
        .with_ansi(ansi)
        .with_writer(writer);
    Ok(match format {
        LogFormat::Text => layer
            .fmt_fields(printable_fields())
            .with_filter(directives.and(cap))
            .boxed(),
        LogFormat::Json => layer.json().with_filter(directives.and(cap)).boxed(),
    })
}

/// Text lines' fields, each with its control characters shown as `\u{1b}`-style escapes: a
/// message or field carrying a tenant's name (a container, a cgroup, a library path) can neither
/// drive the terminal reading the log nor start a forged line of its own. (JSON escapes them
/// itself.)
fn printable_fields() -> impl for<'w> tracing_subscriber::fmt::FormatFields<'w> {
    use tracing_subscriber::field::MakeExt;
    tracing_subscriber::fmt::format::debug_fn(|w, field, value| {
        let text = format!("{value:?}");
        let shown = gpuwatch::output::escape::terminal(&text);
        if field.name() == "message" {
            write!(w, "{shown}")
        } else {
            write!(w, "{field}={shown}")
        }
    })
    .delimited(" ")
}

pub(crate) fn init_logging(format: LogFormat, filter: &str) -> Result<()> {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    tracing_subscriber::registry()
        .with(log_layer(format, filter, ansi, std::io::stderr)?)
        .try_init()
        .context("starting the log")
}

#[cfg(test)]
mod tests {
    use super::{log_layer, LogFormat};
    use std::sync::{Arc, Mutex};

    /// What the log layer wrote, for the test to read.
    #[derive(Clone, Default)]
    struct Written(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Written {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A tenant's control bytes in a message or a field reach a text log as escapes: the only
    /// control character left is each line's end.
    #[test]
    fn a_text_line_carries_no_control_character_but_its_end() {
        use tracing_subscriber::layer::SubscriberExt;
        let out = Written::default();
        let writer = out.clone();
        let layer = log_layer(LogFormat::Text, "info", false, move || writer.clone()).unwrap();
        let hostile = "train\x1b]0;pwned\x07\n2026-12-01T00:00:00Z ERROR forged";
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
            tracing::warn!(container = %hostile, "reading {hostile}");
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        let line = text.strip_suffix('\n').unwrap();
        assert!(!line.chars().any(char::is_control), "{line}");
        assert_eq!(
            line.matches("train\\u{1b}]0;pwned\\u{7}\\u{a}2026").count(),
            2,
            "{line}"
        );
    }

    /// No directive raises the Docker and HTTP clients' events above INFO: not the general
    /// level, not their crate, not a more specific module of it (which beat the old cap).
    #[test]
    fn no_directive_lets_the_clients_debug_events_through() {
        use tracing_subscriber::layer::SubscriberExt;
        for directive in [
            "debug",
            "trace",
            "bollard=trace",
            "bollard::docker=debug",
            "bollard::docker=trace,hyper_util::client::legacy=trace",
            "info,bollard::docker=trace,ureq=debug",
        ] {
            for format in [LogFormat::Text, LogFormat::Json] {
                let out = Written::default();
                let writer = out.clone();
                let layer = log_layer(format, directive, false, move || writer.clone()).unwrap();
                let subscriber = tracing_subscriber::registry().with(layer);
                tracing::subscriber::with_default(subscriber, || {
                    tracing::debug!(target: "bollard::docker", "AWS_SECRET_ACCESS_KEY=AKIA1");
                    tracing::trace!(target: "hyper_util::client::legacy", "authorization: AKIA2");
                    tracing::debug!(target: "ureq", "AKIA3");
                    tracing::info!(target: "bollard::docker", "connected");
                    tracing::debug!(target: "bollardish", "not a client");
                });
                let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
                assert!(!text.contains("AKIA"), "{directive}: {text}");
                assert!(
                    text.contains("connected"),
                    "{directive}: INFO passes: {text}"
                );
                if directive == "debug" || directive == "trace" {
                    assert!(text.contains("not a client"), "{directive}: {text}");
                }
            }
        }
    }
}
