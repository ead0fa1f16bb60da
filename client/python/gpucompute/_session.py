"""Sessions (SessionService.Session): many small operations without a round trip each.

A Session is one bidirectional call. submit() tags a SubmitRequest, queues it and
returns a Pending at once; gRPC's sending thread takes every operation queued since the
last message and sends them together, so a busy session costs one message per batch,
not per operation; a thread of the session's reads the answers, which the server packs
the same way, and resolves the Pendings by tag. A later operation of the same session
reads or writes an earlier one's output through its reference "tag:<t>" (Pending.ref)
before that output exists; the server orders them.

    with c.session() as s:
        y = s.eval("x + 1", x=x)          # a Pending, at once
        z = s.eval("2 * y", y=y)          # y's output, through its tag
        print(z.array().get())            # waits for z

Lifetimes (the server's rule): the new unnamed buffers a session's operations create are
its temporaries, deleted when the session ends; named outputs, and outputs written into
existing buffers, stay.
"""

from __future__ import annotations

import collections
import itertools
import threading
from types import TracebackType
from typing import Any, Optional, Type

import grpc

from . import _operations
from ._arrays import TaggedOutput, stream_ref
from ._proto import v1
from ._transfers import _varint
from ._types import Message, StreamRef
from .errors import Error, error_for, from_rpc_error

# The most serialized bytes in one message (an operation larger than this goes alone),
# far below the smallest message limit a server takes, as in the C++ client.
MAX_BATCH_BYTES = 1 << 20

_FAILED = v1.Operation.STATE_FAILED
# The one-byte varints, made once: most fields of a small operation are this short.
_SMALL_SIZES = [bytes((n,)) for n in range(0x80)]


def _field(key, payload):
    """A length-delimited protobuf field: its key byte, length and bytes."""
    size = len(payload)
    return key + (_SMALL_SIZES[size] if size < 0x80 else _varint(size)) + payload


def session_op_bytes(tag, request_bytes):
    """SessionRequest.ops entry (field 3) of a ChainStep {tag = 1, op = 2}, serialized.

    Messages of the session are these entries concatenated: the request is serialized
    once, when submitted, and never copied into a message object."""
    return _field(b"\x1a", _field(b"\x0a", tag.encode()) + _field(b"\x12", request_bytes))


def stream_suffix(stream):
    """Bytes that, appended to a serialized SubmitRequest without a stream_id, set its
    stream_id (field 1) to `stream`: a parser merges fields that come later."""
    stream_id = stream_ref(stream)
    return _field(b"\x0a", stream_id.encode()) if stream_id else b""


def _copy(error):
    """A fresh exception like `error`, for each operation it fails: an exception raised
    in several places would gather every place's traceback."""
    return error_for(error.code, error.details)


class Pending(TaggedOutput):
    """An operation of a session: its answer, once it comes.

    `ref` ("tag:<t>") names its output in later operations of the same session (pass
    the Pending itself wherever a buffer is read or written); outside the session use
    buffer_id() or array(). Every wait takes an optional `timeout` in seconds and
    raises TimeoutError when it passes. Nothing here sends anything: the waits block
    until the session's reader has the answer.
    """

    __slots__ = ("tag", "_session", "_seq", "_operation", "_error", "_observed")

    def __init__(self, session: Any, seq: int, tag: str) -> None:
        self.ref = "tag:" + tag
        self.tag = tag
        self._session = session
        self._seq = seq
        self._operation = None
        self._error = None
        self._observed = False

    def done(self) -> bool:
        """Whether the answer came (the operation finished or failed, or the session
        ended without running it); never waits."""
        return self._operation is not None or self._error is not None

    def _answered(self):
        """Called once the answer is set (the blocking session wakes its waiters
        itself)."""

    def result(self, timeout: Optional[float] = None) -> Message:
        """The finished Operation message, once answered (blocks). Raises the operation's error as a
        gpucompute.Error (FailedPreconditionError naming the tag for an operation that
        used the output of a failed one), or the error that ended the session."""
        self._session._wait_for(self, timeout)
        self._observed = True
        if self._error is not None:
            raise self._error
        return self._operation

    def exception(self, timeout: Optional[float] = None) -> Optional[Error]:
        """The error result() would raise, or None (blocks until answered)."""
        try:
            self.result(timeout)
        except Error as error:
            return error
        return None

    def buffer_id(self, timeout: Optional[float] = None) -> str:
        """The output buffer's id (waits for the answer): the buffer stands for the
        output in other calls of the client, for as long as the session lasts unless
        it is named or existed before."""
        return _operations.output_of(self.result(timeout)).id

    def array(self, timeout: Optional[float] = None) -> Any:
        """The output as a RemoteArray of the client (waits for the answer; downloads
        nothing); a reduction's `value` is in it."""
        return self._session._client._result(self.result(timeout))

    def __repr__(self) -> str:
        state = "pending"
        if self._error is not None:
            state = f"failed ({self._error.code.name})"
        elif self._operation is not None:
            state = "done"
        return f"<Pending {self.ref} {state}>"


