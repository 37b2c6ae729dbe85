//! Logging setup: `tracing` to stderr, `LOG_FORMAT=json|plain`, filter from `RUST_LOG`.

use std::sync::{Arc, Mutex};

use tracing_subscriber::{fmt, EnvFilter};

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
    apply: Arc<dyn Fn(EnvFilter) -> Result<(), String> + Send + Sync>,
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
        (self.apply)(parsed).map_err(TelemetryError::BadFilter)?;
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = filter.trim().to_string();
        Ok(())
    }
}

fn parse_filter(filter: &str) -> Result<EnvFilter, TelemetryError> {
    EnvFilter::try_new(filter.trim()).map_err(|e| TelemetryError::BadFilter(e.to_string()))
}

/// [`init`], also returning a handle that changes the filter at run time.
pub fn init_with_control() -> Result<(LogFormat, LogControl), TelemetryError> {
    let format = LogFormat::parse(std::env::var(LOG_FORMAT_ENV).ok().as_deref())?;
    let initial = match std::env::var("RUST_LOG") {
        Ok(v) if !v.trim().is_empty() => v.trim().to_string(),
        _ => "info".to_string(),
    };
    let filter = parse_filter(&initial)?;
    type Apply = Arc<dyn Fn(EnvFilter) -> Result<(), String> + Send + Sync>;
    let (result, apply): (_, Apply) = match format {
        LogFormat::Json => {
            let builder = fmt()
                .json()
                .flatten_event(true)
                .with_env_filter(filter)
                .with_writer(std::io::stderr)
                .with_filter_reloading();
            let handle = builder.reload_handle();
            (
                builder.try_init(),
                Arc::new(move |f| handle.reload(f).map_err(|e| e.to_string())),
            )
        }
        LogFormat::Plain => {
            let builder = fmt()
                .with_env_filter(filter)
                .with_writer(std::io::stderr)
                .with_filter_reloading();
            let handle = builder.reload_handle();
            (
                builder.try_init(),
                Arc::new(move |f| handle.reload(f).map_err(|e| e.to_string())),
            )
        }
    };
    result.map_err(|_| TelemetryError::AlreadyInstalled)?;
    let control = LogControl {
        current: Arc::new(Mutex::new(initial)),
        apply,
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
}
