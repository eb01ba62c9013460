"""`docker save` and `docker load` of the lab runtime: an image as a tar stream, and back.

The lab's images have no layers of their own (every container runs the lab image directory),
so an image is modelled as an OCI layout, as Docker 25+ writes it:
  oci-layout, index.json   the image's name and its registry digest (annotations)
  manifest.json            docker's legacy index: Config, RepoTags, Layers
  blobs/sha256/<layer>     one layer: a tar of the lab image directory (its content)
  blobs/sha256/<config>    the config; its sha256 IS the image ID (as in docker)
`load` checks every blob against its name (sha256), the config against the layer (diff_ids),
and refuses a stream that is cut short or altered; then it registers the image with the same
ID the saving node showed and, as Docker's classic image store does, no registry digest
(RepoDigests stays empty until the node pulls the image itself). A registry blocked by the lab
fault `block-registry` does not matter to either (neither talks to a registry).

`docker manifest inspect IMAGE` is the client asking the image's registry for its manifest (no
layer downloaded): the catalog's digest as an OCI index with one linux/arm64 entry; with
`block-registry` it fails as the real client does without DNS/route to the registry, and for an
image the catalog lacks with the registry's "no such manifest".
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import tarfile

from sparklab_dockerd_run import split_flags
from sparklab_dockerd_state import (
    IMAGES,
    DockerError,
    config_blob,
    image_dir,
    image_record,
    node_digest,
    normalize_image,
    now_iso,
    read_json,
    registry_blocked,
    registry_unreachable,
    stored_digest,
    write_json,
)


def layer_tar() -> bytes:
    """The lab image directory as a reproducible tar (same bytes on every node)."""
    buf = io.BytesIO()
    root = image_dir()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for base, dirs, files in sorted(os.walk(root)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                path = os.path.join(base, name)
                info = tar.gettarinfo(path, arcname=os.path.relpath(path, root))
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                with open(path, "rb") as f:
                    tar.addfile(info, f)
    return buf.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644
    tar.addfile(info, io.BytesIO(data))


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def cmd_save(args: list[str]) -> int:
    opts, rest = split_flags(args, {"-o", "--output", "--platform"}, set(), "save")
    output = next((v for f, v in opts if f in ("-o", "--output")), None)
    if len(rest) != 1:
        raise DockerError('"docker save" requires exactly 1 argument (sparklab: one image).', 1)
    name = normalize_image(rest[0])
    rec = image_record(name)
    if rec is None:
        raise DockerError(f"Error response from daemon: reference does not exist: {rest[0]}", 1)
    if output is None and sys.stdout.isatty():
        raise DockerError("cowardly refusing to save to a terminal. Use the -o flag or "
                          "redirect", 1)
    digest = stored_digest(name, read_json(f"{IMAGES}/{name.replace('/', '+')}.json"))
    layer = layer_tar()
    config = config_blob(name, digest)
    manifest = json.dumps([{"Config": f"blobs/sha256/{sha(config)}", "RepoTags": [name],
                            "Layers": [f"blobs/sha256/{sha(layer)}"]}]).encode()
    index = json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": digest, "annotations": {"io.containerd.image.name": name,
                                          "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]},
        "config": "sha256:" + sha(config)}]}).encode()
    target = open(output, "wb") if output else sys.stdout.buffer  # noqa: SIM115
    with tarfile.open(fileobj=target, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        _add(tar, "index.json", index)
        _add(tar, "manifest.json", manifest)
        _add(tar, f"blobs/sha256/{sha(layer)}", layer)
        _add(tar, f"blobs/sha256/{sha(config)}", config)
    if output:
        target.close()
    return 0


def read_stream(source: object) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=source, mode="r|") as tar:
            for member in tar:
                if member.isfile():
                    handle = tar.extractfile(member)
                    files[member.name] = handle.read() if handle else b""
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise DockerError(f"Error processing tar file({exc}): unexpected EOF", 1) from None
    return files


def cmd_load(args: list[str]) -> int:
    opts, rest = split_flags(args, {"-i", "--input", "--platform"}, {"-q", "--quiet"}, "load")
    source_path = next((v for f, v in opts if f in ("-i", "--input")), None)
    if rest:
        raise DockerError('"docker load" accepts no arguments.', 1)
    if source_path is None and sys.stdin.isatty():
        raise DockerError("requested load from stdin, but stdin is empty", 1)
    source = open(source_path, "rb") if source_path else sys.stdin.buffer  # noqa: SIM115
    files = read_stream(source)
    for path, data in files.items():
        if path.startswith("blobs/sha256/") and sha(data) != path.rsplit("/", 1)[1]:
            raise DockerError(f"Error processing tar file: invalid digest for {path}: "
                              f"content has sha256:{sha(data)}", 1)
    try:
        entry = json.loads(files["manifest.json"])[0]
        index = json.loads(files["index.json"])["manifests"][0]
        config = files[entry["Config"]]
        layers = [files[layer] for layer in entry["Layers"]]
    except (KeyError, IndexError, ValueError) as exc:
        raise DockerError(f"Error processing tar file: missing or bad {exc} "
                          "(not a docker save stream)", 1) from None
    name, digest = entry["RepoTags"][0], index["digest"]
    if not layers or config != config_blob(name, digest):
        raise DockerError("Error processing tar file: the config does not match the image "
                          f"{name}@{digest}", 1)
    os.makedirs(IMAGES, exist_ok=True)
    write_json(f"{IMAGES}/{name.replace('/', '+')}.json",
               {"name": name, "digest": digest, "pulled": now_iso(), "loaded": True,
                "id": "sha256:" + sha(config)})
    if ("-q", None) not in opts and ("--quiet", None) not in opts:
        print(f"Loaded image: {name}")
    return 0


def cmd_manifest(args: list[str]) -> int:
    if args[:1] != ["inspect"]:
        raise DockerError('Usage:  docker manifest COMMAND (sparklab: only "inspect")', 1)
    _, rest = split_flags(args[1:], set(), {"-v", "--verbose", "--insecure"}, "manifest inspect")
    if len(rest) != 1:
        raise DockerError('"docker manifest inspect" requires 1 or 2 arguments '
                          "(sparklab: one image).", 1)
    name = normalize_image(rest[0])
    if registry_blocked():
        raise DockerError(registry_unreachable(name), 1)
    digest = node_digest(name)
    if digest is None:
        raise DockerError(f"no such manifest: {name}", 1)
    print(json.dumps({"schemaVersion": 2,
                      "mediaType": "application/vnd.oci.image.index.v1+json",
                      "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                                     "digest": digest, "size": 1234,
                                     "platform": {"architecture": "arm64", "os": "linux"}}]},
                     indent=3))
    return 0
