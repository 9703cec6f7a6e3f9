//! `RouterConfig`: a frozen, keyword-only mirror of the core's config. Each keyword's
//! default is the core's `RouterConfig::DEFAULT` field, so defaults live in one place.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use smetric_core::{
    CacheFirstMode, DecodeMask, IndexMode, MigrationRule, RouterConfig, SmetricRule, VllmRouterSmetricForm,
};

use crate::errors::IntoPyResult;

const D: RouterConfig = RouterConfig::DEFAULT;

/// Tunables of a :class:`Router`. Keyword-only; every field has a documented default.
///
/// See ``docs/routing-semantics.md`` §9 for why each default is what it is.
#[pyclass(frozen, module = "smetric._core", name = "RouterConfig", eq)]
#[derive(Clone, PartialEq)]
pub(crate) struct PyRouterConfig {
    pub(crate) inner: RouterConfig,
}

#[pymethods]
impl PyRouterConfig {
    #[new]
    #[pyo3(signature = (
        *,
        hash_seed = D.hash_seed,
        index_mode = D.index_mode.name(),
        local_capacity_blocks = D.local_capacity_blocks,
        global_capacity_blocks = D.global_capacity_blocks,
        host_capacity_blocks = D.host_capacity_blocks,
        local_ttl_s = D.local_ttl_s,
        exact_pending_ttl_s = D.exact_pending_ttl_s,
        exact_answer_credit = D.exact_answer_credit,
        engine_load_staleness_s = D.engine_load_staleness_s,
        first_turn_min_branches = D.first_turn_min_branches,
        cache_first_mode = D.cache_first_mode.name(),
        cache_first_weights = D.cache_first_weights,
        linear_prefill_weight = D.linear_prefill_weight,
        global_fetch_cost = D.global_fetch_cost,
        host_fetch_cost = D.host_fetch_cost,
        min_local_hit_ratio = D.min_local_hit_ratio,
        overload_factor = D.overload_factor,
        overload_slack_tokens = D.overload_slack_tokens,
        overload_slack_requests = D.overload_slack_requests,
        smetric_active_weight = D.smetric_active_weight,
        smetric_batch_term = D.smetric_batch_term,
        smetric_migration = D.smetric_migration.name(),
        smetric_migration_margin = D.smetric_migration_margin,
        smetric_kv_fit = D.smetric_kv_fit,
        smetric_growth_headroom_tokens = D.smetric_growth_headroom_tokens,
        smetric_retention_s = D.smetric_retention_s,
        smetric_kv_bound_share = D.smetric_kv_bound_share,
        smetric_tpot_budget_s = D.smetric_tpot_budget_s,
        smetric_rule = D.smetric_rule.name(),
        smetric_l_eq_tokens = D.smetric_l_eq_tokens,
        smetric_ttft_slack = D.smetric_ttft_slack,
        smetric_ttft_base_s = D.smetric_ttft_base_s,
        smetric_ttft_s_per_token = D.smetric_ttft_s_per_token,
        smetric_drain_rate = D.smetric_drain_rate,
        smetric_drain_rate_fallback = D.smetric_drain_rate_fallback,
        smetric_drain_window = D.smetric_drain_window,
        smetric_drain_min_samples = D.smetric_drain_min_samples,
        smetric_store_pricing = D.smetric_store_pricing,
        smetric_learn_fetch_cost = D.smetric_learn_fetch_cost,
        smetric_decode_mask = D.smetric_decode_mask.name(),
        smetric_contract_base_s = D.smetric_contract_base_s,
        smetric_contract_input_tokens_per_s = D.smetric_contract_input_tokens_per_s,
        smetric_contract_tpot_s = D.smetric_contract_tpot_s,
        preble_window_s = D.preble_window_s,
        preble_hit_threshold = D.preble_hit_threshold,
        preble_imbalance_requests = D.preble_imbalance_requests,
        cache_aware_cache_threshold = D.cache_aware_cache_threshold,
        cache_aware_balance_abs_threshold = D.cache_aware_balance_abs_threshold,
        cache_aware_balance_rel_threshold = D.cache_aware_balance_rel_threshold,
        vllm_router_smetric_form = D.vllm_router_smetric_form.name(),
    ))]
    // One keyword per config field (booleans included): Python's signature is the config.
    #[allow(clippy::too_many_arguments, clippy::fn_params_excessive_bools)]
    fn new(
        hash_seed: u64,
        index_mode: &str,
        local_capacity_blocks: u64,
        global_capacity_blocks: u64,
        host_capacity_blocks: u64,
        local_ttl_s: Option<f64>,
        exact_pending_ttl_s: f64,
        exact_answer_credit: bool,
        engine_load_staleness_s: f64,
        first_turn_min_branches: u32,
        cache_first_mode: &str,
        cache_first_weights: (f64, f64, f64),
        linear_prefill_weight: f64,
        global_fetch_cost: f64,
        host_fetch_cost: f64,
        min_local_hit_ratio: f64,
        overload_factor: f64,
        overload_slack_tokens: f64,
        overload_slack_requests: f64,
        smetric_active_weight: f64,
        smetric_batch_term: bool,
        smetric_migration: &str,
        smetric_migration_margin: f64,
        smetric_kv_fit: bool,
        smetric_growth_headroom_tokens: f64,
        smetric_retention_s: f64,
        smetric_kv_bound_share: f64,
        smetric_tpot_budget_s: f64,
        smetric_rule: &str,
        smetric_l_eq_tokens: f64,
        smetric_ttft_slack: f64,
        smetric_ttft_base_s: f64,
        smetric_ttft_s_per_token: f64,
        smetric_drain_rate: Option<f64>,
        smetric_drain_rate_fallback: f64,
        smetric_drain_window: u32,
        smetric_drain_min_samples: u32,
        smetric_store_pricing: bool,
        smetric_learn_fetch_cost: bool,
        smetric_decode_mask: &str,
        smetric_contract_base_s: f64,
        smetric_contract_input_tokens_per_s: f64,
        smetric_contract_tpot_s: f64,
        preble_window_s: f64,
        preble_hit_threshold: f64,
        preble_imbalance_requests: u64,
        cache_aware_cache_threshold: f64,
        cache_aware_balance_abs_threshold: u64,
        cache_aware_balance_rel_threshold: f64,
        vllm_router_smetric_form: &str,
    ) -> PyResult<Self> {
        let inner = RouterConfig {
            hash_seed,
            index_mode: IndexMode::parse(index_mode).py()?,
            local_capacity_blocks,
            global_capacity_blocks,
            host_capacity_blocks,
            local_ttl_s,
            exact_pending_ttl_s,
            exact_answer_credit,
            engine_load_staleness_s,
            first_turn_min_branches,
            cache_first_mode: CacheFirstMode::parse(cache_first_mode).py()?,
            cache_first_weights,
            linear_prefill_weight,
            global_fetch_cost,
            host_fetch_cost,
            min_local_hit_ratio,
            overload_factor,
            overload_slack_tokens,
            overload_slack_requests,
            smetric_active_weight,
            smetric_batch_term,
            smetric_migration: MigrationRule::parse(smetric_migration).py()?,
            smetric_migration_margin,
            smetric_kv_fit,
            smetric_growth_headroom_tokens,
            smetric_retention_s,
            smetric_kv_bound_share,
            smetric_tpot_budget_s,
            smetric_rule: SmetricRule::parse(smetric_rule).py()?,
            smetric_l_eq_tokens,
            smetric_ttft_slack,
            smetric_ttft_base_s,
            smetric_ttft_s_per_token,
            smetric_drain_rate,
            smetric_drain_rate_fallback,
            smetric_drain_window,
            smetric_drain_min_samples,
            smetric_store_pricing,
            smetric_learn_fetch_cost,
            smetric_decode_mask: DecodeMask::parse(smetric_decode_mask).py()?,
            smetric_contract_base_s,
            smetric_contract_input_tokens_per_s,
            smetric_contract_tpot_s,
            preble_window_s,
            preble_hit_threshold,
            preble_imbalance_requests,
            cache_aware_cache_threshold,
            cache_aware_balance_abs_threshold,
            cache_aware_balance_rel_threshold,
            vllm_router_smetric_form: VllmRouterSmetricForm::parse(vllm_router_smetric_form).py()?,
        };
        inner.validate().py()?;
        Ok(Self { inner })
    }

    #[getter]
    fn hash_seed(&self) -> u64 {
        self.inner.hash_seed
    }
    #[getter]
    fn index_mode(&self) -> &'static str {
        self.inner.index_mode.name()
    }
    #[getter]
    fn local_capacity_blocks(&self) -> u64 {
        self.inner.local_capacity_blocks
    }
    #[getter]
    fn global_capacity_blocks(&self) -> u64 {
        self.inner.global_capacity_blocks
    }

    #[getter]
    fn host_capacity_blocks(&self) -> u64 {
        self.inner.host_capacity_blocks
    }
    #[getter]
    fn local_ttl_s(&self) -> Option<f64> {
        self.inner.local_ttl_s
    }
    #[getter]
    fn exact_pending_ttl_s(&self) -> f64 {
        self.inner.exact_pending_ttl_s
    }
    #[getter]
    fn exact_answer_credit(&self) -> bool {
        self.inner.exact_answer_credit
    }
    #[getter]
    fn engine_load_staleness_s(&self) -> f64 {
        self.inner.engine_load_staleness_s
    }
    #[getter]
    fn first_turn_min_branches(&self) -> u32 {
        self.inner.first_turn_min_branches
    }
    #[getter]
    fn cache_first_mode(&self) -> &'static str {
        self.inner.cache_first_mode.name()
    }
    #[getter]
    fn cache_first_weights(&self) -> (f64, f64, f64) {
        self.inner.cache_first_weights
    }
    #[getter]
    fn linear_prefill_weight(&self) -> f64 {
        self.inner.linear_prefill_weight
    }
    #[getter]
    fn global_fetch_cost(&self) -> f64 {
        self.inner.global_fetch_cost
    }

    #[getter]
    fn host_fetch_cost(&self) -> f64 {
        self.inner.host_fetch_cost
    }
    #[getter]
    fn min_local_hit_ratio(&self) -> f64 {
        self.inner.min_local_hit_ratio
    }
    #[getter]
    fn overload_factor(&self) -> f64 {
        self.inner.overload_factor
    }
    #[getter]
    fn overload_slack_tokens(&self) -> f64 {
        self.inner.overload_slack_tokens
    }
    #[getter]
    fn overload_slack_requests(&self) -> f64 {
        self.inner.overload_slack_requests
    }
    #[getter]
    fn smetric_active_weight(&self) -> f64 {
        self.inner.smetric_active_weight
    }
    #[getter]
    fn smetric_batch_term(&self) -> bool {
        self.inner.smetric_batch_term
    }
    #[getter]
    fn smetric_migration(&self) -> &'static str {
        self.inner.smetric_migration.name()
    }
    #[getter]
    fn smetric_migration_margin(&self) -> f64 {
        self.inner.smetric_migration_margin
    }
    #[getter]
    fn smetric_kv_fit(&self) -> bool {
        self.inner.smetric_kv_fit
    }
    #[getter]
    fn smetric_growth_headroom_tokens(&self) -> f64 {
        self.inner.smetric_growth_headroom_tokens
    }
    #[getter]
    fn smetric_retention_s(&self) -> f64 {
        self.inner.smetric_retention_s
    }
    #[getter]
    fn smetric_kv_bound_share(&self) -> f64 {
        self.inner.smetric_kv_bound_share
    }
    #[getter]
    fn smetric_tpot_budget_s(&self) -> f64 {
        self.inner.smetric_tpot_budget_s
    }
    #[getter]
    fn smetric_rule(&self) -> &'static str {
        self.inner.smetric_rule.name()
    }
    #[getter]
    fn smetric_l_eq_tokens(&self) -> f64 {
        self.inner.smetric_l_eq_tokens
    }
    #[getter]
    fn smetric_ttft_slack(&self) -> f64 {
        self.inner.smetric_ttft_slack
    }
    #[getter]
    fn smetric_ttft_base_s(&self) -> f64 {
        self.inner.smetric_ttft_base_s
    }
    #[getter]
    fn smetric_ttft_s_per_token(&self) -> f64 {
        self.inner.smetric_ttft_s_per_token
    }
    #[getter]
    fn smetric_drain_rate(&self) -> Option<f64> {
        self.inner.smetric_drain_rate
    }
    #[getter]
    fn smetric_drain_rate_fallback(&self) -> f64 {
        self.inner.smetric_drain_rate_fallback
    }
    #[getter]
    fn smetric_drain_window(&self) -> u32 {
        self.inner.smetric_drain_window
    }
    #[getter]
    fn smetric_drain_min_samples(&self) -> u32 {
        self.inner.smetric_drain_min_samples
    }
    #[getter]
    fn smetric_store_pricing(&self) -> bool {
        self.inner.smetric_store_pricing
    }
    #[getter]
    fn smetric_learn_fetch_cost(&self) -> bool {
        self.inner.smetric_learn_fetch_cost
    }
    #[getter]
    fn smetric_decode_mask(&self) -> &'static str {
        self.inner.smetric_decode_mask.name()
    }
    #[getter]
    fn smetric_contract_base_s(&self) -> f64 {
        self.inner.smetric_contract_base_s
    }
    #[getter]
    fn smetric_contract_input_tokens_per_s(&self) -> f64 {
        self.inner.smetric_contract_input_tokens_per_s
    }
    #[getter]
    fn smetric_contract_tpot_s(&self) -> f64 {
        self.inner.smetric_contract_tpot_s
    }
    #[getter]
    fn preble_window_s(&self) -> f64 {
        self.inner.preble_window_s
    }
    #[getter]
    fn preble_hit_threshold(&self) -> f64 {
        self.inner.preble_hit_threshold
    }
    #[getter]
    fn preble_imbalance_requests(&self) -> u64 {
        self.inner.preble_imbalance_requests
    }
    #[getter]
    fn cache_aware_cache_threshold(&self) -> f64 {
        self.inner.cache_aware_cache_threshold
    }
    #[getter]
    fn cache_aware_balance_abs_threshold(&self) -> u64 {
        self.inner.cache_aware_balance_abs_threshold
    }
    #[getter]
    fn cache_aware_balance_rel_threshold(&self) -> f64 {
        self.inner.cache_aware_balance_rel_threshold
    }
    #[getter]
    fn vllm_router_smetric_form(&self) -> &'static str {
        self.inner.vllm_router_smetric_form.name()
    }

    /// This config with SMetric as its authors ship it co-located (the v2 rule, local-only
    /// pricing, the honest decode mask, a fixed drain rate; every ``smetric_*`` field as in
    /// ``RouterConfig::PAPER``); the other fields unchanged.
    fn paper(&self) -> Self {
        Self {
            inner: self.inner.with_paper_smetric(),
        }
    }

    /// This config with our port of the paper's v2 rule (a global hit free, no decode mask, the
    /// drain rate learned; every ``smetric_*`` field as in ``RouterConfig::V2_PORT``); the
    /// other fields unchanged.
    fn v2_port(&self) -> Self {
        Self {
            inner: self.inner.with_v2_port_smetric(),
        }
    }

    /// This config with SMetric in the July paper's form (the v1 rule; every ``smetric_*``
    /// field as in ``RouterConfig::V1``); the other fields unchanged.
    fn v1(&self) -> Self {
        Self {
            inner: self.inner.with_v1_smetric(),
        }
    }

    /// Every field as a dict (for logs and reports).
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        let c = &self.inner;
        d.set_item("hash_seed", c.hash_seed)?;
        d.set_item("index_mode", c.index_mode.name())?;
        d.set_item("local_capacity_blocks", c.local_capacity_blocks)?;
        d.set_item("global_capacity_blocks", c.global_capacity_blocks)?;
        d.set_item("host_capacity_blocks", c.host_capacity_blocks)?;
        d.set_item("local_ttl_s", c.local_ttl_s)?;
        d.set_item("exact_pending_ttl_s", c.exact_pending_ttl_s)?;
        d.set_item("exact_answer_credit", c.exact_answer_credit)?;
        d.set_item("engine_load_staleness_s", c.engine_load_staleness_s)?;
        d.set_item("first_turn_min_branches", c.first_turn_min_branches)?;
        d.set_item("cache_first_mode", c.cache_first_mode.name())?;
        d.set_item("cache_first_weights", c.cache_first_weights)?;
        d.set_item("linear_prefill_weight", c.linear_prefill_weight)?;
        d.set_item("global_fetch_cost", c.global_fetch_cost)?;
        d.set_item("host_fetch_cost", c.host_fetch_cost)?;
        d.set_item("min_local_hit_ratio", c.min_local_hit_ratio)?;
        d.set_item("overload_factor", c.overload_factor)?;
        d.set_item("overload_slack_tokens", c.overload_slack_tokens)?;
        d.set_item("overload_slack_requests", c.overload_slack_requests)?;
        d.set_item("smetric_active_weight", c.smetric_active_weight)?;
        d.set_item("smetric_batch_term", c.smetric_batch_term)?;
        d.set_item("smetric_migration", c.smetric_migration.name())?;
        d.set_item("smetric_migration_margin", c.smetric_migration_margin)?;
        d.set_item("smetric_kv_fit", c.smetric_kv_fit)?;
        d.set_item("smetric_growth_headroom_tokens", c.smetric_growth_headroom_tokens)?;
        d.set_item("smetric_retention_s", c.smetric_retention_s)?;
        d.set_item("smetric_kv_bound_share", c.smetric_kv_bound_share)?;
        d.set_item("smetric_tpot_budget_s", c.smetric_tpot_budget_s)?;
        d.set_item("smetric_rule", c.smetric_rule.name())?;
        d.set_item("smetric_l_eq_tokens", c.smetric_l_eq_tokens)?;
        d.set_item("smetric_ttft_slack", c.smetric_ttft_slack)?;
        d.set_item("smetric_ttft_base_s", c.smetric_ttft_base_s)?;
        d.set_item("smetric_ttft_s_per_token", c.smetric_ttft_s_per_token)?;
        d.set_item("smetric_drain_rate", c.smetric_drain_rate)?;
        d.set_item("smetric_drain_rate_fallback", c.smetric_drain_rate_fallback)?;
        d.set_item("smetric_drain_window", c.smetric_drain_window)?;
        d.set_item("smetric_drain_min_samples", c.smetric_drain_min_samples)?;
        d.set_item("smetric_store_pricing", c.smetric_store_pricing)?;
        d.set_item("smetric_learn_fetch_cost", c.smetric_learn_fetch_cost)?;
        d.set_item("smetric_decode_mask", c.smetric_decode_mask.name())?;
        d.set_item("smetric_contract_base_s", c.smetric_contract_base_s)?;
        d.set_item(
            "smetric_contract_input_tokens_per_s",
            c.smetric_contract_input_tokens_per_s,
        )?;
        d.set_item("smetric_contract_tpot_s", c.smetric_contract_tpot_s)?;
        d.set_item("preble_window_s", c.preble_window_s)?;
        d.set_item("preble_hit_threshold", c.preble_hit_threshold)?;
        d.set_item("preble_imbalance_requests", c.preble_imbalance_requests)?;
        d.set_item("cache_aware_cache_threshold", c.cache_aware_cache_threshold)?;
        d.set_item("cache_aware_balance_abs_threshold", c.cache_aware_balance_abs_threshold)?;
        d.set_item("cache_aware_balance_rel_threshold", c.cache_aware_balance_rel_threshold)?;
        d.set_item("vllm_router_smetric_form", c.vllm_router_smetric_form.name())?;
        Ok(d)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let fields: Vec<String> = self
            .to_dict(py)?
            .iter()
            .map(|(k, v)| Ok(format!("{}={}", k.str()?, v.repr()?)))
            .collect::<PyResult<_>>()?;
        Ok(format!("RouterConfig({})", fields.join(", ")))
    }
}
