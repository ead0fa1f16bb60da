"""How both clients connect: the options and their checks, the token and TLS
credentials, the channel's arguments, and the multi-callables of the services.

Nothing here makes an RPC; client.py and aio.py do, each in its own style.
"""

import copy
import numbers
import os

import grpc

from ._proto import v1
from ._transfers import decode_download

CLIENT_METADATA_KEY = "gpucompute-client"
MAX_CLIENT_NAME_BYTES = 128
# The server's largest message (Limits.max_message_bytes of the reference server) and
# the room a chunk leaves for the framing around it, as in the C++ client.
MAX_MESSAGE_BYTES = 64 << 20
CHUNK_OVERHEAD_BYTES = 64 << 10
MAX_CHUNK_BYTES = MAX_MESSAGE_BYTES - CHUNK_OVERHEAD_BYTES
DEFAULT_CHUNK_BYTES = 4 << 20
TOKEN_ENVIRONMENT = "GPUCOMPUTE_TOKEN"
# Replicas: the tenant a proxy routes on, and where a replica that does not serve it
# says it is served (gpucompute/v1/limits.h).
TENANT_METADATA_KEY = "gpucompute-tenant"
TENANT_ENVIRONMENT = "GPUCOMPUTE_TENANT"
MAX_TENANT_NAME_BYTES = 64
REDIRECT_ADDRESS_KEY = "gpucompute-redirect-address"
TRANSPORTS = ("auto", "grpc", "shm")
# Messages the channel accepts beyond the server's limit: a download chunk of the full
# limit plus its framing and the buffer info.
_MESSAGE_SLACK_BYTES = 1 << 20

_SERVICE_METHODS = {
    "BufferService": ("CreateBuffer", "Upload", "BeginUpload", "Download", "GetBuffer",
                      "ListBuffers", "DeleteBuffer", "RenewLease"),
    "StreamService": ("CreateStream", "DeleteStream", "SynchronizeStream", "ListStreams"),
    "OperationService": ("Submit", "GetOperation", "WaitOperation"),
    "ServerService": ("GetServerInfo", "GetStats", "TrimMemoryPool", "StartProfiler",
                      "StopProfiler"),
    "SharedMemoryService": ("RegisterRegion", "UnregisterRegion", "ListRegions",
                            "CopyFromRegion", "CopyToRegion", "ExportBuffer"),
    "SessionService": ("Session", "RunChain"),
}


