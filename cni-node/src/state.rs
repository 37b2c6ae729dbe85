//! The agent's record of the pods it knows, kept in `<state dir>/pods.json` so a restarted
//! agent can re-apply capture and hand the pods to ztunnel again.
//!
//! In Kubernetes istio-cni keeps this in the pod annotation `ambient.istio.io/redirection`
//! and finds netns by scanning `/proc`; without an API server to write to, the agent keeps
//! the status ([`Redirection`]) here along with each pod's netns path and IPs (from the CNI
//! ADD). Writes go to a temporary file that is synced and renamed over the old one, so a
//! crash leaves either the old or the new file, never half of one.
//!
//! [`procscan`] finds the netns of pods by their UID in `/proc/<pid>/cgroup`, as upstream does
//! for pods that were running before the agent; the agent uses it for selected pods it has no
//! record of (see `agent`).

pub mod procscan;

use std::fmt;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The state file name inside the state directory.
pub const STATE_FILE: &str = "pods.json";
/// Format version of the file.
pub const STATE_VERSION: u32 = 1;

/// The `ambient.istio.io/redirection` status of a pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Redirection {
    /// Capture is being applied, or ztunnel has not acked yet.
    Pending,
    /// Capture in place and ztunnel has the pod.
    Enabled,
}

impl fmt::Display for Redirection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Redirection::Pending => "pending",
            Redirection::Enabled => "enabled",
        })
    }
}

/// One pod the agent knows (enrolled or not).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRecord {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    #[serde(default)]
    pub service_account: String,
    /// The pod's network namespace (`CNI_NETNS`, or `/proc/<pid>/ns/net`).
    pub netns: PathBuf,
    /// The namespace's inode when it was recorded: a `/proc/<pid>/ns/net` path whose pid was
    /// reused names another namespace, which must not be captured on restore.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns_inode: Option<u64>,
    #[serde(default)]
    pub ips: Vec<IpAddr>,
    /// DNS capture as applied (or to apply).
    #[serde(default)]
    pub dns_capture: bool,
    /// Inbound capture left out (`ambient.istio.io/bypass-inbound-capture`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub bypass_inbound: bool,
    /// `None` = not enrolled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirection: Option<Redirection>,
    /// The redirector that applied the capture (`nftables`, `ebpf`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirector: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
struct StateDoc {
    version: u32,
    pods: Vec<PodRecord>,
}

/// Why the state could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("cannot {op} the agent state {path}: {source}; is the state directory (AGENT_STATE_DIR) writable?")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the agent state {path} is not valid: {source}; move it away to start from an empty state (running pods are enrolled again by their labels)")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "the agent state {path} has version {found}; this agent reads version {STATE_VERSION}"
    )]
    Version { path: PathBuf, found: u32 },
}

impl StateError {
    /// Short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            StateError::Io { .. } => "io",
            StateError::Parse { .. } => "parse",
            StateError::Version { .. } => "version",
        }
    }
}

/// The state file of one agent.
#[derive(Clone, Debug)]
pub struct StateStore {
    dir: PathBuf,
}

impl StateStore {
    pub fn new(dir: impl Into<PathBuf>) -> StateStore {
        StateStore { dir: dir.into() }
    }

    /// The file's path.
    pub fn path(&self) -> PathBuf {
        self.dir.join(STATE_FILE)
    }

    /// The recorded pods; none if the file does not exist.
    pub fn load(&self) -> Result<Vec<PodRecord>, StateError> {
        let path = self.path();
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(StateError::Io {
                    op: "read",
                    path,
                    source,
                })
            }
        };
        let doc: StateDoc = serde_json::from_slice(&bytes).map_err(|source| StateError::Parse {
            path: path.clone(),
            source,
        })?;
        if doc.version != STATE_VERSION {
            return Err(StateError::Version {
                path,
                found: doc.version,
            });
        }
        Ok(doc.pods)
    }

    /// Replaces the file with `pods` (write to a temporary file, rename: readers see the old
    /// or the new file, never a torn one). No fsync: the file only has to outlive the agent
    /// process, not the machine -- after a reboot every pod netns it describes is gone anyway
    /// (and its default home, /var/run, is tmpfs) -- while an fsync costs milliseconds on the
    /// CNI ADD path of every pod.
    pub fn save<'a>(
        &self,
        pods: impl IntoIterator<Item = &'a PodRecord>,
    ) -> Result<(), StateError> {
        let path = self.path();
        let io = |op, source| StateError::Io {
            op,
            path: path.clone(),
            source,
        };
        let doc = StateDoc {
            version: STATE_VERSION,
            pods: pods.into_iter().cloned().collect(),
        };
        let mut bytes = serde_json::to_vec_pretty(&doc).map_err(|source| StateError::Parse {
            path: path.clone(),
            source,
        })?;
        bytes.push(b'\n');
        std::fs::create_dir_all(&self.dir).map_err(|e| io("create the directory of", e))?;
        let tmp = self.dir.join(format!(".{STATE_FILE}.tmp"));
        let mut file = std::fs::File::create(&tmp).map_err(|e| io("create", e))?;
        file.write_all(&bytes).map_err(|e| io("write", e))?;
        std::fs::rename(&tmp, &path).map_err(|e| io("rename into place", e))?;
        Ok(())
    }
}

/// The pods as a table (`cni-node status`): namespace, name, uid, IPs, redirection status
/// (`-` = not enrolled), redirector and netns.
pub fn render_table(pods: &[PodRecord]) -> String {
    let header = [
        "NAMESPACE",
        "NAME",
        "UID",
        "IPS",
        "REDIRECTION",
        "REDIRECTOR",
        "NETNS",
    ];
    let rows: Vec<[String; 7]> = pods
        .iter()
        .map(|p| {
            let ips: Vec<String> = p.ips.iter().map(ToString::to_string).collect();
            [
                p.namespace.clone(),
                p.name.clone(),
                p.uid.clone(),
                if ips.is_empty() {
                    "-".to_string()
                } else {
                    ips.join(",")
                },
                p.redirection.map_or("-".to_string(), |r| r.to_string()),
                p.redirector.clone().unwrap_or_else(|| "-".to_string()),
                p.netns.display().to_string(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let padded: Vec<String> = cells.zip(widths).map(|(c, w)| format!("{c:<w$}")).collect();
        out.push_str(padded.join("  ").trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for row in &rows {
        line(&mut row.iter().map(String::as_str));
    }
    out
}

/// The inode of the namespace a path names now, if it exists.
pub fn netns_inode(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| m.ino())
}

/// Whether the record's netns is still the pod's: it exists and, when its inode was
/// recorded, is the same namespace.
pub fn netns_still_the_pods(record: &PodRecord) -> bool {
    match (netns_inode(&record.netns), record.netns_inode) {
        (None, _) => false,
        (Some(now), Some(then)) => now == then,
        (Some(_), None) => true,
    }
}

#[cfg(test)]
mod tests;
