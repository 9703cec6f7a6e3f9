//! A routed request's lifecycle: prefilled (first token out), then finished or aborted.
//!
//! Algorithm: the decision records the request in the in-flight table with what it added to
//! the chosen instance's counters; `on_prefilled` lowers the prefill counters (tokens and
//! work) once and gives the instance's drain rate one sample (`drain_rate.rs`): the work
//! queued ahead of the request at routing plus its own, over the time since routing (and, while
//! `smetric` v2 learns the tier fetch's cost, a request that loaded from the store gives that
//! cost one: `fetch_cost.rs`);
//! `on_finished` / `on_aborted` lower the rest (and the prefill ones if `on_prefilled` never
//! came) and forget the request; with `smetric`'s decode mask on, `on_finished` also gives the
//! instance's decode pace one sample (`decode_contract.rs`): the time since the first token
//! over the output tokens after it; with its decode budget on, the fleet's decode model one
//! sample (`decode_model.rs`): that pace against the instance's in-flight context. In exact mode `on_finished` also credits the answer's full
//! blocks on the request's instance (docs §2.7, "The answer"): `⌊(n + output − 1) / block⌋`
//! minus the routed chain's blocks, past the chain's last block.
//!
//! Invariants: whatever the order and repetition of the calls, each counter a decision
//! raised is lowered exactly once; a call for an unknown or already finished request changes
//! no counter and is counted in `unknown_request_events`; a request whose instance left (or
//! whose slot was reused by a new instance) touches no counter.
//!
//! Complexity: O(1) per call: one hash-map operation under the table's mutex and a few
//! atomics; the index's exclusive lock is taken only by an exact-mode `on_finished` that credits an
//! answer (one map insert, amortised O(1)).

use std::sync::atomic::Ordering;

use super::{Router, to_ms};
use crate::config::VllmRouterSmetricForm;
use crate::decode_model::MIN_OUTPUT_TOKENS;
use crate::error::Result;
use crate::fetch_cost::FetchSample;
use crate::fleet::Fleet;
use crate::ids::{BlockHash, RequestId};
use crate::load::InstanceLoad;
use crate::policy::PolicyKind;

/// What a routed request added to its instance's counters.
#[derive(Debug, Clone, Copy)]
pub(super) struct InFlight {
    pub(super) slot: u32,
    pub(super) generation: u32,
    pub(super) prefill: u64,
    /// The prefill work charged (released with the prefill tokens), the fetch's included.
    pub(super) work: u64,
    /// Of `work`, the load from the shared store (0 unless the fetch cost is learned).
    pub(super) fetch_work: u64,
    /// Tokens loaded from the shared store (counted only while the fetch cost is learned).
    pub(super) fetched: u64,
    /// The chosen instance's queued work when the request was routed.
    pub(super) work_ahead: u64,
    /// The router's clock at routing, ms.
    pub(super) routed_ms: u64,
    pub(super) num_tokens: u64,
    pub(super) prefilled: bool,
    /// The router's clock at the first token, ms (meaningful once `prefilled`).
    pub(super) first_token_ms: u64,
    /// The instance's in-flight prompt tokens at the first token (meaningful once
    /// `prefilled`, and only read while the decode budget learns: `decode_model.rs`).
    pub(super) context_at_first_token: u64,
    /// The recorded output length the caller passed (the decode mask's oracle form).
    pub(super) output_tokens: Option<u64>,
    /// The last block of the chain routed (the prompt's last full block; none when the
    /// prompt is shorter than a block): where the answer's blocks hang (docs §2.7).
    pub(super) anchor: Option<BlockHash>,
    /// Blocks of the chain routed.
    pub(super) prompt_blocks: u64,
}

