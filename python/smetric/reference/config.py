"""Router configuration: the fields and defaults of docs/routing-semantics.md §9.

Mirrors `RouterConfig` (`rust/smetric-core/src/config.rs`); the differential test builds both
from the same keyword arguments, so the field names must match exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

INDEX_MODES = ("approximate", "exact")
CACHE_FIRST_MODES = ("weighted", "argmax", "max_hit")


@dataclass(frozen=True, kw_only=True)
class ReferenceConfig:
    """§9, field for field. See the spec table for why each default is what it is."""

    hash_seed: int = 0
    index_mode: str = "approximate"
    local_capacity_blocks: int = 17_920
    global_capacity_blocks: int = 1_048_576  # 0 disables the global tier
    local_ttl_s: float | None = None
    engine_load_staleness_s: float = 1.0
    first_turn_min_branches: int = 1
    cache_first_mode: str = "weighted"
    cache_first_weights: tuple[float, float, float] = (0.7, 0.15, 0.15)
    linear_prefill_weight: float = 1.0
    global_fetch_cost: float = 0.27
    min_local_hit_ratio: float = 0.5
    overload_factor: float = 1.5
    overload_slack_tokens: int = 8192
    overload_slack_requests: int = 4

    def __post_init__(self) -> None:
        # Only the checks that keep the reference itself well-defined; invalid configs never reach
        # the differential test.
        if self.index_mode not in INDEX_MODES:
            raise ValueError(f"index_mode must be one of {INDEX_MODES}, got {self.index_mode!r}")
        if self.cache_first_mode not in CACHE_FIRST_MODES:
            raise ValueError(f"cache_first_mode must be one of {CACHE_FIRST_MODES}, got {self.cache_first_mode!r}")
        if self.local_capacity_blocks < 0 or self.global_capacity_blocks < 0:
            raise ValueError("capacities must be >= 0")
        if len(self.cache_first_weights) != 3:
            raise ValueError("cache_first_weights must have three entries")
