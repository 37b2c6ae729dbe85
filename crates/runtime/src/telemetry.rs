//! Logging setup: `tracing` to stderr, `LOG_FORMAT=json|plain`, filter from `RUST_LOG`.

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
    let format = LogFormat::parse(std::env::var(LOG_FORMAT_ENV).ok().as_deref())?;
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.trim().is_empty() => {
            EnvFilter::try_new(v).map_err(|e| TelemetryError::BadFilter(e.to_string()))?
        }
        _ => EnvFilter::new("info"),
    };
    let builder = fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Plain => builder.try_init(),
    };
    result.map_err(|_| TelemetryError::AlreadyInstalled)?;
    Ok(format)
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
