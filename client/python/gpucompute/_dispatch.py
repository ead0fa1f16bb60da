"""The one path by which the array layer (gpucompute._lazy and its functions) reaches the
server: submit() for operations, call() for the other RPCs it makes (CreateBuffer), and
release() for buffers whose arrays were garbage collected.

submit() sends a unary Submit with wait=False: the reply names the output buffer at
once, so later requests can read it before it is written (the server runs one client's
default stream in order). The operation's own error, if it fails while running, is
raised by Pending.result(), which every download of the array calls first.
"""

import threading

from ._proto import v1
from ._operations import finished, output_of

# Called with (client, Operation) for each operation submitted: tests count kernels here.
observers = []


class Pending:
    """An operation sent to the server and its output buffer.

    ref: the reference to its output in later requests sent through this module;
    buffer_id(): the output's buffer id (for anything else: downloads, eval, deletes);
    info: the output's BufferInfo as the server answered the submission;
    result(): the finished Operation (blocks; raises the operation's gpucompute.Error).
    """

    def __init__(self, client, operation):
        self._client = client
        self._operation = operation
        self._lock = threading.Lock()
        self.info = output_of(operation)
        self.ref = self.info.id

    def buffer_id(self):
        return self.ref

    def done(self):
        """Whether the operation is known to be finished (asks nothing)."""
        return self._operation.done

    def result(self):
        with self._lock:
            operation = self._operation
            while not operation.done:
                request = v1.WaitOperationRequest(
                    operation_id=operation.id,
                    timeout_seconds=self._client.options.wait_slice_seconds())
                operation = self._client._call("WaitOperation", request)
            self._operation = operation
        return finished(operation)


class Done(Pending):
    """A buffer the server made at once (CreateBuffer), as a finished Pending."""

    def __init__(self, info, operation=None):  # pylint: disable=super-init-not-called
        self._operation = operation
        self.info = info
        self.ref = info.id

    def done(self):
        return True

    def result(self):
        return self._operation


def _flush_released(client):
    queue = _released_queue(client)
    while queue:
        try:
            buffer_id = queue.popleft()
        except IndexError:
            return
        try:
            client._call("DeleteBuffer", v1.DeleteBufferRequest(buffer=buffer_id))
        except Exception:  # pylint: disable=broad-except
            pass  # already deleted, or the server is gone: nothing is left to free


def submit(client, request):
    """Sends a SubmitRequest without waiting for the operation; returns its Pending."""
    _flush_released(client)
    message = v1.SubmitRequest()
    message.CopyFrom(request)
    message.wait = False
    # Operations sent through the client's own futures reach the server first.
    client._submissions.wait_idle()
    operation = client._call("Submit", message)
    for observer in observers:
        observer(client, operation)
    return Pending(client, operation)


def call(client, method, request):
    """Makes a unary call of the array layer (CreateBuffer, GetBuffer)."""
    _flush_released(client)
    return client._call(method, request)


def _released_queue(client):
    # Client.__init__ makes the deque: a finalizer only appends to it (thread-safe).
    return client._released


def release(client_ref, buffer_id):
    """Queues a buffer for deletion with the next call through this module (or
    flush()). Runs in finalizers, so it never blocks and never calls the server."""
    client = client_ref()
    if client is not None:
        _released_queue(client).append(buffer_id)


def flush(client):
    """Deletes the buffers queued by release() now (Client.close calls it)."""
    _flush_released(client)