class Options:
    """Connection options, checked as the C++ client checks them.

    client_name: sent as the "gpucompute-client" metadata when not empty (the server
      calls a client without it "default"); buffer names and listings are per client.
    chunk_bytes: upload chunk size, clamped to MAX_CHUNK_BYTES. A server run with a
      smaller --max-message-bytes refuses larger chunks and reports its bound in
      info().limits.max_chunk_bytes; the default always fits it.
    timeout: seconds each unary call may take (None: no limit). Uploads and downloads
      have none: they take as long as the data takes.
    progress: the default for transfers' `progress` argument (see make_progress).
    token: sent as the metadata "authorization: Bearer TOKEN" with every call, streams
      included (a server with a tokens file requires one; it names the tenant). None
      takes $GPUCOMPUTE_TOKEN; "" sends none. token_file: read it instead from the
      first line of this file. Neither the token nor its file's contents appear in
      any message or repr.
    tls: None (the default) connects with TLS when any tls_* option is given; True
      always, verifying the server with the system's CAs unless tls_ca is given;
      False never (and then no tls_* option may be given).
    tls_ca, tls_cert, tls_key: PEM, each a path or the PEM bytes themselves: the CA
      that verifies the server; the client's certificate chain and its private key
      for mutual TLS (both or neither). Files are read once, here.
    tls_server_name: the name the server's certificate must carry, instead of the
      host of `target`, and the name sent as SNI: a proxy's SNI route routes
      "TENANT.SUFFIX" to the tenant's replica (docs/operations.md, "Scaling out").
    tenant: sent as the "gpucompute-tenant" metadata with every call when not empty:
      the tenant the token or certificate names, which a proxy in front of several
      replicas routes on (a server refuses any other name with PermissionDeniedError).
      None takes $GPUCOMPUTE_TENANT; "" sends none.
    transport: the default for put() and get(): "auto" (shared memory when the server
      allows it and runs on this host, else gRPC), "grpc" or "shm" (see _shm).
    shm_max_bytes: the most the shared-memory segment may grow to; 0 lets it grow to
      the largest transfer. Larger transfers move through it in pieces.
    """

    def __init__(self, target, *, client_name=None, chunk_bytes=DEFAULT_CHUNK_BYTES,
                 timeout=None, progress=None, token=None, token_file=None, tls=None,
                 tls_ca=None, tls_cert=None, tls_key=None, tls_server_name=None,
                 transport="auto", shm_max_bytes=0, tenant=None):
        if not target:
            raise ValueError("the server address is empty")
        client_name = client_name or ""
        if not _printable(client_name, MAX_CLIENT_NAME_BYTES):
            raise ValueError(f"the client name must be at most {MAX_CLIENT_NAME_BYTES} "
                             "printable ASCII characters")
        if timeout is not None and not timeout > 0:
            raise ValueError("the call timeout must be positive (or None for no limit)")
        if not isinstance(chunk_bytes, numbers.Integral) or chunk_bytes < 0:
            raise ValueError("chunk_bytes must be a non-negative integer")
        if not isinstance(shm_max_bytes, numbers.Integral) or shm_max_bytes < 0:
            raise ValueError("shm_max_bytes must be a non-negative integer")
        self.target = target
        self.client_name = client_name
        self.chunk_bytes = min(int(chunk_bytes) or DEFAULT_CHUNK_BYTES, MAX_CHUNK_BYTES)
        self.timeout = timeout
        self.progress = progress
        self.transport = transport_name(transport)
        self.shm_max_bytes = int(shm_max_bytes)
        self.tls_server_name = tls_server_name or None
        # Set on the options of a replica a redirect led to (redirected).
        self._verified_name = None
        self.credentials = _channel_credentials(tls, tls_ca, tls_cert, tls_key,
                                                self.tls_server_name)
        metadata = [(CLIENT_METADATA_KEY, client_name)] if client_name else []
        token = _token(token, token_file)
        if token:
            metadata.append(("authorization", "Bearer " + token))
        if tenant is None:
            tenant = os.environ.get(TENANT_ENVIRONMENT, "")
        if not isinstance(tenant, str) or not _printable(tenant, MAX_TENANT_NAME_BYTES):
            raise ValueError(f"the tenant must be at most {MAX_TENANT_NAME_BYTES} printable "
                             "ASCII characters")
        self.tenant = tenant
        if tenant:
            metadata.append((TENANT_METADATA_KEY, tenant))
        self.metadata = tuple(metadata)

    def redirected(self, address):
        """These options with `address` as the target: where a replica said the tenant is
        served. TLS goes on verifying the name the first target was verified by."""
        options = copy.copy(self)
        options.target = address
        if options.credentials is not None and not options.tls_server_name:
            options._verified_name = self._verified_name or _host(self.target)
        return options

    @property
    def tls(self):
        return self.credentials is not None

    @property
    def has_token(self):
        return any(key == "authorization" for key, _ in self.metadata)

    def __repr__(self):
        # Never the token.
        return (f"<Options target={self.target!r} client_name={self.client_name!r} "
                f"tls={self.tls} token={'set' if self.has_token else 'none'} "
                f"transport={self.transport!r}>")

    def progress_for(self, progress):
        """A transfer's progress setting: its own, or the client's default."""
        return self.progress if progress is None else progress

    def transport_for(self, transport):
        """A call's transport: its own, or the client's default."""
        return self.transport if transport is None else transport_name(transport)

    def channel_arguments(self):
        limit = MAX_MESSAGE_BYTES + _MESSAGE_SLACK_BYTES
        # A subchannel pool of the channel's own: each Client then has a connection of
        # its own, where gRPC would share one among the process's channels to a target.
        arguments = [("grpc.max_send_message_length", limit),
                     ("grpc.max_receive_message_length", limit),
                     ("grpc.use_local_subchannel_pool", 1)]
        name = self.tls_server_name or self._verified_name
        if name:
            arguments.append(("grpc.ssl_target_name_override", name))
        return arguments

    def open_channel(self, grpc_module, channel_options=()):
        """A channel of `grpc_module` (grpc or grpc.aio: they make channels alike) to
        the target, with TLS when configured."""
        arguments = self.channel_arguments() + list(channel_options)
        if self.credentials is None:
            return grpc_module.insecure_channel(self.target, options=arguments)
        return grpc_module.secure_channel(self.target, self.credentials, options=arguments)

    def wait_slice_seconds(self):
        """How long one WaitOperation may ask the server to wait, within the timeout."""
        return self.timeout / 2 if self.timeout is not None else 0.0


def _host(target):
    """The host of "HOST:PORT", "[V6]:PORT" or "dns:///HOST:PORT"."""
    target = target.split(":///", 1)[-1]
    if target.startswith("["):
        return target[1:target.find("]")]
    return target.rsplit(":", 1)[0]


