"""Plain-Python reference implementation of the smetric routing core.

Mirrors docs/routing-semantics.md in full; it is the oracle that `tests/test_differential.py`
compares the Rust core (`smetric._core`) against. It deliberately never imports the extension.
"""

from __future__ import annotations

from .config import ReferenceConfig
from .hashing import InvalidInputError, ref_hash_tokens
from .router import (
    Decision,
    DuplicateInstanceError,
    IndexHits,
    NoInstancesError,
    ReferenceRouter,
    UnknownInstanceError,
)

__all__ = [
    "Decision",
    "DuplicateInstanceError",
    "IndexHits",
    "InvalidInputError",
    "NoInstancesError",
    "ReferenceConfig",
    "ReferenceRouter",
    "UnknownInstanceError",
    "ref_hash_tokens",
]
