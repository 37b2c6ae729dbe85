//! `install-cni`: puts the `istio-cni` plugin on the node and chains it into the node's primary
//! CNI configuration, as Istio's installer does; and takes exactly that back out.
//!
//! - The plugin binary is copied into the host's CNI bin dir atomically (a temporary file in
//!   the same directory, then a rename), mode 0755.
//! - The primary configuration is the first file, in lexical order, under the net.d directory
//!   named `*.conf` or `*.conflist` that is valid: it parses, a `.conf` has a `type`, a
//!   `.conflist` has at least one plugin. `CNI_CONF_NAME` picks one by name instead.
//! - A `.conf` becomes `{"name": "k8s-pod-network", "cniVersion": "0.3.1", "plugins": [<the
//!   original>, <istio-cni>]}` written as `<stem>.conflist` (the `.conf` is removed); in a
//!   `.conflist` any earlier `istio-cni` entry is replaced by the new one, appended last.
//! - Writes are atomic and keep the file's mode.
//! - Uninstall removes only the `istio-cni` entry (a conflist made from a `.conf` stays a
//!   conflist, as with Istio), the plugin's kubeconfig and its binary.
//! - In a pod, the plugin's kubeconfig is written from the service account (`kubeconfig`).
//! - `repair` keeps all of this in place for as long as the installer runs.

mod conflist;
pub mod kubeconfig;
pub mod repair;

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde_json::Value;

pub use conflist::{chain, choose_primary, unchain, CHAINED_NAME, PLUGIN_TYPE};
pub use kubeconfig::ServiceAccount;

/// What and where to install.
#[derive(Debug, Clone)]
pub struct InstallOptions {
    /// The host's CNI configuration directory (`/host/etc/cni/net.d`).
    pub net_dir: PathBuf,
    /// The host's CNI plugin directory (`/host/opt/cni/bin`).
    pub bin_dir: PathBuf,
    /// The `istio-cni` binary to copy.
    pub plugin_binary: PathBuf,
    /// `CNI_CONF_NAME`: the primary file by name, instead of the lexical choice.
    pub conf_name: Option<String>,
    /// The plugin's configuration entry (`type: istio-cni` and its settings).
    pub entry: Value,
    /// Where the plugin's kubeconfig goes, and the service account it is made from.
    pub kubeconfig: Option<(PathBuf, ServiceAccount)>,
}

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no valid CNI configuration (*.conf, *.conflist) in {dir} yet; the primary CNI plugin writes one")]
    NoPrimary { dir: PathBuf },
    #[error("{path}: {problem}")]
    Invalid { path: PathBuf, problem: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> InstallError + '_ {
    move |source| InstallError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes `bytes` to `path` atomically with permission bits `mode`.
fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), InstallError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!(".{name}.istio-tmp"));
    let mut f = fs::File::create(&tmp).map_err(io(&tmp))?;
    f.write_all(bytes).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(mode)).map_err(io(&tmp))?;
    fs::rename(&tmp, path).map_err(io(path))
}

fn mode_of(path: &Path) -> u32 {
    fs::metadata(path).map_or(0o644, |m| m.permissions().mode() & 0o7777)
}

fn json_bytes(v: &Value) -> Vec<u8> {
    let mut out = serde_json::to_vec_pretty(v).unwrap_or_default();
    out.push(b'\n');
    out
}

/// Installs the binary, the kubeconfig and the chained configuration; returns the file the
/// plugin is chained in.
pub fn install(opts: &InstallOptions) -> Result<PathBuf, InstallError> {
    let binary = fs::read(&opts.plugin_binary).map_err(io(&opts.plugin_binary))?;
    fs::create_dir_all(&opts.bin_dir).map_err(io(&opts.bin_dir))?;
    write_atomic(&opts.bin_dir.join(PLUGIN_TYPE), &binary, 0o755)?;
    if let Some((path, account)) = &opts.kubeconfig {
        let contents = account.kubeconfig()?;
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(io(dir))?;
        }
        write_atomic(path, contents.as_bytes(), 0o600)?;
    }
    let primary = choose_primary(&opts.net_dir, opts.conf_name.as_deref())?.ok_or_else(|| {
        InstallError::NoPrimary {
            dir: opts.net_dir.clone(),
        }
    })?;
    let text = fs::read(&primary).map_err(io(&primary))?;
    let current: Value = serde_json::from_slice(&text).map_err(|e| InstallError::Invalid {
        path: primary.clone(),
        problem: e.to_string(),
    })?;
    let is_conf = primary.extension().is_some_and(|e| e == "conf");
    let merged = chain(&current, is_conf, &opts.entry);
    let mode = mode_of(&primary);
    let target = if is_conf {
        primary.with_extension("conflist")
    } else {
        primary.clone()
    };
    write_atomic(&target, &json_bytes(&merged), mode)?;
    if is_conf {
        fs::remove_file(&primary).map_err(io(&primary))?;
    }
    tracing::info!(file = %target.display(), "istio-cni chained into the primary CNI configuration");
    Ok(target)
}

/// Takes out what [`install`] put in: the `istio-cni` entry of every conflist in net.d, the
/// kubeconfig and the binary.
pub fn uninstall(opts: &InstallOptions) -> Result<(), InstallError> {
    let entries = fs::read_dir(&opts.net_dir).map_err(io(&opts.net_dir))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "conflist"))
        .collect();
    files.sort();
    for path in files {
        let Some(current) = fs::read(&path)
            .ok()
            .and_then(|t| serde_json::from_slice::<Value>(&t).ok())
        else {
            continue;
        };
        let Some(restored) = unchain(&current) else {
            continue;
        };
        write_atomic(&path, &json_bytes(&restored), mode_of(&path))?;
        tracing::info!(file = %path.display(), "istio-cni removed from the CNI configuration");
    }
    if let Some((path, _)) = &opts.kubeconfig {
        remove_if_there(path)?;
    }
    remove_if_there(&opts.bin_dir.join(PLUGIN_TYPE))
}

fn remove_if_there(path: &Path) -> Result<(), InstallError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(path)(e)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests;
