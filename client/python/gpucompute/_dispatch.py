"""The one path by which the array layer (gpucompute._lazy and its functions) reaches the
server: submit() for operations, call() for the other RPCs it makes (CreateBuffer), and
release() for buffers whose arrays were garbage collected.

submit() sends through one session per client (SessionService.Session, see
gpucompute._session), opened with the first operation: it returns a Pending at once,
whose `ref` ("tag:<t>") names the output in later operations of the same session, so a
loop of dependent operations costs no round trip each. Pending.buffer_id() waits for the
operation and gives the buffer's id, for anything outside the session (downloads, the
client's eval, deletes); Pending.result() gives the finished Operation or raises its
gpucompute.Error. The client's own calls that read or write buffers (downloads, deletes,
uploads into a buffer, submit, synchronize) first wait until the session has answered
every operation sent so far (wait_idle), so they see its writes.

Lifetime: the outputs are the session's temporaries, deleted by the server when the
session ends (Client.close()), and sooner when their arrays are collected; named
outputs persist.
"""

import threading

from ._operations import output_of
from ._proto import v1
from ._session import Session

# Called with (client, SubmitRequest, Pending) for each operation submitted: tests count
# kernels here.
observers = []

_lock = threading.Lock()

# `program`: the gpucompute._program trace this thread is recording, if any. While it is
# set, submit() records operations into the trace's chain instead of sending them.
tracing = threading.local()


def refuse_in_trace(what):
    """Raises the trace's TypeError naming `what` while this thread traces a program."""
    trace = getattr(tracing, "program", None)
    if trace is not None:
        raise trace.refusal(what)


def reference(pending):
    """The reference of `pending`'s output in the array layer's next request: while a
    program is traced, a session's output is named by its buffer id (a chain does not
    know the session's tags)."""
    if getattr(tracing, "program", None) is not None and not getattr(pending, "traced", False) \
            and pending.ref.startswith("tag:"):
        return pending.buffer_id()
    return pending.ref


class Done:
    """A buffer the server made at once (CreateBuffer), with the Pending's interface."""

    def __init__(self, info):
        self.info = info
        self.ref = info.id

    def buffer_id(self):
        return self.ref

    def done(self):
        return True

    def result(self):
        return None


def info_of(pending):
    """The output's BufferInfo (waits for the operation)."""
    return pending.info if isinstance(pending, Done) else output_of(pending.result())


def _session(client):
    session = client._array_session
    if session is None or session._closing or session._ended:
        with _lock:
            session = client._array_session
            if session is None or session._closing or session._ended:
                session = client._array_session = Session(client)
    return session


def submit(client, request):
    """Sends a SubmitRequest through the client's session; returns its Pending."""
    trace = getattr(tracing, "program", None)
    if trace is not None:
        return trace.record(client, request)
    _flush_released(client)
    # Operations sent through the client's own futures reach the server first.
    client._submissions.wait_idle()
    pending = _session(client).submit(request)
    client._array_last = pending
    for observer in observers:
        observer(client, request, pending)
    return pending


def call(client, method, request):
    """Makes a unary call of the array layer (CreateBuffer)."""
    refuse_in_trace("creating an array (zeros, ones, full, arange, ...)")
    _flush_released(client)
    return client._call(method, request)


def wait_idle(client):
    """Waits until the session has answered every operation sent so far."""
    session = client._array_session
    if session is not None and not session._ended:
        session.wait()


def release(client_ref, pending):
    """Queues the output of `pending` for deletion with a later call through this
    module. Runs in finalizers, so it never blocks and never calls the server."""
    client = client_ref()
    if client is not None and not getattr(pending, "traced", False):
        # Operations already sent may still read the buffer; nothing sent later can
        # (the array is gone). The session runs on one stream, in order, so the buffer
        # is free once the last operation sent by now is answered.
        client._released.append((pending, client._array_last))


def _flush_released(client):
    """Deletes the released outputs that nothing sent may still read, without waiting
    for the deletes; the others wait for a later call. The queue is in release order and
    the session answers in order, so the first one still needed ends the scan."""
    queue = client._released
    while queue:
        try:
            pending, last = queue[0]
        except IndexError:
            break
        if not pending.done() or (last is not None and not last.done()):
            break
        queue.popleft()
        try:
            request = v1.DeleteBufferRequest(buffer=pending.buffer_id())
            call = client._rpc.DeleteBuffer.future(request, metadata=client.options.metadata,
                                                   timeout=client.options.timeout)
            # gRPC cancels a call whose future is dropped, so it is held until it ends.
            # Its answer is not read: failed, already deleted or the server gone, nothing
            # is left to free.
            client._deleting.add(call)
            call.add_done_callback(client._deleting.discard)
        except Exception:  # pylint: disable=broad-except
            pass  # the operation failed (no buffer) or the channel is closed


def close(client):
    """Frees what was released and ends the session (its temporaries with it); the
    failures of operations whose results nobody asked for are not raised."""
    session = client._array_session
    if session is not None:
        try:
            session.wait()
        except Exception:  # pylint: disable=broad-except
            pass
    _flush_released(client)
    if session is not None:
        client._array_session = None
        try:
            session.close()
        except Exception:  # pylint: disable=broad-except
            pass  # unobserved failures, or the server gone: nothing is left to do


def flush(client):
    """Deletes the released outputs now (those whose operations are answered), and waits
    until the server has answered those deletes."""
    wait_idle(client)
    _flush_released(client)
    for call in list(client._deleting):
        try:
            call.result()
        except Exception:  # pylint: disable=broad-except
            pass  # failed, already deleted, or the server gone: nothing is left to free
