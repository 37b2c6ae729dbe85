//! scripts/build-images.py: image archives whose names are the ones the charts use, whose
//! layer carries everything the binaries load, and whose entrypoints run.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use mesh_charts::{charts_dir, repo_root, Helm, CHARTS};
use mesh_testutil::netns::have_root;
use serde_json::{json, Value};

/// Where cargo put the workspace's binaries (the test runs from `<target>/debug/deps`).
fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/debug")
        .to_path_buf();
    assert!(
        dir.join("istiod").is_file(),
        "{}: no istiod; build the binaries first (cargo build --workspace --bins)",
        dir.display()
    );
    dir
}

/// One file of a tar archive, read with tar(1).
fn read_entry(archive: &Path, wanted: &str) -> Vec<u8> {
    let out = Command::new("tar")
        .arg("-xOf")
        .arg(archive)
        .arg(wanted)
        .output()
        .expect("tar runs");
    assert!(
        out.status.success(),
        "{}: no {wanted}: {}",
        archive.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Unpacks an image's single layer into `root` with tar(1), as a runtime would.
fn unpack(archive: &Path, root: &Path) -> Value {
    let manifest: Value =
        serde_json::from_slice(&read_entry(archive, "manifest.json")).expect("manifest.json");
    let layer = manifest[0]["Layers"][0]
        .as_str()
        .expect("one layer")
        .to_string();
    let config: Value = serde_json::from_slice(&read_entry(
        archive,
        manifest[0]["Config"].as_str().expect("config"),
    ))
    .expect("config json");
    std::fs::create_dir_all(root).expect("rootfs");
    let layer_file = root.with_extension("layer.tar");
    std::fs::write(&layer_file, read_entry(archive, &layer)).expect("layer");
    let status = Command::new("tar")
        .arg("-xf")
        .arg(&layer_file)
        .arg("-C")
        .arg(root)
        .status()
        .expect("tar runs");
    assert!(status.success(), "unpacking {}", archive.display());
    json!({"manifest": manifest[0], "config": config})
}

/// The blob a descriptor names, after checking its digest and size.
fn verified_blob(archive: &Path, descriptor: &Value) -> Vec<u8> {
    let digest = descriptor["digest"].as_str().expect("digest");
    let hex = digest.strip_prefix("sha256:").expect("sha256 digest");
    let blob = read_entry(archive, &format!("blobs/sha256/{hex}"));
    let actual = Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), &blob)?;
            child.wait_with_output()
        })
        .expect("sha256sum runs");
    let actual = String::from_utf8_lossy(&actual.stdout);
    assert_eq!(actual.split_whitespace().next(), Some(hex), "{digest}");
    assert_eq!(
        descriptor["size"].as_u64(),
        Some(blob.len() as u64),
        "{digest}"
    );
    blob
}

fn run_in(root: &Path, env: &[&str], args: &[&str]) -> Output {
    // chroot(8) lives in /usr/sbin, outside the PATH the image sets.
    let mut command = Command::new("/usr/sbin/chroot");
    command.arg(root).args(args).env_clear();
    for pair in env {
        if let Some((k, v)) = pair.split_once('=') {
            command.env(k, v);
        }
    }
    command.output().expect("chroot runs")
}

#[test]
fn images_carry_the_charts_names_and_their_entrypoints_run() {
    if !have_root("images_carry_the_charts_names_and_their_entrypoints_run") {
        return;
    }
    let out = tempfile::tempdir().expect("tempdir");
    let built = Command::new("python3")
        .arg(repo_root().join("scripts/build-images.py"))
        .arg("--bin-dir")
        .arg(bin_dir())
        .arg("--out")
        .arg(out.path())
        .output()
        .expect("build-images.py runs");
    assert!(
        built.status.success(),
        "build-images.py: {}",
        String::from_utf8_lossy(&built.stderr)
    );

    let mut tags = BTreeSet::new();
    let mut roots = std::collections::BTreeMap::new();
    for name in ["pilot", "ztunnel", "install-cni", "proxyv2"] {
        let archive = out.path().join(format!("{name}.tar"));
        let root = out.path().join(format!("{name}-root"));
        let image = unpack(&archive, &root);
        for tag in image["manifest"]["RepoTags"].as_array().expect("tags") {
            tags.insert(tag.as_str().expect("tag").to_string());
        }
        let index: Value =
            serde_json::from_slice(&read_entry(&archive, "index.json")).expect("index.json");
        assert_eq!(
            index["manifests"].as_array().map(Vec::len),
            Some(2),
            "{name}"
        );
        // Every descriptor names its blob by the blob's own digest and size, as `ctr import`
        // and `docker load` check them.
        let manifest_blob = verified_blob(&archive, &index["manifests"][0]);
        let manifest: Value = serde_json::from_slice(&manifest_blob).expect("image manifest");
        verified_blob(&archive, &manifest["config"]);
        verified_blob(&archive, &manifest["layers"][0]);
        let arch = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            other => other,
        };
        assert_eq!(image["config"]["architecture"], arch, "{name}");
        assert_eq!(
            image["config"]["rootfs"]["diff_ids"][0], manifest["layers"][0]["digest"],
            "{name}: an uncompressed layer's diff id is its digest"
        );
        let entrypoint = image["config"]["config"]["Entrypoint"][0]
            .as_str()
            .expect("entrypoint");
        assert!(
            root.join(entrypoint.trim_start_matches('/')).is_file(),
            "{name}: {entrypoint}"
        );
        roots.insert(name, root);
    }

    // Every image the charts name, with and without the ambient profile, is built.
    let helm = Helm::default();
    for chart in CHARTS {
        for values in [json!({}), json!({"profile": "ambient"})] {
            let rendered = helm
                .render(&charts_dir().join(chart), chart, "istio-system", &values)
                .expect("renders");
            let text = serde_json::to_string(
                &rendered
                    .objects
                    .iter()
                    .map(|o| &o.value)
                    .collect::<Vec<_>>(),
            )
            .expect("json");
            for image in text.split("\"image\":\"").skip(1) {
                let image = image.split('"').next().unwrap_or_default();
                // The gateway's proxy: the injector names the image (proxyv2).
                if image == "auto" {
                    continue;
                }
                assert!(
                    tags.contains(image),
                    "{chart} names {image}, not built: {tags:?}"
                );
            }
        }
    }

    let env = ["PATH=/usr/local/bin:/usr/bin:/bin"];
    let ok = |root: &Path, args: &[&str], wanted: &str| {
        let out = run_in(root, &env, args);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{args:?}: {text}");
        assert!(text.contains(wanted), "{args:?}: {text}");
    };
    ok(&roots["pilot"], &["istiod", "--version"], "istiod");
    ok(
        &roots["pilot"],
        &["waypoint-controller", "--help"],
        "istio-waypoint",
    );
    ok(
        &roots["install-cni"],
        &["cni-node", "--version"],
        "cni-node",
    );
    ok(&roots["proxyv2"], &["pilot-agent", "--help"], "proxy");
    ok(&roots["proxyv2"], &["envoy", "--version"], "1.40.0");
    // ztunnel reads only its environment: a bad value makes it stop, having loaded and run.
    let out = run_in(
        &roots["ztunnel"],
        &["PROXY_MODE=bogus"],
        &["/usr/local/bin/ztunnel"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("invalid configuration"),
        "{stderr}"
    );
}