class SessionState:
    """What the blocking and the asyncio sessions share: the unanswered Pendings by tag,
    the failed ones, and how the call ended. Each session serializes the calls of the
    methods that end it (_end, _fail_unanswered, _error_at_close) its own way."""

    def __init__(self):
        self._unanswered = {}  # tag -> Pending
        self._failed = []
        self._ended = False
        self._end_error = None
        self._cancelled = False
        self._end_reported = False

    def _resolve(self, response):
        """Resolves the Pendings a SessionResponse answers."""
        unanswered = self._unanswered
        for answer in response.answers:
            pending = unanswered.pop(answer.tag, None)
            if pending is None:
                continue
            operation = answer.operation
            if operation.state == _FAILED:
                pending._error = error_for(operation.error_code, operation.error_message,
                                           operation)
                self._failed.append(pending)
            else:
                pending._operation = operation
            pending._answered()

    def _end(self, error):
        """Marks the call ended with `error` (None: ended as it should) and fails the
        operations still unanswered with it."""
        unanswered = self._unanswered
        if error is None and unanswered:
            # The server answers every operation it read: these were submitted while
            # the session closed.
            error = error_for(grpc.StatusCode.CANCELLED,
                              "the session closed before the operation was sent")
        self._end_error = error
        self._ended = True  # before the sweep: a submit after it fails its own
        while unanswered:
            self._fail_unanswered(next(iter(unanswered)), error)

    def _fail_unanswered(self, tag, error):
        """Fails the unanswered operation `tag` with the error that ended the call."""
        pending = self._unanswered.pop(tag, None)
        if pending is not None:
            pending._error = _copy(error)
            self._failed.append(pending)
            self._end_reported = True
            pending._answered()

    def failures(self) -> list[Pending]:
        """The Pendings of failed operations whose result nobody asked for, in
        submission order (close() raises the first); no call."""
        return sorted((p for p in self._failed if not p._observed), key=lambda p: p._seq)

    def _error_at_close(self):
        """What close() raises: the first failure nobody looked at (a note counts the
        others), else the error that ended the call where no operation reported it."""
        failures = SessionState.failures(self)  # the caller holds what guards it
        for pending in failures:
            pending._observed = True
        end_error = None if self._cancelled or self._end_reported else self._end_error
        self._end_reported = True
        if failures:
            error = failures[0]._error
            if len(failures) > 1 and hasattr(error, "add_note"):
                error.add_note(f"{len(failures) - 1} more operations of the session failed")
            return error
        return None if end_error is None else _copy(end_error)


