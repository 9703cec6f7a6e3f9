"""Imported first by every module of the fake engine that needs its extra: a missing package is
a :class:`smetric.errors.MissingExtraError` naming ``fake-engine``."""

from __future__ import annotations

from smetric.errors import MissingExtraError

try:
    import aiohttp  # noqa: F401
    import zmq  # noqa: F401
except ModuleNotFoundError as e:
    requirement = "pyzmq" if e.name == "zmq" else str(e.name)
    raise MissingExtraError("smetric.fake_engine", requirement, "fake-engine", name=e.name) from e
