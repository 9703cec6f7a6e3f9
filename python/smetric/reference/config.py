"""Router configuration: the fields and defaults of docs/routing-semantics.md §9.

Mirrors `RouterConfig` (`rust/smetric-core/src/config.rs`); the differential test builds both
from the same keyword arguments, so the field names must match exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

INDEX_MODES = ("approximate", "exact")
CACHE_FIRST_MODES = ("weighted", "argmax", "max_hit")
SMETRIC_MIGRATIONS = ("threshold", "cost", "work", "fetch")
SMETRIC_RULES = ("v1", "v2")
DECODE_MASKS = ("off", "oracle", "honest")


@dataclass(frozen=True, kw_only=True)
class ReferenceConfig:
    """§9, field for field. See the spec table for why each default is what it is."""

    hash_seed: int = 0
    index_mode: str = "approximate"
    local_capacity_blocks: int = 17_920
    global_capacity_blocks: int = 1_048_576  # 0 disables the global tier
    # §2.8 host pools: not mirrored here (no "host" tier in TIERS); the core's property test
    # checks them against a model of its own (router/host_tier_tests.rs).
    host_capacity_blocks: int = 0  # host pools off
    local_ttl_s: float | None = None
    exact_pending_ttl_s: float = 2.0  # §2.7; 0 turns sent blocks off
    exact_answer_credit: bool = False  # §2.7 "The answer"; True credits finished answers
    engine_load_staleness_s: float = 1.0
    first_turn_min_branches: int = 1
    cache_first_mode: str = "weighted"
    cache_first_weights: tuple[float, float, float] = (0.7, 0.15, 0.15)
    linear_prefill_weight: float = 1.0
    global_fetch_cost: float = 0.27
    host_fetch_cost: float = 0.05
    min_local_hit_ratio: float = 0.5
    overload_factor: float = 1.5
    overload_slack_tokens: int = 8192
    overload_slack_requests: int = 4
    smetric_active_weight: float = 0.0
    smetric_batch_term: bool = True
    smetric_migration: str = "fetch"
    smetric_migration_margin: float = 4.0
    smetric_kv_fit: bool = True
    smetric_growth_headroom_tokens: float = 0.0
    smetric_retention_s: float = 0.0
    smetric_kv_bound_share: float = 0.3
    smetric_tpot_budget_s: float = 0.0
    smetric_rule: str = "v2"
    smetric_l_eq_tokens: float = 6923.0
    smetric_ttft_slack: float = 1.0
    smetric_ttft_base_s: float = 1.0
    smetric_ttft_s_per_token: float = 1.0 / 16000.0
    smetric_drain_rate: float | None = None
    smetric_drain_rate_fallback: float = 22000.0
    smetric_drain_window: int = 64
    smetric_drain_min_samples: int = 8
    smetric_store_pricing: bool = True
    smetric_learn_fetch_cost: bool = False
    smetric_decode_mask: str = "off"
    smetric_contract_base_s: float = 1.0
    smetric_contract_input_tokens_per_s: float = 8000.0
    smetric_contract_tpot_s: float = 0.020
    preble_window_s: float = 180.0  # §6 item 13: AIBrix's histogram window
    preble_hit_threshold: float = 0.5
    preble_imbalance_requests: int = 8
    cache_aware_cache_threshold: float = 0.3  # §6 item 18: vllm-router's CLI defaults
    cache_aware_balance_abs_threshold: int = 64
    cache_aware_balance_rel_threshold: float = 1.5
    vllm_router_smetric_form: str = "tokens"  # §6 item 12: our token port, or "pr_literal"

    def __post_init__(self) -> None:
        # Only the checks that keep the reference itself well-defined; invalid configs never reach
        # the differential test.
        if self.index_mode not in INDEX_MODES:
            raise ValueError(f"index_mode must be one of {INDEX_MODES}, got {self.index_mode!r}")
        if self.cache_first_mode not in CACHE_FIRST_MODES:
            raise ValueError(f"cache_first_mode must be one of {CACHE_FIRST_MODES}, got {self.cache_first_mode!r}")
        if self.smetric_migration not in SMETRIC_MIGRATIONS:
            raise ValueError(f"smetric_migration must be one of {SMETRIC_MIGRATIONS}, got {self.smetric_migration!r}")
        if self.smetric_decode_mask not in DECODE_MASKS:
            raise ValueError(f"smetric_decode_mask must be one of {DECODE_MASKS}, got {self.smetric_decode_mask!r}")
        if self.smetric_rule not in SMETRIC_RULES:
            raise ValueError(f"smetric_rule must be one of {SMETRIC_RULES}, got {self.smetric_rule!r}")
        if not 1 <= self.smetric_drain_min_samples <= self.smetric_drain_window:
            raise ValueError("smetric_drain_min_samples must be in [1, smetric_drain_window]")
        if self.local_capacity_blocks < 0 or self.global_capacity_blocks < 0:
            raise ValueError("capacities must be >= 0")
        if len(self.cache_first_weights) != 3:
            raise ValueError("cache_first_weights must have three entries")

    def v1(self) -> ReferenceConfig:
        """This config with SMetric in the July paper's form (``RouterConfig.v1()``): the v1 rule,
        every smetric+ switch off, the v2 fields at their defaults."""
        d = ReferenceConfig()
        return replace(
            self,
            smetric_active_weight=0.0,
            smetric_batch_term=True,
            smetric_migration="threshold",
            smetric_migration_margin=0.0,
            smetric_kv_fit=False,
            smetric_growth_headroom_tokens=0.0,
            smetric_retention_s=0.0,
            smetric_kv_bound_share=0.0,
            smetric_tpot_budget_s=0.0,
            smetric_rule="v1",
            smetric_l_eq_tokens=d.smetric_l_eq_tokens,
            smetric_ttft_slack=d.smetric_ttft_slack,
            smetric_ttft_base_s=d.smetric_ttft_base_s,
            smetric_ttft_s_per_token=d.smetric_ttft_s_per_token,
            smetric_drain_rate=d.smetric_drain_rate,
            smetric_drain_rate_fallback=d.smetric_drain_rate_fallback,
            smetric_drain_window=d.smetric_drain_window,
            smetric_drain_min_samples=d.smetric_drain_min_samples,
            smetric_store_pricing=d.smetric_store_pricing,
            smetric_learn_fetch_cost=d.smetric_learn_fetch_cost,
            smetric_decode_mask=d.smetric_decode_mask,
            smetric_contract_base_s=d.smetric_contract_base_s,
            smetric_contract_input_tokens_per_s=d.smetric_contract_input_tokens_per_s,
            smetric_contract_tpot_s=d.smetric_contract_tpot_s,
        )

    def v2_port(self) -> ReferenceConfig:
        """This config with our port of the paper's v2 rule (``RouterConfig.v2_port()``): the v2
        SLO-feasibility rule (§6 item 8), every smetric+ switch off, a global hit free, no mask."""
        return replace(self.v1(), smetric_rule="v2")

    def paper(self) -> ReferenceConfig:
        """This config with SMetric as its authors ship it co-located (``RouterConfig.paper()``):
        the v2 port with local-only pricing, the honest decode mask and a fixed drain rate. The
        reference prices locally but does not model the mask (its decisions differ from the
        core's wherever the mask binds; the differential test runs the mask off)."""
        return replace(
            self.v2_port(),
            smetric_store_pricing=False,
            smetric_decode_mask="honest",
            smetric_drain_rate=21400.0,
        )
