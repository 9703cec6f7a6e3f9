"""Exceptions raised by smetric.

Every error of the routing core is a :class:`SmetricError`, which is a :class:`ValueError`:
callers that already catch ``ValueError`` for bad input keep working, and callers that want
the details read the attributes (``err.position``, ``err.name``, …) instead of parsing the
message. The Rust core raises these very classes (``smetric._core`` imports this module).

The one exception that is not a :class:`SmetricError` is :class:`MissingExtraError`, an
:class:`ImportError`: a module of the package that needs an optional dependency (an *extra* of
``smetric-router``) raises it on import when that dependency is not installed.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "DuplicateInstanceError",
    "EmptyWorkloadError",
    "InvalidArgumentError",
    "InvalidBlockSizeError",
    "InvalidConfigError",
    "InvalidTokenError",
    "KvEventEndpointInUseError",
    "MissingExtraError",
    "MissingPromptError",
    "NoInstancesError",
    "SimulationError",
    "SimulationStalledError",
    "SmetricError",
    "TraceFormatError",
    "UnknownInstanceError",
    "UnknownPolicyError",
    "UnsupportedDtypeError",
]


class MissingExtraError(ImportError):
    """``module`` needs ``requirement``, installed by the ``extra`` of ``smetric-router``.

    Raised at import, so a process that embeds only :class:`~smetric.Router` installs and
    imports none of the simulator's, plotting or event-stream dependencies. ``name`` (from
    :class:`ImportError`) is the missing top-level module.
    """

    def __init__(self, module: str, requirement: str, extra: str, *, name: str | None = None) -> None:
        super().__init__(
            f"{module} needs {requirement}, which is not installed: pip install 'smetric-router[{extra}]'",
            name=name,
        )
        self.module = module
        self.requirement = requirement
        self.extra = extra


class SmetricError(ValueError):
    """Base class of every smetric error."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Exceptions pickle as ``cls(*args)``, which drops keyword-only attributes; rebuild
        # from the message and the attributes instead, so errors cross process pools intact.
        return (_rebuild, (type(self), str(self), dict(vars(self))))


def _rebuild(cls: type[SmetricError], message: str, attributes: dict[str, Any]) -> SmetricError:
    err = cls.__new__(cls)
    ValueError.__init__(err, message)
    err.__dict__.update(attributes)
    return err


class InvalidBlockSizeError(SmetricError):
    """``block_size`` is not a positive integer."""

    def __init__(self, message: str, *, block_size: int) -> None:
        super().__init__(message)
        self.block_size = block_size


class InvalidTokenError(SmetricError):
    """A token id outside ``[0, 2**32)``."""

    def __init__(self, message: str, *, position: int, value: int) -> None:
        super().__init__(message)
        self.position = position
        self.value = value


class UnsupportedDtypeError(SmetricError):
    """A token array of a dtype other than int32, uint32 or int64 (or a list of non-ints)."""

    def __init__(self, message: str, *, dtype: str) -> None:
        super().__init__(message)
        self.dtype = dtype


class NoInstancesError(SmetricError):
    """The router has no instance (an empty list at construction, or all were removed)."""


class UnknownInstanceError(SmetricError):
    """A name that is not in the router's fleet."""

    def __init__(self, message: str, *, name: str) -> None:
        super().__init__(message)
        self.name = name


class DuplicateInstanceError(SmetricError):
    """``add_instance`` (or the constructor) got a name twice."""

    def __init__(self, message: str, *, name: str) -> None:
        super().__init__(message)
        self.name = name


class UnknownPolicyError(SmetricError):
    """A policy name smetric does not ship."""

    def __init__(self, message: str, *, name: str, known: list[str]) -> None:
        super().__init__(message)
        self.name = name
        self.known = known


class InvalidConfigError(SmetricError):
    """A :class:`~smetric.RouterConfig` or simulator config field with an invalid value.

    ``field`` is dotted for nested simulator fields (``global_tier.bandwidth_bytes_per_s``).
    """

    def __init__(self, message: str, *, field: str, reason: str) -> None:
        super().__init__(message)
        self.field = field
        self.reason = reason


class InvalidArgumentError(SmetricError):
    """A call argument with an invalid value (``turn=0``, a negative ``now``, …)."""

    def __init__(self, message: str, *, argument: str, reason: str) -> None:
        super().__init__(message)
        self.argument = argument
        self.reason = reason


class MissingPromptError(SmetricError):
    """``route()`` or ``query()`` without ``tokens`` and without ``hashes``."""


class TraceFormatError(SmetricError):
    """A trace record the simulator cannot read: ``path`` and 1-based ``line`` point at it."""

    def __init__(self, message: str, *, path: str, line: int, reason: str) -> None:
        super().__init__(message)
        self.path = path
        self.line = line
        self.reason = reason


class EmptyWorkloadError(SmetricError):
    """A trace (or set of traces) with no request in it."""


class SimulationError(SmetricError):
    """The simulation could not run to the end (``reason`` says why)."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class SimulationStalledError(SimulationError):
    """Requests were in flight but no event could make progress (a simulator bug, reported
    instead of looping forever)."""

    def __init__(self, message: str, *, time_s: float, in_flight: int) -> None:
        super().__init__(message, reason="stalled")
        self.time_s = time_s
        self.in_flight = in_flight


class KvEventEndpointInUseError(SmetricError):
    """A KV-event subscriber could not bind ``endpoint``: another subscriber (usually another
    router replica) holds it.

    An engine whose ``kv-events-config`` endpoint names a host (``tcp://10.0.0.1:5557``)
    *connects* to its one subscriber, which must bind that address; a second router on the same
    host cannot. The message says how to configure the engine so that every replica can subscribe:
    ``tcp://*:5557`` or ``ipc://…``, which the engine binds.
    """

    def __init__(self, message: str, *, instance: str, endpoint: str) -> None:
        super().__init__(message)
        self.instance = instance
        self.endpoint = endpoint
