//! A GET from inside a network namespace (admin, metrics, readiness), on the test harness's
//! hyper client.

use std::net::SocketAddr;
use std::time::Duration;

use mesh_testutil::{http_request, Netns};

/// How long one GET may take, connection included (readiness loops retry).
const TIMEOUT: Duration = Duration::from_secs(5);

/// `GET path` to `addr` from `netns`: `(status, body)`, or `None` if nothing answered.
pub fn get(netns: &Netns, addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    http_request(netns, addr, "GET", path, &[], TIMEOUT)
        .map(|response| (response.status, response.body))
}
