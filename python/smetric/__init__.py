"""smetric: session-aware KV$ routing for LLM-agent fleets.

The first request of every agent session is placed for load balance over the whole fleet;
follow-ups go where their KV$ lives; a session moves when its home is overloaded or its
KV$ was evicted. The decision path is Rust (``smetric._core``); this package re-exports it
with types.

    >>> from smetric import Router
    >>> router = Router(["http://10.0.0.1:8000", "http://10.0.0.2:8000"])
    >>> d = router.route([1, 2, 3] * 100)
    >>> d.instance, d.first_turn, d.reason  # doctest: +SKIP
"""

from __future__ import annotations

from smetric._core import (
    DECODE_RULES,
    DEFAULT_BLOCK_SIZE,
    POLICIES,
    Decision,
    IndexHits,
    PdDecision,
    PdRouter,
    Router,
    RouterConfig,
    SessionAdmission,
    __version__,
)
from smetric._types import (
    CacheFirstMode,
    DecodeLoad,
    DecodeRule,
    IndexMode,
    InstanceLoad,
    PdRouterStats,
    PolicyName,
    Reason,
    RouterConfigFields,
    RouterStats,
    Tier,
    TurnSource,
)
from smetric.errors import (
    DuplicateInstanceError,
    InvalidArgumentError,
    InvalidBlockSizeError,
    InvalidConfigError,
    InvalidTokenError,
    MissingPromptError,
    NoInstancesError,
    SmetricError,
    UnknownInstanceError,
    UnknownPolicyError,
    UnsupportedDtypeError,
)

__all__ = [
    "DECODE_RULES",
    "DEFAULT_BLOCK_SIZE",
    "POLICIES",
    "CacheFirstMode",
    "Decision",
    "DecodeLoad",
    "DecodeRule",
    "DuplicateInstanceError",
    "IndexHits",
    "IndexMode",
    "InstanceLoad",
    "InvalidArgumentError",
    "InvalidBlockSizeError",
    "InvalidConfigError",
    "InvalidTokenError",
    "MissingPromptError",
    "NoInstancesError",
    "PdDecision",
    "PdRouter",
    "PdRouterStats",
    "PolicyName",
    "Reason",
    "Router",
    "RouterConfig",
    "RouterConfigFields",
    "RouterStats",
    "SessionAdmission",
    "SmetricError",
    "Tier",
    "TurnSource",
    "UnknownInstanceError",
    "UnknownPolicyError",
    "UnsupportedDtypeError",
    "__version__",
]
