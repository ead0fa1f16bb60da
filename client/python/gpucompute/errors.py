"""Exceptions: every failure the server reports carries its gRPC code and message.
They are made here, in the client, from the call's status; nothing here calls the
server."""

from __future__ import annotations

from typing import Optional, Union

import grpc

from ._types import Message

_CODES_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


class Error(Exception):
    """A call the server (or the channel) answered with an error.

    `code` is the grpc.StatusCode, `details` the server's message. A failed operation
    raises this too, with the code and message the operation carries.
    """

    # Set on the errors of calls (from_rpc_error): the replica that serves the tenant,
    # where a replica refused the call for that reason, else None.
    redirect_address: Optional[str]

    def __init__(self, code: grpc.StatusCode, details: str,
                 operation: Optional[Message] = None) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details
        # The failed Operation message, for an operation that failed after it was
        # queued; None for a rejected call.
        self.operation = operation


class InvalidArgumentError(Error, ValueError):
    """Malformed request: shapes, dtypes, byte ranges, expressions."""


class NotFoundError(Error, LookupError):
    """An unknown or deleted buffer, stream or operation."""


class AlreadyExistsError(Error):
    """A buffer name the client already uses."""


class ResourceExhaustedError(Error, MemoryError):
    """Beyond the server's memory limit, or a per-client limit."""


class FailedPreconditionError(Error):
    """E.g. deleting the default stream, or profiling on the CPU backend."""


class UnavailableError(Error, ConnectionError):
    """The server is unreachable, or refuses work after its backend failed."""


class DeadlineExceededError(Error, TimeoutError):
    """The call's timeout passed."""


class UnauthenticatedError(Error):
    """The server requires a token (or a client certificate) and the call had none, or
    one it does not know. The message never repeats the token."""


class PermissionDeniedError(Error):
    """The caller's tenant may not do this, e.g. trim memory pools without an admin
    token."""


_CLASSES = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
}


def error_for(code: Union[grpc.StatusCode, int], details: str,
              operation: Optional[Message] = None) -> Error:
    """The exception for a grpc.StatusCode (or its number) and message (made here, not
    raised)."""
    if not isinstance(code, grpc.StatusCode):
        code = _CODES_BY_NUMBER.get(code, grpc.StatusCode.UNKNOWN)
    return _CLASSES.get(code, Error)(code, details, operation)


def from_rpc_error(error: grpc.RpcError) -> Error:
    """Converts a grpc.RpcError (sync or grpc.aio) to an Error. A replica's refusal of
    a call for a tenant it does not serve carries the address of the one that does, as
    redirect_address (else None), which the clients follow."""
    result = error_for(error.code(), error.details() or "")
    result.redirect_address = None
    if error.code() == grpc.StatusCode.FAILED_PRECONDITION:
        try:
            trailers = error.trailing_metadata() or ()
        except Exception:  # noqa: BLE001 - a call without trailers
            trailers = ()
        for key, value in trailers:
            if key == "gpucompute-redirect-address":
                result.redirect_address = value
    return result
