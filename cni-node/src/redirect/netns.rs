//! Running netlink work inside a pod's network namespace ([`mesh_capture::netns::run_in`]),
//! telling a namespace that is gone from one that cannot be entered.

use std::path::Path;

use mesh_capture::netns::{self, EnterError};

use super::RedirectError;

/// What entering `path` found.
#[derive(Debug)]
pub(super) enum Entered<R> {
    /// `f` ran inside the namespace and returned this.
    Ran(R),
    /// The namespace is gone (the path does not exist any more).
    Gone,
}

/// Runs `f` inside the network namespace at `path` (on the calling thread, which goes back
/// into its own namespace afterwards). Nothing runs (and
/// the error names `path`) when `path` is not a network namespace.
pub(super) fn run_in<R, F>(path: &Path, f: F) -> Result<Entered<R>, RedirectError>
where
    F: FnOnce() -> Result<R, RedirectError>,
{
    match netns::run_in(path, f) {
        Ok(result) => result.map(Entered::Ran),
        Err(error) if error.is_gone() => Ok(Entered::Gone),
        Err(error) => Err(error.into()),
    }
}

impl From<EnterError> for RedirectError {
    fn from(error: EnterError) -> Self {
        match error {
            EnterError::Open { path, source } => RedirectError::Netns { path, source },
            EnterError::NotNetns { path, source } => RedirectError::NotNetns { path, source },
            EnterError::Setns { path, source } => RedirectError::Setns { path, source },
            EnterError::Home { path, source } => RedirectError::HomeNetns { path, source },
        }
    }
}
