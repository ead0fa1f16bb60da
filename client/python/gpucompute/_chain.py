"""Chains (SessionService.RunChain): a list of operations feeding each other by tag, sent
in one call and answered once, when all are done.

    chain = c.chain()
    t = chain.eval("x * 2", x=x)            # a Step: its output is "tag:#1"
    chain.eval("t + 1", t=t, out=x)         # writes x; t is a temporary
    for _ in range(100):
        chain.run()                         # from the second run on, prepared

The server keeps a chain it sees again byte for byte prepared and runs it as one
operation (on CUDA, recorded once as CUDA graphs): ChainResult.prepared tells. A Chain
serializes its request once and sends the same bytes until it changes. Only chains
whose steps run on one stream, keep no new buffer (no `keep`) and have small
temporaries are kept prepared.

Everything here but run() happens in the client: steps are collected, and nothing is
sent until run(), which blocks until every step is done.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Union

from . import _operations
from ._arrays import TaggedOutput, stream_ref
from ._proto import v1
from ._types import Message, StreamRef


class Step(TaggedOutput):
    """A step of a chain: `ref` ("tag:<t>") names its output in the chain's later
    steps (pass the Step itself wherever a buffer is read or written), and in `keep`."""

    __slots__ = ("tag",)

    def __init__(self, tag: str) -> None:
        self.ref = "tag:" + tag
        self.tag = tag

    def __repr__(self) -> str:
        return f"<Step {self.ref}>"


class ChainResult:
    """The answer of one run: `operations` (one Operation per step, in order; where the
    chain ran prepared they share its id and stream, filled in here), `operation_id`
    and `stream_id` (set when it ran prepared, else empty), `prepared`. It holds the
    answer: reading it calls nothing.
    """

    def __init__(self, client: Any, tags: Iterable[str], response: Message) -> None:
        self._client = client
        self._index = {tag: i for i, tag in enumerate(tags)}
        self.operation_id = response.operation_id
        self.stream_id = response.stream_id
        self.operations = [step.operation for step in response.steps]
        if self.operation_id:
            # The answer gives the shared id and stream once; each step has them again.
            for operation in self.operations:
                operation.id = self.operation_id
                operation.stream_id = self.stream_id
                if operation.HasField("timing"):
                    operation.timing.stream_id = self.stream_id

    @property
    def prepared(self) -> bool:
        """Whether the chain ran as one prepared operation."""
        return bool(self.operation_id)

    def operation(self, step: Union[Step, str]) -> Message:
        """The Operation of a step (a Step or its tag), from the answer (no call)."""
        return self.operations[self._index[getattr(step, "tag", step)]]

    def array(self, step: Union[Step, str]) -> Any:
        """A step's output as a RemoteArray of the client (a kept, named or existing
        buffer: temporaries are gone once the chain is done); made from the answer, with
        no call."""
        return self._client._result(self.operation(step))


class Chain(_operations.Operations):
    """Operations collected here (submit, or eval, reduce, matmul, gemv, rand.*, which
    return a Step and send nothing; `wait` is ignored) and run together by run().

    New unnamed outputs are temporaries, freed when the run is done, unless kept with
    run(keep=...); named outputs and outputs written into existing buffers stay.
    """

    def __init__(self, client: Any, stream: StreamRef = None) -> None:
        self._client = client
        self._request = v1.ChainRequest(stream_id=stream_ref(stream))
        self._tags = []
        self._bytes = None  # the request's bytes, serialized at the first run after a change

    def submit(self, request: Message, *, wait: bool = False,
               tag: Optional[str] = None) -> Step:
        """Adds a SubmitRequest as a step tagged `tag`, or "#<n>" with n counting the
        chain's steps from 1; tags are unique within the chain. Returns its Step; sends
        nothing."""
        del wait  # nothing runs before run()
        tag = tag if tag is not None else f"#{len(self._tags) + 1}"
        step = self._request.steps.add(tag=tag)
        step.op.CopyFrom(request)
        self._tags.append(tag)
        self._bytes = None
        return Step(tag)

    def __len__(self) -> int:
        return len(self._tags)

    @property
    def request(self) -> Message:
        """The ChainRequest as the last run sent it (or the next will)."""
        return self._request

    def run(self, keep: Iterable[Union[Step, str]] = (),
            separate_launches: bool = False) -> ChainResult:
        """Runs the chain on the server, in one RunChain call that blocks until every
        step is done, and returns its ChainResult. `keep`: the steps (Steps or tags)
        whose new unnamed outputs stay as buffers after it. An invalid step rejects the
        whole chain before anything runs (the error names the step); a step that fails
        while running raises its error here, that of the first failed step in order,
        with its Operation in the error's `operation`."""
        keep = [getattr(step, "tag", step) for step in keep]
        if list(self._request.keep) != keep or \
                self._request.separate_launches != bool(separate_launches):
            del self._request.keep[:]
            self._request.keep.extend(keep)
            self._request.separate_launches = bool(separate_launches)
            self._bytes = None
        if self._bytes is None:
            self._bytes = self._request.SerializeToString()
        result = ChainResult(self._client, self._tags,
                             self._client._call("RunChain", self._bytes))
        for operation in result.operations:
            _operations.finished(operation)
        return result
