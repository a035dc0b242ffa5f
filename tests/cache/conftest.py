"""Stores to test the cache on: a directory, ``memory://``, and S3 through s3fs against moto's S3 API server on
the loopback interface (as s3fs's own tests run it), started once for the session."""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import uuid
from pathlib import Path

import pytest

from aot.cache.key import BuildKey
from aot.directory.manifest import describe_files, write_manifest

BUCKET = "aot-cache-test"
_AWS_TEST_ENVIRONMENT = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="session")
def s3_endpoint():
    """``http://127.0.0.1:PORT`` of an S3 API server holding the bucket ``BUCKET``."""
    from moto.server import ThreadedMotoServer

    saved = {name: os.environ.get(name) for name in _AWS_TEST_ENVIRONMENT}
    os.environ.update(_AWS_TEST_ENVIRONMENT)  # never a real account's: the server accepts any
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    import s3fs

    s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True).mkdir(BUCKET)
    yield endpoint
    server.stop()
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(params=["directory", "memory", "s3"])
def store_location(request, tmp_path) -> tuple[str, dict]:
    """``(url, fsspec options)`` of an empty store of each kind."""
    if request.param == "directory":
        return str(tmp_path / "cache"), {}
    if request.param == "memory":
        return f"memory://aot-cache-{uuid.uuid4().hex}", {}
    return f"s3://{BUCKET}/{uuid.uuid4().hex}", {"endpoint_url": request.getfixturevalue("s3_endpoint")}


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def fake_build(root: Path, seed: str = "a") -> Path:
    """A directory that passes aot's integrity check as a build's does (files listed in a manifest), built in ms."""
    (root / "graph_module").mkdir(parents=True)
    weights = b"".join(hashlib.sha256(f"{seed} {row}".encode()).digest() for row in range(512))  # 16 KiB, no two pieces alike
    (root / "graph_module" / "weights.safetensors").write_bytes(weights)
    (root / "model.onnx").write_bytes(b"onnx " + seed.encode() * 100)
    (root / "config.json").write_text('{"model_type": "bert"}\n')  # the same in every fake build: a shared blob
    manifest = {"manifest_version": 1, "name": f"fake-{seed}", "recipe": {"path": "fake.yaml", "sha256": "0" * 64},
                "artifacts": describe_files(root)}
    write_manifest(root, manifest)
    return root


def fake_key(seed: str = "a") -> BuildKey:
    return BuildKey(hashlib.sha256(f"key {seed}".encode()).hexdigest(), {"recipe": {"name": f"fake-{seed}"}})


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
