"""The gpucompute.v1 message classes, built at import from the shipped descriptor.

No generated `_pb2` module is checked in: generated code is tied to the protobuf
version that generated it, and this package runs on protobuf 3.21 (Debian 12) as on
protobuf 5 to 7. `gpucompute_v1.binpb` is the FileDescriptorSet that protoc writes
for proto/gpucompute/v1/gpucompute.proto (`update_descriptor.sh` regenerates it); the
classes are made from it in a private descriptor pool, so they never clash with
generated code for the same file that a program may also import.
"""

import importlib.resources
import types

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "gpucompute.v1"
DESCRIPTOR_FILE = "gpucompute_v1.binpb"


def _load_pool():
    data = importlib.resources.files(__package__).joinpath(DESCRIPTOR_FILE).read_bytes()
    file_set = descriptor_pb2.FileDescriptorSet.FromString(data)
    pool = descriptor_pool.DescriptorPool()
    # protoc lists each file after the files it imports.
    for file_proto in file_set.file:
        pool.AddSerializedFile(file_proto.SerializeToString())
    return pool


def _message_class_maker(pool):
    # GetMessageClass is new (protobuf 4.22+); MessageFactory.GetPrototype, its
    # predecessor, is gone from protobuf 5 on.
    get_message_class = getattr(message_factory, "GetMessageClass", None)
    if get_message_class is not None:
        return get_message_class
    return message_factory.MessageFactory(pool).GetPrototype


def _build_namespace():
    pool = _load_pool()
    make_class = _message_class_maker(pool)
    file_descriptor = pool.FindFileByName("gpucompute/v1/gpucompute.proto")
    namespace = types.SimpleNamespace()
    for name, descriptor in file_descriptor.message_types_by_name.items():
        setattr(namespace, name, make_class(descriptor))
    for name, enum in file_descriptor.enum_types_by_name.items():
        setattr(namespace, name, types.SimpleNamespace(
            **{value.name: value.number for value in enum.values}))
        for value in enum.values:
            setattr(namespace, value.name, value.number)
    namespace.DESCRIPTOR = file_descriptor
    namespace.POOL = pool  # descriptors need their pool alive
    return namespace


# `v1.SubmitRequest`, `v1.DTYPE_FLOAT64`, `v1.DType.DTYPE_FLOAT64`, ... as in
# generated code.
v1 = _build_namespace()


def enum_name(enum_type, number):
    """The name of an enum value, e.g. enum_name("DType", 2) == "DTYPE_FLOAT64"."""
    enum = v1.DESCRIPTOR.enum_types_by_name[enum_type]
    value = enum.values_by_number.get(number)
    return value.name if value is not None else str(number)
