"""Transfers through POSIX shared memory, for a client on the server's host
(SharedMemoryService; the server needs --allow-shared-memory). The Python side of the
C++ client's SharedMemoryTransport (client/cpp/shared_memory.h), with the same rules.

A client owns at most one segment, registered with the server as a region and reused by
its transfers: an upload writes the array into it and asks the server to copy it into a
buffer; a download asks the server to copy a buffer into it and reads it from there. No
array bytes cross the socket.

The segment's name is unlinked as soon as the server has mapped it: the memory lives as
long as the two mappings, so a client that exits or is killed leaves nothing in
/dev/shm, and the server's mapping goes when the region is unregistered (close), idles
out, or the server stops.

A transfer that fits the segment is one copy on the server, all or nothing. The segment
grows to fit each transfer, up to Options.shm_max_bytes; a larger transfer moves in
pieces of that size: an upload into an existing buffer then changes it piece by piece,
and an upload into a new buffer creates it first and deletes it on failure.

The protocol is written once, as generators that yield the Calls to make and receive
their responses (or have their errors thrown in); run() and run_async() make the calls
with the blocking or the asyncio client.
"""

import collections
import concurrent.futures
import itertools
import mmap
import os
import secrets
import socket

import grpc
import numpy as np

from . import _progress
from ._arrays import numpy_dtype
from ._proto import v1
from .errors import Error, FailedPreconditionError, NotFoundError, error_for

# Where Linux's shm_open keeps its objects: "/name" there is the file /dev/shm/name.
SHM_DIRECTORY = "/dev/shm"
# The smallest segment: one page, so that empty transfers have a region too.
MIN_REGION_BYTES = 4096
# Below a few pieces of this, starting threads for a copy costs more than it saves.
_PARALLEL_COPY_PIECE = 16 << 20
_BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"

# One RPC: the method's name on _connection.Methods, its request, and whether it is a unary
# call bounded by the client's timeout (copies are not: they take as long as their
# bytes take, as streamed transfers do).
Call = collections.namedtuple("Call", "method request unary", defaults=(True,))

_segment_counter = itertools.count()


def boot_id():
    """The kernel's random id of this boot, or "" off Linux."""
    try:
        with open(_BOOT_ID_FILE, encoding="ascii") as file:
            return file.readline().strip()
    except OSError:
        return ""


def unusable_reason(info):
    """Why shared memory cannot be used with the server of ServerInfo `info`, or "" if
    it can: the server allows it and runs on this host (the same host name and boot id)."""
    if not info.shared_memory_enabled:
        return ("the server does not allow shared memory (it runs without "
                "--allow-shared-memory)")
    host = socket.gethostname()
    this_boot = boot_id()
    if info.hostname != host or not this_boot or info.boot_id != this_boot:
        return (f"the server runs on another host ({info.hostname}) than this client "
                f"({host}); shared memory needs both on one host")
    return ""