class Session(SessionState, _operations.Operations):
    """One SessionService.Session call of a client (Client.session()).

    submit() and the operations (eval, reduce, matmul, gemv, rand.*) return a Pending at
    once and never wait for the server: their `wait` argument is ignored. A submit
    blocks only while a full message (Limits.max_session_in_flight operations) waits to
    be sent, which happens while the server holds back that many unanswered operations.

    Threads: submit from as many as you like. Each thread's operations reach the
    server in the order it submitted them; those of different threads interleave in
    no particular order, so an operation that needs another's output names it by tag
    (a dependency the server orders), or is submitted after it by the same thread.

    wait() waits for every answer. Leaving a `with` block, or close(), also ends the
    call, then raises the first error, in submission order, of the failed operations
    whose result nobody asked for (on Python 3.11+ a note counts the others; before
    close, failures() lists them all). An exception raised inside the block cancels
    the session instead: its unanswered operations fail with CANCELLED (those the
    server queued still run).

    When the call ends with an error (the server gone: UNAVAILABLE; its tokens file
    reloaded without the session's token: UNAUTHENTICATED; a malformed message:
    INVALID_ARGUMENT), every unanswered operation fails with that error, and so does
    every later submit; close() raises it where no operation did. The session's
    temporaries (new unnamed outputs) are deleted when it ends, however it ends: use
    their ids (Pending.buffer_id()) in the client's other calls only meanwhile.

    Creating it opens the call (and asks the server's limits once per client).
    """

    def __init__(self, client: Any, stream: StreamRef = None) -> None:
        super().__init__()
        self._client = client
        self._suffix = stream_suffix(stream)
        self._max_ops = max(1, client._limits().max_session_in_flight)
        # The submitting threads, gRPC's sending thread and the reader share these
        # without a lock where one step of the interpreter suffices (a deque's append
        # and popleft, a dict's set and pop, next() of a counter): a lock taken for
        # every operation would make them queue behind each other. The lock is for
        # waits, and each waiter counts itself (under it) before it checks its
        # condition, so that the thread that changes the condition sees it and wakes it.
        self._condition = threading.Condition(threading.Lock())
        self._queued = collections.deque()  # serialized operations not yet sent
        self._count = itertools.count(1)
        self._own_tags = set()  # the tags given to submit(), under the lock
        self._sender_idle = False
        self._room_waiters = 0
        self._answer_waiters = 0
        self._closing = False
        self._call = client._rpc.Session(self._messages(), metadata=client.options.metadata)
        self._reader = threading.Thread(target=self._read, name="gpucompute-session",
                                        daemon=True)
        self._reader.start()

    # Submitting -----------------------------------------------------------

    def submit(self, request: Message, *, wait: bool = False,
               tag: Optional[str] = None) -> Pending:
        """Queues a SubmitRequest (its wait fields are ignored) tagged `tag`, or "#<n>"
        with n counting the session's operations from 1, and returns its Pending. A tag
        of your own must not start with "#" and is used once in the session (else
        ValueError: answers are matched by tag). Runs on the session's stream where
        the request names none. gRPC's sending thread sends it with the others queued
        meanwhile; this blocks only while a full message waits."""
        del wait  # a session never waits; Pending.result() does
        if self._closing:
            raise ValueError("the session is closed")
        if tag is not None:
            self._claim(tag)
        data = request.SerializeToString()
        if self._suffix and not request.stream_id:
            data += self._suffix
        seq = next(self._count)
        pending = Pending(self, seq, f"#{seq}" if tag is None else tag)
        queued = self._queued
        if len(queued) >= self._max_ops:
            self._wait_for_room()
        self._unanswered[pending.tag] = pending
        queued.append(session_op_bytes(pending.tag, data))
        if self._sender_idle:
            with self._condition:
                self._condition.notify_all()
        if self._ended:  # the call ended meanwhile
            with self._condition:
                self._fail_unanswered(pending.tag, self._end_error)
                self._condition.notify_all()
        return pending

    def _claim(self, tag):
        if not isinstance(tag, str) or not tag or tag.startswith("#"):
            raise ValueError(f"a tag is a non-empty string not starting with '#', not {tag!r}")
        with self._condition:
            if tag in self._own_tags:
                raise ValueError(f"tag '{tag}' is already used in this session")
            self._own_tags.add(tag)

    def _wait_for_room(self):
        """Blocks while a full message waits to be sent."""
        with self._condition:
            self._room_waiters += 1
            self._condition.wait_for(
                lambda: len(self._queued) < self._max_ops or self._ended)
            self._room_waiters -= 1

    def _messages(self):
        """The session's requests, serialized: gRPC's sending thread takes the next one
        when the previous one is sent, which packs every operation queued meanwhile."""
        queued = self._queued
        while True:
            if not queued:
                with self._condition:
                    self._sender_idle = True
                    self._condition.wait_for(lambda: queued or self._closing or self._ended)
                    self._sender_idle = False
            if self._ended or not queued:
                return  # closing: the end of the requests (WritesDone)
            batch = [queued.popleft()]
            size = len(batch[0])
            while queued and len(batch) < self._max_ops and size < MAX_BATCH_BYTES:
                batch.append(queued.popleft())
                size += len(batch[-1])
            if self._room_waiters:
                with self._condition:
                    self._condition.notify_all()
            yield b"".join(batch)

    # Answers --------------------------------------------------------------

    def _read(self):
        error = None
        try:
            for response in self._call:
                self._resolve(response)
                if self._answer_waiters:
                    with self._condition:
                        self._condition.notify_all()
        except grpc.RpcError as rpc_error:
            error = from_rpc_error(rpc_error)
        with self._condition:
            self._end(error)
            self._condition.notify_all()

    def _wait_for(self, pending, timeout):
        if pending.done():
            return
        self._wait_until(pending.done, timeout, lambda: f"{pending.ref} was not answered")

    def _wait_until(self, predicate, timeout, what):
        with self._condition:
            self._answer_waiters += 1
            try:
                if not self._condition.wait_for(predicate, timeout):
                    raise TimeoutError(f"{what()} in {timeout} s")
            finally:
                self._answer_waiters -= 1

    # Ending ---------------------------------------------------------------

    def wait(self, timeout: Optional[float] = None) -> None:
        """Blocks until every operation submitted so far is answered."""
        self._wait_until(lambda: not self._unanswered, timeout,
                         lambda: f"{len(self._unanswered)} operations were not answered")

    def failures(self) -> list[Pending]:
        with self._condition:
            return super().failures()

    failures.__doc__ = SessionState.failures.__doc__

    def close(self, timeout: Optional[float] = None) -> None:
        """Ends the submissions, waits (blocking) for every answer and the end of the call, and
        raises the first unobserved failure (see the class). Closing twice is
        harmless."""
        with self._condition:
            self._closing = True
            self._condition.notify_all()
        self._reader.join(timeout)
        if self._reader.is_alive():
            raise TimeoutError(f"the session did not end in {timeout} s")
        with self._condition:
            error = self._error_at_close()
        if error is not None:
            raise error

    def cancel(self) -> None:
        """Cancels the call: unanswered operations fail with CANCELLED at once; the
        server still runs those it queued, and deletes the session's temporaries once
        it sees the cancellation (a moment later; after close(), they are gone)."""
        with self._condition:
            self._closing = True
            self._cancelled = True
            self._condition.notify_all()
        self._call.cancel()
        self._reader.join()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 traceback: Optional[TracebackType]) -> None:
        if exc_type is None:
            self.close()
        else:
            self.cancel()