def follow_redirect(client, error, grpc_module, channel_options):
    """Reconnects `client` (either client: options, _channel, _rpc, _replaced) to the
    replica that `error` (an Error) names as its tenant's, once in the client's life.
    Returns whether it did; the call that was refused may then be made again. The
    replaced channel stays open for calls still on it, until the client closes."""
    address = getattr(error, "redirect_address", None)
    if not address or client._replaced:
        return False
    client._replaced.append(client._channel)
    client.options = client.options.redirected(address)
    client._channel = client.options.open_channel(grpc_module, channel_options)
    client._rpc = Methods(client._channel)
    return True


def _printable(text, max_length):
    """Metadata values the server accepts: at most max_length printable ASCII characters."""
    return len(text) <= max_length and all(0x20 <= ord(c) <= 0x7E for c in text)


def _token(token, token_file):
    """The bearer token: `token`, else the first line of `token_file`, else
    $GPUCOMPUTE_TOKEN; "" for none. Messages never quote it: gRPC's own error for a
    malformed metadata value would."""
    if token is not None and token_file is not None:
        raise ValueError("give token or token_file, not both")
    source = "the token"
    if token_file is not None:
        source = f"the token in {os.fspath(token_file)}"
        try:
            with open(token_file, encoding="utf-8", errors="replace") as file:
                token = file.readline().strip()
        except OSError as error:
            raise ValueError(f"cannot read the token file {os.fspath(token_file)}: "
                             f"{error.strerror}") from None
        if not token:
            raise ValueError(f"the token file {os.fspath(token_file)} is empty")
    elif token is None:
        source = f"the token in ${TOKEN_ENVIRONMENT}"
        token = os.environ.get(TOKEN_ENVIRONMENT, "")
    if not isinstance(token, str):
        raise TypeError(f"the token must be a str, not {type(token).__name__}")
    # No limit on the length: the server's tokens file has none.
    if not _printable(token, len(token)):
        raise ValueError(f"{source} must be one line of printable ASCII characters")
    return token


def _pem(what, value):
    """PEM bytes from a path or from the bytes themselves."""
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    try:
        with open(value, "rb") as file:
            return file.read()
    except OSError as error:
        raise ValueError(f"cannot read {what} {os.fspath(value)}: {error.strerror}") from None


def _channel_credentials(tls, ca, cert, key, server_name):
    """grpc.ChannelCredentials for TLS, or None for plaintext."""
    given = [name for name, value in (("tls_ca", ca), ("tls_cert", cert), ("tls_key", key),
                                      ("tls_server_name", server_name)) if value is not None]
    if tls is None:
        tls = bool(given)
    if not tls:
        if given:
            raise ValueError(f"{', '.join(given)} need TLS, which tls=False turns off")
        return None
    if (cert is None) != (key is None):
        raise ValueError("a TLS client certificate and its key go together: give both "
                         "tls_cert and tls_key or neither")
    return grpc.ssl_channel_credentials(root_certificates=_pem("the TLS CA", ca),
                                        private_key=_pem("the TLS key", key),
                                        certificate_chain=_pem("the TLS certificate", cert))


def transport_name(transport):
    if transport not in TRANSPORTS:
        raise ValueError(f"transport is 'auto', 'grpc' or 'shm', not {transport!r}")
    return transport


class Methods:
    """The multi-callables of the services on one channel (blocking or grpc.aio:
    both channels make them the same way). Upload takes messages serialized by
    upload_messages and Download yields decode_download's pairs, so chunks skip a
    protobuf copy each way; Session and RunChain take serialized messages too."""

    def __init__(self, channel):
        for service, methods in _SERVICE_METHODS.items():
            for method in methods:
                path = f"/{v1.DESCRIPTOR.package}.{service}/{method}"
                descriptor = v1.DESCRIPTOR.services_by_name[service].methods_by_name[method]
                request = getattr(v1, descriptor.input_type.name)
                response = getattr(v1, descriptor.output_type.name)
                if method == "Upload":
                    callable_ = channel.stream_unary(
                        path, request_serializer=None, response_deserializer=response.FromString)
                elif method == "RunChain":
                    # Takes the bytes a Chain serialized once (_chain).
                    callable_ = channel.unary_unary(
                        path, request_serializer=None, response_deserializer=response.FromString)
                elif method == "Session":
                    # Takes messages serialized by _session (operations serialized
                    # once, when submitted, and joined).
                    callable_ = channel.stream_stream(
                        path, request_serializer=None,
                        response_deserializer=response.FromString)
                elif method == "Download":
                    callable_ = channel.unary_stream(
                        path, request_serializer=request.SerializeToString,
                        response_deserializer=decode_download)
                else:
                    callable_ = channel.unary_unary(
                        path, request_serializer=request.SerializeToString,
                        response_deserializer=response.FromString)
                setattr(self, method, callable_)
