"""The shipped descriptor is what protoc makes of the .proto today."""

import os
import shutil
import subprocess

import pytest
from google.protobuf import descriptor_pb2

import gpucompute
from gpucompute import _proto

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_DIR = os.path.dirname(gpucompute.__file__)
PROTO_ROOT = os.path.join(HERE, "..", "..", "..", "proto")


def test_shipped_descriptor_is_current(tmp_path):
    protoc = shutil.which("protoc")
    if protoc is None:
        pytest.skip("protoc is not installed")
    fresh = tmp_path / "fresh.binpb"
    subprocess.run([protoc, f"--proto_path={PROTO_ROOT}", "--include_imports",
                    f"--descriptor_set_out={fresh}", "gpucompute/v1/gpucompute.proto"],
                   check=True)
    with open(os.path.join(PACKAGE_DIR, _proto.DESCRIPTOR_FILE), "rb") as f:
        shipped = descriptor_pb2.FileDescriptorSet.FromString(f.read())
    regenerated = descriptor_pb2.FileDescriptorSet.FromString(fresh.read_bytes())
    assert shipped == regenerated, (
        "client/python/gpucompute/gpucompute_v1.binpb is stale: run "
        "client/python/update_descriptor.sh")


def test_every_rpc_of_the_proto_has_a_method():
    from gpucompute._connection import _SERVICE_METHODS
    services = _proto.v1.DESCRIPTOR.services_by_name
    assert set(services) == set(_SERVICE_METHODS)
    for name, service in services.items():
        assert set(service.methods_by_name) == set(_SERVICE_METHODS[name])
