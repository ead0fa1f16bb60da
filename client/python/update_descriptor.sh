#!/usr/bin/env bash
# Regenerates gpucompute/gpucompute_v1.binpb, the FileDescriptorSet of the API that the
# package builds its message classes from at run time. Run it after changing the .proto;
# tests/test_descriptor.py fails while the shipped file is stale.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/../.."
protoc --proto_path="$root/proto" --include_imports \
  --descriptor_set_out="$here/gpucompute/gpucompute_v1.binpb" gpucompute/v1/gpucompute.proto