impl Router {
    /// The load counters of the slot a request was routed to in `fleet`, if that occupant is
    /// still there. Read through the caller's fleet guard: no reference count of the counters is
    /// taken, a cache line every lifecycle call would otherwise write.
    fn load_of<'f>(fleet: &'f Fleet, rec: &InFlight) -> Option<&'f InstanceLoad> {
        fleet
            .member(rec.slot)
            .filter(|m| m.generation == rec.generation)
            .map(|m| &*m.load)
    }

    fn unknown(&self) -> bool {
        self.unknown_events.fetch_add(1, Ordering::Relaxed);
        false
    }

    /// The request finished its prefill (its first token is out), now on the router's own
    /// clock. Returns whether a counter changed; repeated or unknown calls change nothing.
    pub fn on_prefilled(&self, id: RequestId) -> bool {
        self.on_prefilled_at(id, None).unwrap_or(false)
    }

    /// As [`Router::on_prefilled`], at time `now` in seconds (the clock `route` was given; the
    /// router's own when absent). The time since routing is a drain-rate sample.
    ///
    /// # Errors
    /// `InvalidArgument` if `now` is negative or not finite (nothing changes then).
    pub fn on_prefilled_at(&self, id: RequestId, now: Option<f64>) -> Result<bool> {
        let now_ms = self.now_ms(now)?;
        Ok(self.prefilled_at(id, now_ms))
    }

    /// The prefill step of `on_prefilled_at` on the millisecond clock.
    pub(crate) fn prefilled_at(&self, id: RequestId, now_ms: u64) -> bool {
        let mut requests = self.requests.lock();
        let Some(rec) = requests.get_mut(&id) else {
            return self.unknown();
        };
        if rec.prefilled {
            return false;
        }
        let fleet = self.fleet.load();
        let Some(load) = Self::load_of(&fleet, rec) else {
            return false;
        };
        rec.prefilled = true;
        rec.first_token_ms = now_ms;
        if self.decode_budget_on() {
            rec.context_at_first_token = load
                .effective(now_ms, to_ms(self.config.engine_load_staleness_s))
                .active;
        }
        let rec = *rec;
        drop(requests);
        load.on_prefilled(rec.prefill, rec.work);
        let elapsed_ms = now_ms.saturating_sub(rec.routed_ms);
        if rec.fetched > 0 {
            // The instance's rate now (the decision's, unless other first tokens moved it since),
            // before this request's own sample.
            let rate = self
                .config
                .smetric_drain_rate
                .unwrap_or_else(|| load.drain.rate_or(self.config.smetric_drain_rate_fallback));
            load.fetch.record(
                &FetchSample {
                    prompt_tokens: rec.num_tokens,
                    fetched_tokens: rec.fetched,
                    computed_work: rec.work - rec.fetch_work,
                    fetch_work: rec.fetch_work,
                    work_ahead: rec.work_ahead,
                    elapsed_s: elapsed_ms as f64 / 1000.0,
                    rate,
                },
                self.config.smetric_drain_window as usize,
                self.config.smetric_drain_min_samples as usize,
            );
        }
        load.drain.record(
            rec.work_ahead + rec.work,
            elapsed_ms,
            self.config.smetric_drain_window as usize,
            self.config.smetric_drain_min_samples as usize,
        );
        if self.kind == PolicyKind::VllmRouterSmetric {
            // Only that peer reads vllm-router's estimator: no other router pays for its sort.
            // The PR's own form prices (and so learns over) linear work: the prefilled tokens.
            let own = match self.config.vllm_router_smetric_form {
                VllmRouterSmetricForm::Tokens => rec.work,
                VllmRouterSmetricForm::PrLiteral => rec.prefill,
            };
            load.drain.record_own_work(own, elapsed_ms);
        }
        true
    }

    /// The request finished, having generated `output_tokens` tokens. The load board tracks
    /// prompt tokens (the prefill work a policy weighs); the output tokens are added to the
    /// `output_tokens` total of [`Router::stats`]. Returns whether a counter changed.
    ///
    /// In exact mode (`exact_answer_credit`), the answer's full blocks are credited on the
    /// request's instance at the router's own clock (docs §2.7): see [`Router::on_finished_at`].
    pub fn on_finished(&self, id: RequestId, output_tokens: u64) -> bool {
        self.on_finished_at(id, output_tokens, None).unwrap_or(false)
    }

    /// As [`Router::on_finished`], at time `now` in seconds (the clock `route` was given; the
    /// router's own when absent).
    ///
    /// Exact mode, docs §2.7 "The answer": vLLM caches the full blocks of prompt + answer
    /// whose KV it computed, i.e. of the first `n + output_tokens − 1` tokens (the last sampled
    /// token is never fed back), `⌊(n + output_tokens − 1) / block⌋` blocks, of which the
    /// routed chain held `prompt_blocks`. The rest are credited past the chain's last block
    /// until the engine's events confirm or evict them or the pending TTL passes.
    ///
    /// # Errors
    /// `InvalidArgument` if `now` is negative or not finite (nothing changes then).
    pub fn on_finished_at(&self, id: RequestId, output_tokens: u64, now: Option<f64>) -> Result<bool> {
        // The caller's time is checked before anything changes; the router's own clock is read
        // only when a decode sample or an answer's credit needs the time (by default neither).
        let given_ms = now.map(|t| self.now_ms(Some(t))).transpose()?;
        let Some(rec) = self.requests.lock().remove(&id) else {
            return Ok(self.unknown());
        };
        let needs_time =
            (rec.prefilled && (self.decode_budget_on() || self.decode_mask_on())) || self.credits_answers();
        let now_ms = match (given_ms, needs_time) {
            (Some(ms), _) => ms,
            (None, true) => self.now_ms(None)?,
            (None, false) => 0,
        };
        // One lookup of the instance serves the release and both decode samples.
        let fleet = self.fleet.load();
        let Some(load) = Self::load_of(&fleet, &rec) else {
            return Ok(false);
        };
        // The decode budget's sample: the stream's pace against its instance's context, the
        // mean of the context at its first token and now (before this request leaves it).
        let context_now = (rec.prefilled && self.decode_budget_on()).then(|| {
            load.effective(now_ms, to_ms(self.config.engine_load_staleness_s))
                .active
        });
        release_from(load, &rec);
        if let Some(context_now) = context_now
            && output_tokens >= MIN_OUTPUT_TOKENS
        {
            let pace_s = now_ms.saturating_sub(rec.first_token_ms) as f64 / 1000.0 / (output_tokens - 1) as f64;
            let context = (rec.context_at_first_token + context_now) as f64 / 2.0;
            self.decode_model.record(context, pace_s);
        }
        if rec.prefilled && self.decode_mask_on() {
            // The instance's decode pace, which the honest mask estimates streams by.
            load.decode_pace
                .record(output_tokens, now_ms.saturating_sub(rec.first_token_ms));
        }
        drop(fleet); // before the credit, which reads the fleet under the index's exclusive lock
        self.output_tokens.fetch_add(output_tokens, Ordering::Relaxed);
        self.credit_answer(&rec, output_tokens, now_ms);
        Ok(true)
    }

    /// Credits a finished request's answer blocks on its instance (exact mode, docs §2.7).
    fn credit_answer(&self, rec: &InFlight, output_tokens: u64, now_ms: u64) {
        let (Some(anchor), true) = (rec.anchor, output_tokens > 0) else {
            return;
        };
        if !self.credits_answers() {
            return;
        }
        let cached = (rec.num_tokens + output_tokens - 1) / u64::from(self.block_size);
        let blocks = cached.saturating_sub(rec.prompt_blocks);
        if blocks == 0 {
            return;
        }
        let blocks = u32::try_from(blocks).unwrap_or(u32::MAX);
        let mut index = self.write_index();
        // The slot may have changed hands since routing: credit only its routed occupant.
        let fleet = self.fleet.load();
        if fleet.member(rec.slot).is_some_and(|m| m.generation == rec.generation) {
            let depth = u32::try_from(rec.prompt_blocks).unwrap_or(u32::MAX);
            index.credit_answer(rec.slot, anchor, depth, blocks, now_ms);
        }
    }

    /// The request was aborted (client gone, engine error). Returns whether a counter changed.
    pub fn on_aborted(&self, id: RequestId) -> bool {
        let Some(rec) = self.requests.lock().remove(&id) else {
            return self.unknown();
        };
        self.release(&rec)
    }

    /// Releases a forgotten request's counters, applying its prefill step first if it never
    /// came. False when its instance left.
    fn release(&self, rec: &InFlight) -> bool {
        let fleet = self.fleet.load();
        let Some(load) = Self::load_of(&fleet, rec) else {
            return false;
        };
        release_from(load, rec);
        true
    }
}

/// Lowers what `rec` still counts on `load`, applying its prefill step first if it never came.
fn release_from(load: &InstanceLoad, rec: &InFlight) {
    if !rec.prefilled {
        // No first token came (aborted, or finished unreported): release, but learn nothing
        // about the drain rate.
        load.on_prefilled(rec.prefill, rec.work);
    }
    load.on_done(rec.num_tokens);
}