def parallel_copy(destination, source):
    """destination[:] = source, for uint8 arrays that do not overlap, in several threads
    when large: one core's memcpy moves far less than memory and the PCIe link take, and
    this copy is the client's part of a transfer. NumPy lets go of the GIL
    while it copies."""
    size = source.size
    threads = min(size // _PARALLEL_COPY_PIECE, 8, os.cpu_count() or 1)
    if threads <= 1:
        np.copyto(destination, source)
        return
    # Pieces end on 4 KiB boundaries, so no two threads write one page.
    per = (size // threads + 4095) // 4096 * 4096

    def copy(begin):
        np.copyto(destination[begin:begin + per], source[begin:begin + per])

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(copy, range(0, size, per)))


class Segment:
    """A POSIX shared-memory object of `size` bytes, mapped into this process."""

    def __init__(self, size):
        # A name no other segment has: this process, a counter, and 64 random bits.
        self.name = f"/gpucompute-{os.getpid()}-{next(_segment_counter)}-{secrets.token_hex(8)}"
        self.size = size
        self._path = SHM_DIRECTORY + self.name
        descriptor = os.open(self._path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(descriptor, size)
            # Allocated now, not on first touch: a full /dev/shm is an error here rather
            # than a SIGBUS in whichever process writes first.
            try:
                os.posix_fallocate(descriptor, 0, size)
            except OSError as error:
                raise error_for(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"allocating {size} bytes of shared memory: "
                                f"{error.strerror}") from None
            self._map = mmap.mmap(descriptor, size)
        except BaseException:
            self.unlink()
            raise
        finally:
            os.close(descriptor)
        self.data = np.frombuffer(self._map, np.uint8)

    def unlink(self):
        """Removes the name; the memory stays while something maps it."""
        try:
            os.unlink(self._path)
        except FileNotFoundError:
            pass

    def close(self):
        self.data = None
        try:
            self._map.close()
        except BufferError:
            pass  # a view of it is still alive; the mapping goes with the last one


def _add_transfer(total, piece):
    total.bytes += piece.bytes
    total.seconds += piece.seconds
    total.gbps = total.bytes / total.seconds / 1e9 if total.seconds > 0 else 0.0


class Transport:
    """A client's shared-memory segment and region, and the steps of its transfers.

    Not safe for concurrent use: each client runs one transfer through it at a time.
    """

    def __init__(self, max_bytes):
        self._max_bytes = max_bytes
        self._segment = None
        self.region_id = ""
        # Why the server cannot be used ("" when it can); None until asked. A failed
        # region registration forgets it, so that a restarted server is asked again.
        self._unusable = None

    # Choosing ---------------------------------------------------------------

    def _usable(self, transport):
        """Steps: whether `transport` ("auto" or "shm") may use shared memory; "shm"
        raises FAILED_PRECONDITION saying why not."""
        if self._unusable is None:
            try:
                info = yield Call("GetServerInfo", v1.GetServerInfoRequest())
            except Error:
                if transport == "shm":
                    raise
                return False
            self._unusable = unusable_reason(info)
        if self._unusable and transport == "shm":
            raise error_for(grpc.StatusCode.FAILED_PRECONDITION, self._unusable)
        return not self._unusable

    def _choose(self, transport, nbytes):
        """Steps: True, with a segment for `nbytes` registered, when `transport` is to
        use shared memory; "auto" also falls back to gRPC when the server cannot map
        this process's segment."""
        if not (yield from self._usable(transport)):
            return False
        try:
            yield from self.reserve(nbytes)
        except (Error, OSError):
            if transport == "shm":
                raise
            return False
        return True

    # The segment ------------------------------------------------------------

    def reserve(self, nbytes):
        """Steps: makes sure a registered segment of at least `nbytes` (capped by
        max_bytes) exists."""
        want = max(nbytes, MIN_REGION_BYTES)
        if self._max_bytes:
            want = min(want, max(self._max_bytes, MIN_REGION_BYTES))
        if self._segment is not None and self._segment.size >= want:
            return
        yield from self.release()
        try:
            segment = Segment(want)
        except (Error, OSError):
            self._unusable = None
            raise
        try:
            request = v1.RegisterRegionRequest(
                system=v1.SystemSharedMemory(name=segment.name, size_bytes=want))
            region = yield Call("RegisterRegion", request)
        except BaseException:
            self._unusable = None
            segment.close()
            raise
        finally:
            # Mapped on both sides (or failed): the name is no longer needed, and gone
            # it cannot outlive this process.
            segment.unlink()
        self._segment = segment
        self.region_id = region.id

    def release(self):
        """Steps: unregisters the region and unmaps the segment."""
        segment, region_id = self._segment, self.region_id
        self._segment, self.region_id = None, ""
        try:
            if region_id:
                yield Call("UnregisterRegion", v1.UnregisterRegionRequest(region_id=region_id))
        except NotFoundError:
            pass  # it idled out
        finally:
            if segment is not None:
                segment.close()

    def _forget(self):
        """Drops the segment without a call: the server no longer has the region."""
        self.region_id = ""
        return self.release()

    def _copy(self, method, request, fill=None):
        """Steps: one copy through the region, with `fill` (if any) writing the segment
        first. A region the server has forgotten (idled out, or the server restarted) is
        registered anew and the copy made again, once; a server that stopped allowing
        shared memory makes the next transfer ask it again."""
        for attempt in (1, 2):
            if fill is not None:
                fill(self._segment.data)
            request.region_id = self.region_id
            try:
                return (yield Call(method, request, unary=False))
            except FailedPreconditionError:
                self._unusable = None
                yield from self._forget()
                raise
            except NotFoundError:
                if attempt == 2:
                    raise
                regions = yield Call("ListRegions", v1.ListRegionsRequest())
                if any(region.id == self.region_id for region in regions.regions):
                    raise  # the buffer is what is missing
                size = self._segment.size
                yield from self._forget()
                yield from self.reserve(size)

    # Transfers --------------------------------------------------------------

    def upload(self, transport, header, data, progress_setting):
        """Steps of an upload of `data` (a memoryview of its bytes) as `header` says:
        (BufferInfo, TransferStats), or None when gRPC is to carry it instead."""
        size = data.nbytes
        if not (yield from self._choose(transport, size)):
            return None
        source = np.frombuffer(data, np.uint8)
        reporter = _progress.make_progress(progress_setting, "put", size)
        try:
            if size > self._segment.size:
                return (yield from self._upload_in_pieces(header, source, reporter))
            request = v1.CopyFromRegionRequest(size_bytes=size)
            if header.HasField("create"):
                request.create.CopyFrom(header.create)
            elif size == 0:
                # Nothing to copy (and 0 would mean "to the end of the buffer").
                info = yield Call("GetBuffer", v1.GetBufferRequest(buffer=header.buffer))
                return info, v1.TransferStats()
            else:
                request.buffer = header.buffer
                request.offset_bytes = header.offset_bytes
            response = yield from self._copy(
                "CopyFromRegion", request, lambda segment: parallel_copy(segment[:size], source))
            reporter.update(size)
            return response.buffer, response.transfer
        finally:
            reporter.close()

    def _upload_in_pieces(self, header, source, reporter):
        target, offset = header.buffer, header.offset_bytes
        created = header.HasField("create")
        if created:
            info = (yield Call("CreateBuffer", header.create)).buffer
            target, offset = info.id, 0
        try:
            if created and info.size_bytes != source.size:
                raise error_for(grpc.StatusCode.INVALID_ARGUMENT,
                                f"the upload has {source.size} bytes but the new buffer holds "
                                f"{info.size_bytes}")
            total = v1.TransferStats()
            piece_bytes = self._segment.size
            for done in range(0, source.size, piece_bytes):
                piece = source[done:done + piece_bytes]
                request = v1.CopyFromRegionRequest(size_bytes=piece.size, buffer=target,
                                                   offset_bytes=offset + done)
                response = yield from self._copy(
                    "CopyFromRegion", request,
                    lambda segment, piece=piece: parallel_copy(segment[:piece.size], piece))
                info = response.buffer
                _add_transfer(total, response.transfer)
                reporter.update(done + piece.size)
        except GeneratorExit:
            raise
        except BaseException:
            if created:
                try:
                    yield Call("DeleteBuffer", v1.DeleteBufferRequest(buffer=target))
                except Error:
                    pass  # the first error is the one to report
            raise
        return info, total

    def download(self, transport, buffer, progress_setting):
        """Steps of a download of `buffer` (an id or name): (array, TransferStats), or
        None when gRPC is to carry it instead."""
        if not (yield from self._usable(transport)):
            return None
        info = yield Call("GetBuffer", v1.GetBufferRequest(buffer=buffer))
        array = np.empty(tuple(info.shape), numpy_dtype(info.dtype),
                         order="F" if info.layout == v1.LAYOUT_F else "C")
        if array.nbytes != info.size_bytes:
            raise error_for(grpc.StatusCode.INTERNAL,
                            f"the buffer's size {info.size_bytes} does not match its shape "
                            "and dtype")
        if not (yield from self._choose(transport, info.size_bytes)):
            return None
        target = array.ravel(order="K").view(np.uint8)
        total = v1.TransferStats()
        reporter = _progress.make_progress(progress_setting, "get", target.size)
        try:
            piece_bytes = self._segment.size
            for done in range(0, target.size, piece_bytes):
                piece = target[done:done + piece_bytes]
                # By id: the name could be rebound between the pieces.
                request = v1.CopyToRegionRequest(buffer=info.id, offset_bytes=done,
                                                 size_bytes=piece.size)
                response = yield from self._copy("CopyToRegion", request)
                parallel_copy(piece, self._segment.data[:piece.size])
                _add_transfer(total, response.transfer)
                reporter.update(done + piece.size)
        finally:
            reporter.close()
        return array, total


def _resume(steps, response, error):
    """Hands the steps the outcome of their last Call: (True, their result) when they
    are done, else (False, the next Call)."""
    try:
        return False, (steps.throw(error) if error is not None else steps.send(response))
    except StopIteration as stop:
        return True, stop.value


def _outcome(call, step):
    try:
        return call(step), None
    except BaseException as error:  # noqa: B036 - thrown into the steps
        return None, error


def run(steps, call):
    """Runs the steps of a Transport, making each Call with call(Call)."""
    done, value = _resume(steps, None, None)
    while not done:
        done, value = _resume(steps, *_outcome(call, value))
    return value


async def run_async(steps, call):
    """As run(), with a coroutine function `call`."""
    done, value = _resume(steps, None, None)
    while not done:
        try:
            outcome = await call(value), None
        except BaseException as error:  # noqa: B036 - thrown into the steps
            outcome = None, error
        done, value = _resume(steps, *outcome)
    return value
