#!/usr/bin/env python3
"""Builds the mesh's container images without a container engine.

Each image is one layer holding the binaries, the shared libraries they load (as `ldd` finds
them on this machine) with their Debian copyright files, and a minimal /etc, written as an image archive that both
`docker load -i <image>.tar` and `ctr images import <image>.tar` read: an OCI image layout
(oci-layout, index.json, blobs/sha256/...) with Docker's manifest.json beside it.

  build-images.py --bin-dir target/release --out images/ [--hub localhost/mesh] [--tag 0.1.0]

Images (named as the charts name them, tagged <tag> and <tag>-distroless):
  pilot        istiod, waypoint-controller      entrypoint istiod
  ztunnel      ztunnel                          entrypoint ztunnel
  install-cni  cni-node, istio-cni              entrypoint cni-node
  proxyv2      pilot-agent, envoy               entrypoint pilot-agent (ENVOY_PATH set)
"""

import argparse
import hashlib
import io
import json
import os
import platform
import shutil
import re
import subprocess
import sys
import tarfile

IMAGES = {
    "pilot": {"bins": ["istiod", "waypoint-controller"], "entrypoint": "istiod", "user": "1337"},
    "ztunnel": {"bins": ["ztunnel"], "entrypoint": "ztunnel", "user": "0"},
    "install-cni": {"bins": ["cni-node", "istio-cni"], "entrypoint": "cni-node", "user": "0"},
    "proxyv2": {"bins": ["pilot-agent", "envoy"], "entrypoint": "pilot-agent", "user": "1337"},
}
BIN = "usr/local/bin"
ENV = ["PATH=/usr/local/bin:/usr/bin:/bin", "ENVOY_PATH=/usr/local/bin/envoy"]


# The layer holds this machine's binaries and libraries: the image is for its architecture.
ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64"}


class ImageError(Exception):
    pass


