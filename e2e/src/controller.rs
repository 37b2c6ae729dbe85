//! The waypoint controller as a process, writing into a cluster's objects directory.

use std::process::Command;
use std::time::Duration;

use mesh_testutil::netns::ChildGuard;

use crate::bins::binary;
use crate::cluster::MeshCluster;

/// A running `waypoint-controller`; stopped when dropped.
pub struct WaypointController {
    log: tempfile::NamedTempFile,
    child: Option<ChildGuard>,
}

impl std::fmt::Debug for WaypointController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WaypointController").finish()
    }
}

impl WaypointController {
    /// Starts the controller on `c`'s objects directory (in the first node's namespace; it
    /// needs no network).
    pub fn start(c: &MeshCluster) -> WaypointController {
        let log = tempfile::NamedTempFile::new().expect("controller log");
        let mut cmd = Command::new(binary("waypoint-controller"));
        cmd.arg("--config-dir")
            .arg(c.objects().path())
            .env("LOG_FORMAT", "plain")
            .env("RUST_LOG", "info");
        let child = crate::process::spawn_logged(c.nodes[0].node.netns(), &mut cmd, log.path());
        WaypointController {
            log,
            child: Some(child),
        }
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    /// SIGTERM and a bounded wait.
    pub fn stop(&mut self) {
        crate::process::terminate(self.child.take(), Duration::from_secs(5));
    }
}

impl Drop for WaypointController {
    fn drop(&mut self) {
        self.stop();
    }
}
