"""The public API is typed: every parameter and return of every public callable has an
annotation, every public callable a docstring, and a type checker (mypy, where it is
installed) accepts a typical program in strict mode.

"Public" is what a user reaches: the names gpucompute, gpucompute.aio and
gpucompute.array_api export, and the methods and properties of the classes they export
or return (Client.rand's Random, the NumPy layer's arrays, the asyncio session), with
the ones they inherit from the package's own classes. Dunder methods (operators, the
NumPy protocols, context managers) need annotations but no docstring."""

import importlib.util
import inspect
import os
import subprocess
import sys
import tempfile
import types

import pytest

import gpucompute
import gpucompute.aio
import gpucompute.array_api
from gpucompute import _aio_session, _lazy, _operations

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "typing_example.py")

# Classes the exported names return, besides those exported.
RETURNED_CLASSES = [_operations.Random, _lazy.LazyArray, _aio_session.AsyncSession,
                    _aio_session.AsyncPending]
# Attributes of the package's classes that are not callables of the API.
NOT_API = {"__dict__", "__doc__", "__module__", "__slots__", "__weakref__", "__hash__",
           "__array_priority__", "__annotations__", "__orig_bases__", "__parameters__"}


def _ours(value):
    return getattr(value, "__module__", "").startswith("gpucompute")


def _public(name):
    return not name.startswith("_")


def _dunder(name):
    return name.startswith("__") and name.endswith("__")


def _module_callables(module, names):
    for name in names:
        value = getattr(module, name)
        if isinstance(value, types.ModuleType) or not callable(value) or not _ours(value):
            continue  # gpucompute.v1 (message classes) and NumPy's dtypes
        yield f"{module.__name__}.{name}", value


def _exported():
    """(qualified name, function or class) of every exported callable."""
    yield from _module_callables(gpucompute, gpucompute.__all__)
    yield from _module_callables(gpucompute.aio, ["connect", "Client", "RemoteArray"])
    yield from _module_callables(gpucompute.array_api,
                                 [n for n in dir(gpucompute.array_api) if _public(n)])
    yield from _module_callables(gpucompute.errors, ["error_for", "from_rpc_error"])
    for cls in RETURNED_CLASSES:
        yield f"{cls.__module__}.{cls.__qualname__}", cls


def _members(cls):
    """(name, function or property) of a class's API, overrides first."""
    seen = set()
    for base in cls.__mro__:
        if not _ours(base):
            continue
        for name, value in vars(base).items():
            if name in seen or name in NOT_API or not (_public(name) or _dunder(name)):
                continue
            seen.add(name)
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if isinstance(value, property) or inspect.isfunction(value):
                yield name, value


def _callables():
    """(qualified name, function, property or class, whether it is a class's member) of
    the whole API."""
    for qualname, value in _exported():
        yield qualname, value, False
        if inspect.isclass(value):
            for name, member in _members(value):
                yield f"{qualname}.{name}", member, True


def _missing_annotations(qualname, function, is_method):
    missing = []
    signature = inspect.signature(function)
    parameters = list(signature.parameters.values())
    if is_method and parameters and parameters[0].name in ("self", "cls"):
        parameters = parameters[1:]
    for parameter in parameters:
        if parameter.annotation is inspect.Parameter.empty:
            missing.append(f"{qualname}: parameter {parameter.name}")
    if signature.return_annotation is inspect.Signature.empty:
        missing.append(f"{qualname}: return")
    return missing


def _problems():
    problems = []
    count = 0
    for qualname, value, is_member in _callables():
        count += 1
        if not _dunder(qualname.rsplit(".", 1)[-1]) and not inspect.getdoc(value):
            problems.append(f"{qualname}: no docstring")
        if inspect.isclass(value):
            continue
        function = value.fget if isinstance(value, property) else value
        problems += _missing_annotations(qualname, function, is_member)
    return problems, count


def test_the_walk_reaches_the_api():
    names = {qualname for qualname, _, _ in _callables()}
    for expected in ("gpucompute.zeros", "gpucompute.connect", "gpucompute.evaluate",
                     "gpucompute.Client.eval", "gpucompute.Client.put",
                     "gpucompute.Client.zeros", "gpucompute.Client.rand",
                     "gpucompute.RemoteArray.get", "gpucompute.RemoteArray.__add__",
                     "gpucompute.RemoteArray.sum", "gpucompute.RemoteArray.T",
                     "gpucompute.View.reshape", "gpucompute.Session.eval",
                     "gpucompute.Pending.result", "gpucompute.Chain.run",
                     "gpucompute.ChainResult.array", "gpucompute.aio.Client.eval",
                     "gpucompute.aio.RemoteArray.get",
                     "gpucompute._aio_session.AsyncSession.submit",
                     "gpucompute._operations.Random.normal",
                     "gpucompute._lazy.LazyArray.compute", "gpucompute.array_api.sin",
                     "gpucompute.array_api.sum", "gpucompute.Error.__init__",
                     "gpucompute.errors.from_rpc_error"):
        assert expected in names


def test_every_public_callable_is_annotated_and_documented():
    problems, count = _problems()
    assert count > 300
    assert not problems, f"{len(problems)} of the API's annotations or docstrings are " \
        "missing:\n" + "\n".join(problems)


def test_the_package_says_it_is_typed():
    assert os.path.isfile(os.path.join(os.path.dirname(gpucompute.__file__), "py.typed"))


def test_the_typed_example_runs(server_address):
    # What mypy checks below is a real program: it runs against the server.
    spec = importlib.util.spec_from_file_location("typing_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.main(server_address) > 0


def _mypy_available():
    return importlib.util.find_spec("mypy") is not None


@pytest.mark.skipif(not _mypy_available(), reason="mypy is not installed "
                    "(deploy/install-deps.sh installs python3-mypy)")
def test_mypy_strict_accepts_a_typical_program():
    package_root = os.path.dirname(HERE)
    with tempfile.TemporaryDirectory() as cache:
        result = subprocess.run(
            [sys.executable, "-m", "mypy", "--strict", "--no-error-summary",
             "--cache-dir", cache, "--config-file", os.path.join(HERE, "mypy.ini"),
             EXAMPLE],
            cwd=package_root, env=dict(os.environ, MYPYPATH=package_root),
            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