def shared_libraries(path):
    """The files the dynamic loader maps for `path` (the loader itself included)."""
    out = subprocess.run(["ldd", path], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        if "not a dynamic executable" in out.stdout + out.stderr:
            return []
        raise ImageError(f"ldd {path}: {out.stderr.strip() or out.stdout.strip()}")
    libs = []
    for line in out.stdout.splitlines():
        if "not found" in line:
            raise ImageError(f"{path} needs a library this machine lacks: {line.strip()}")
        m = re.search(r"(/\S+) \(0x", line)
        if m:
            libs.append(m.group(1))
    return libs


def copyright_file(lib):
    """The Debian copyright file of the package that ships `lib` (the licence travels with it)."""
    out = subprocess.run(["dpkg", "-S", os.path.realpath(lib)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        out = subprocess.run(["dpkg", "-S", lib], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return None
    package = out.stdout.split(":", 1)[0].strip()
    path = f"/usr/share/doc/{package}/copyright"
    return path if os.path.isfile(path) else None


def add_file(tar, arcname, data, mode):
    info = tarfile.TarInfo(arcname)
    info.size = len(data)
    info.mode = mode
    info.mtime = 0
    tar.addfile(info, io.BytesIO(data))


def add_dir(tar, arcname, mode=0o755):
    info = tarfile.TarInfo(arcname)
    info.type = tarfile.DIRTYPE
    info.mode = mode
    info.mtime = 0
    tar.addfile(info)


def layer(files):
    """An uncompressed, reproducible layer: {path in image: (bytes, mode)}."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = set()
        for path in files:
            parts = path.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                dirs.add("/".join(parts[:i]))
        for d in sorted(dirs | {"tmp", "etc"}):
            add_dir(tar, d, 0o1777 if d == "tmp" else 0o755)
        for path in sorted(files):
            data, mode = files[path]
            add_file(tar, path, data, mode)
    return buf.getvalue()


def image_files(spec, bin_dir, envoy):
    files = {
        "etc/passwd": (b"root:x:0:0:root:/root:/sbin/nologin\nistio-proxy:x:1337:1337::/tmp:/sbin/nologin\n", 0o644),
        "etc/group": (b"root:x:0:\nistio-proxy:x:1337:\n", 0o644),
    }
    for name in spec["bins"]:
        src = envoy if name == "envoy" else os.path.join(bin_dir, name)
        if not os.path.isfile(src):
            raise ImageError(f"{src}: no such binary (build it first: cargo build --release --bins)")
        with open(src, "rb") as f:
            files[f"{BIN}/{name}"] = (f.read(), 0o755)
        for lib in shared_libraries(src):
            with open(lib, "rb") as f:
                files[lib.lstrip("/")] = (f.read(), 0o755)
            notice = copyright_file(lib)
            if notice:
                with open(notice, "rb") as f:
                    files[notice.lstrip("/")] = (f.read(), 0o644)
    return files


def blob(blobs, data):
    digest = hashlib.sha256(data).hexdigest()
    with open(os.path.join(blobs, digest), "wb") as f:
        f.write(data)
    return f"sha256:{digest}", len(data)


def build(name, spec, bin_dir, envoy, out, hub, tag):
    files = image_files(spec, bin_dir, envoy)
    work = os.path.join(out, f".{name}")
    shutil.rmtree(work, ignore_errors=True)  # what an interrupted run left
    blobs = os.path.join(work, "blobs", "sha256")
    os.makedirs(blobs, exist_ok=True)
    layer_digest, layer_size = blob(blobs, layer(files))
    machine = platform.machine()
    if machine not in ARCHITECTURES:
        raise ImageError(f"no image architecture for this machine ({machine})")
    config = {
        "architecture": ARCHITECTURES[machine],
        "os": "linux",
        "config": {
            "Entrypoint": [f"/{BIN}/{spec['entrypoint']}"],
            "Env": ENV,
            "User": spec["user"],
            "WorkingDir": "/",
        },
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "history": [{"created_by": "scripts/build-images.py"}],
    }
    config_digest, config_size = blob(blobs, json.dumps(config, sort_keys=True).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config_size},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest, "size": layer_size}],
    }
    manifest_digest, manifest_size = blob(blobs, json.dumps(manifest, sort_keys=True).encode())
    tags = [f"{hub}/{name}:{tag}", f"{hub}/{name}:{tag}-distroless"]
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest,
                "size": manifest_size,
                "annotations": {"io.containerd.image.name": t, "org.opencontainers.image.ref.name": t.rsplit(":", 1)[1]},
            }
            for t in tags
        ],
    }
    docker_manifest = [{
        "Config": f"blobs/sha256/{config_digest.split(':')[1]}",
        "RepoTags": tags,
        "Layers": [f"blobs/sha256/{layer_digest.split(':')[1]}"],
    }]
    path = os.path.join(out, f"{name}.tar")
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for arcname, data in [
            ("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
            ("index.json", json.dumps(index, sort_keys=True).encode()),
            ("manifest.json", json.dumps(docker_manifest).encode()),
        ]:
            add_file(tar, arcname, data, 0o644)
        add_dir(tar, "blobs")
        add_dir(tar, "blobs/sha256")
        for digest in sorted(os.listdir(blobs)):
            with open(os.path.join(blobs, digest), "rb") as f:
                add_file(tar, f"blobs/sha256/{digest}", f.read(), 0o644)
    shutil.rmtree(work)
    return path, tags


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin-dir", required=True, help="where the mesh's binaries are")
    parser.add_argument("--out", required=True, help="where <image>.tar files go")
    parser.add_argument("--hub", default="localhost/mesh")
    parser.add_argument("--tag", default="0.1.0")
    parser.add_argument("--envoy", default=os.environ.get("ENVOY_PATH", "/opt/mesh-deps/envoy-1.40.0/envoy/_bin/envoy"))
    parser.add_argument("--only", nargs="*", choices=sorted(IMAGES), help="build only these images")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    try:
        for name in args.only or sorted(IMAGES):
            path, tags = build(name, IMAGES[name], args.bin_dir, args.envoy, args.out, args.hub, args.tag)
            print(f"{path}\t{' '.join(tags)}")
    except (ImageError, OSError) as e:
        sys.stderr.write(f"build-images: {e}\n")
        sys.exit(1)


if __name__ == "__main__":
    main()
