//! Logging setup: `tracing` to stderr, `LOG_FORMAT=json|plain`, filter from `RUST_LOG`.
//!
//! The filter is a list of `target=level` directives and at most one bare default level
//! (`info`, `warn,ztunnel::proxy=debug`, `off`); a target matches itself and every module
//! below it. Span and field directives (`target[span{field}]=level`) are refused by name:
//! their matcher would put a regular-expression engine into every binary, and it is a large
//! share of a proxy's resident code when idle.

use std::sync::{Arc, Mutex};

use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, reload, Layer, Registry};

/// Environment variable choosing the log format.
pub const LOG_FORMAT_ENV: &str = "LOG_FORMAT";

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Plain,
    Json,
}

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("LOG_FORMAT={0:?} is not valid: use \"plain\" or \"json\"")]
    BadFormat(String),
    #[error("RUST_LOG is not a valid filter: {0}")]
    BadFilter(String),
    #[error("a global logger is already installed")]
    AlreadyInstalled,
}

impl TelemetryError {
    pub fn reason(&self) -> &'static str {
        match self {
            TelemetryError::BadFormat(_) => "bad_format",
            TelemetryError::BadFilter(_) => "bad_filter",
            TelemetryError::AlreadyInstalled => "already_installed",
        }
    }
}

impl LogFormat {
    /// Parses a `LOG_FORMAT` value; unset or empty means plain.
    pub fn parse(value: Option<&str>) -> Result<LogFormat, TelemetryError> {
        match value.map(str::trim) {
            None | Some("") | Some("plain") | Some("text") => Ok(LogFormat::Plain),
            Some("json") => Ok(LogFormat::Json),
            Some(other) => Err(TelemetryError::BadFormat(other.to_string())),
        }
    }
}

/// Installs the global subscriber from `LOG_FORMAT` and `RUST_LOG` (default `info`).
pub fn init() -> Result<LogFormat, TelemetryError> {
    init_with_control().map(|(format, _)| format)
}

/// Changes the log filter of the running process (admin `/logging`).
#[derive(Clone)]
pub struct LogControl {
    current: Arc<Mutex<String>>,
    handle: reload::Handle<Targets, Registry>,
}

impl std::fmt::Debug for LogControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogControl")
            .field("current", &self.current())
            .finish()
    }
}

impl LogControl {
    /// The filter in force, as `RUST_LOG` would spell it.
    pub fn current(&self) -> String {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replaces the filter (`debug`, `info,access=debug`, ...). A bad filter changes nothing.
    pub fn set(&self, filter: &str) -> Result<(), TelemetryError> {
        let parsed = parse_filter(filter)?;
        self.handle
            .reload(parsed)
            .map_err(|e| TelemetryError::BadFilter(e.to_string()))?;
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = filter.trim().to_string();
        Ok(())
    }
}

fn parse_filter(filter: &str) -> Result<Targets, TelemetryError> {
    let filter = filter.trim();
    let bad = |why: &str| TelemetryError::BadFilter(format!("{filter:?}: {why}"));
    if filter.contains(['[', ']', '{', '}']) {
        return Err(bad(
            "span and field directives are not supported; use target=level pairs",
        ));
    }
    // Empty directives (`info,`) are skipped, as they always were; `Targets` would read one as
    // the level `error`.
    let directives: Vec<&str> = filter
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect();
    let defaults = directives
        .iter()
        .filter(|d| d.parse::<tracing_subscriber::filter::LevelFilter>().is_ok())
        .count();
    if defaults > 1 {
        return Err(bad("more than one default level"));
    }
    directives
        .join(",")
        .parse::<Targets>()
        .map_err(|e| bad(&e.to_string()))
}

/// The output layer for a format, boxed so one subscriber type serves both.
fn output<S>(format: LogFormat) -> Box<dyn Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let layer = fmt::layer()
        .with_writer(std::io::stderr)
        .log_internal_errors(true);
    match format {
        LogFormat::Json => layer.json().flatten_event(true).boxed(),
        LogFormat::Plain => layer.boxed(),
    }
}

/// [`init`], also returning a handle that changes the filter at run time.
pub fn init_with_control() -> Result<(LogFormat, LogControl), TelemetryError> {
    let format = LogFormat::parse(std::env::var(LOG_FORMAT_ENV).ok().as_deref())?;
    let initial = match std::env::var("RUST_LOG") {
        Ok(v) if !v.trim().is_empty() => v.trim().to_string(),
        _ => "info".to_string(),
    };
    let (filter, handle) = reload::Layer::<Targets, Registry>::new(parse_filter(&initial)?);
    tracing_subscriber::registry()
        .with(filter)
        .with(output(format))
        .try_init()
        .map_err(|_| TelemetryError::AlreadyInstalled)?;
    let control = LogControl {
        current: Arc::new(Mutex::new(initial)),
        handle,
    };
    Ok((format, control))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_formats() {
        assert_eq!(LogFormat::parse(None).expect("unset"), LogFormat::Plain);
        assert_eq!(
            LogFormat::parse(Some("json")).expect("json"),
            LogFormat::Json
        );
        let err = LogFormat::parse(Some("xml")).expect_err("xml");
        assert!(err.to_string().contains("\"xml\""), "{err}");
    }

    #[test]
    fn parses_filters() {
        for good in [
            "info",
            "off",
            "warn,ztunnel::proxy=debug",
            "access=debug",
            " debug ",
        ] {
            parse_filter(good).unwrap_or_else(|e| panic!("{good:?}: {e}"));
        }
        // An empty directive is skipped, not read as `error`.
        let trailing = parse_filter("info,").expect("trailing comma");
        assert!(trailing.would_enable("ztunnel::proxy", &tracing::Level::INFO));
        let doubled = parse_filter("warn,,access=debug").expect("double comma");
        assert!(doubled.would_enable("ztunnel::dns", &tracing::Level::WARN));
        assert!(doubled.would_enable("access", &tracing::Level::DEBUG));
        let err = parse_filter("info,debug").expect_err("two defaults");
        assert!(
            err.to_string().contains("more than one default level"),
            "{err}"
        );
        let targets = parse_filter("warn,ztunnel::proxy=debug").expect("pairs");
        assert!(targets.would_enable("ztunnel::proxy::inbound", &tracing::Level::DEBUG));
        assert!(!targets.would_enable("ztunnel::dns", &tracing::Level::INFO));
        assert!(targets.would_enable("ztunnel::dns", &tracing::Level::WARN));
        for bad in ["info,x=loud", "ztunnel[conn{id=1}]=debug"] {
            let err = parse_filter(bad).expect_err(bad);
            assert_eq!(err.reason(), "bad_filter");
            assert!(err.to_string().contains(bad), "{err}");
        }
    }
}
