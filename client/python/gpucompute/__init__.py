"""Python client of the gpucompute service: NumPy arrays resident on a remote GPU (or
CPU) backend.

    import gpucompute, numpy as np
    c = gpucompute.connect("127.0.0.1:50051")
    x = c.put(np.linspace(0, 1, 1 << 20), name="x")
    y = c.eval("a*x + 1", a=2.0, x=x)
    print(c.reduce("sum", y).value, y.timing.gbps)
    host = y.get()                      # or np.asarray(y)
    z = np.sqrt(2 * x + 1).sum()        # NumPy's way: one fused map-reduce on the server
    v = y[::2].reshape(-1, 4).T         # a View: no copy, no server call
    c.reduce("var", v, axis=1, ddof=1)  # views stand wherever a buffer is read

`c.session()` sends many small operations without a round trip each, and `c.chain()`
runs a list of them in one call (prepared when run again); `gpucompute.program(fn)`
traces a function of arrays into such a chain. `gpucompute.aio` has the
same client for asyncio. The message classes of the API are
in `gpucompute.v1` (e.g. gpucompute.v1.SubmitRequest), built at import from the
shipped descriptor.
"""

from ._chain import Chain, ChainResult, Step
from ._interop import ZeroCopyError, from_dlpack
from ._proto import v1
from ._session import Pending, Session
from ._views import View
from .client import Client, RemoteArray, connect
from ._creation import (arange, empty, empty_like, eye, full, full_like, integers, linspace,
                        normal, ones, ones_like, rand, randn, random, seed, uniform, zeros,
                        zeros_like)
from ._lazy import evaluate
from ._program import Program, program
from . import array_api
from .errors import (AlreadyExistsError, DeadlineExceededError, Error,
                     FailedPreconditionError, InvalidArgumentError, NotFoundError,
                     PermissionDeniedError, ResourceExhaustedError, UnauthenticatedError,
                     UnavailableError)

__version__ = "0.1.0"

__all__ = [
    "AlreadyExistsError", "Chain", "ChainResult", "Client", "DeadlineExceededError", "Error",
    "FailedPreconditionError", "InvalidArgumentError", "NotFoundError", "Pending",
    "PermissionDeniedError", "Program", "RemoteArray", "ResourceExhaustedError", "Session", "Step",
    "UnauthenticatedError", "UnavailableError", "View", "ZeroCopyError", "arange", "array_api",
    "connect", "empty", "empty_like", "evaluate", "eye", "from_dlpack", "full", "full_like",
    "integers", "linspace", "normal", "ones", "ones_like", "program", "rand", "randn",
    "random", "seed", "uniform", "v1", "zeros", "zeros_like",
]
