"""Exceptions raised by smetric.

Every error of the routing core is a :class:`SmetricError`, which is a :class:`ValueError`:
callers that already catch ``ValueError`` for bad input keep working, and callers that want
the details read the attributes (``err.position``, ``err.name``, …) instead of parsing the
message. The Rust core raises these very classes (``smetric._core`` imports this module).
"""

from __future__ import annotations

__all__ = [
    "DuplicateInstanceError",
    "InvalidArgumentError",
    "InvalidBlockSizeError",
    "InvalidConfigError",
    "InvalidTokenError",
    "MissingPromptError",
    "NoInstancesError",
    "SmetricError",
    "UnknownInstanceError",
    "UnknownPolicyError",
    "UnsupportedDtypeError",
]


class SmetricError(ValueError):
    """Base class of every smetric error."""


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
    """A :class:`~smetric.RouterConfig` field with an invalid value."""

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
