//! [`CorePdPlacer`]: the real `smetric_core::PdRouter` behind the simulator's [`Placer`] seam.
//!
//! Every request is routed once, by `PdRouter::route` with its chain as a pre-hashed prompt,
//! the simulated time and the turn as [`TurnFeed`] says (as [`crate::CorePlacer`]). Prefill
//! instances are slots `0..P` (`p0 …`), decode instances `P..P+D` (`d0 …`). Lifecycle calls are
//! forwarded at the simulated times the engines produce them; engine load reports go to the
//! prefill router (prefill instances) or to the decode pool's KV usage (decode instances).
//! The prefill index is fed by insert on route only (`SimConfig::validate` enforces it).
//!
//! Complexity: the core's cost per decision plus O(chain) to copy the chain.

use smetric_core::pd::{PdConfig, PdRouter};
use smetric_core::{BlockHash, PolicyKind, RequestId, RouterConfig};

use crate::config::TurnFeed;
use crate::error::{Result, SimError};
use crate::placement::{EngineLoadReport, PlaceRequest, Placement, Placer};

/// The PD routing core as a placer.
#[derive(Debug)]
pub struct CorePdPlacer {
    router: PdRouter,
    prefill: u32,
    names: Vec<String>,
    chain: Vec<BlockHash>,
    turns: TurnFeed,
}

impl CorePdPlacer {
    /// A PD router over `prefill` prefill and `decode` decode instances; `config` for the
    /// prefill side (as a co-located router), `pd` for the decode side.
    pub fn new(
        prefill: u32,
        decode: u32,
        policy: PolicyKind,
        block_tokens: u32,
        seed: u64,
        config: RouterConfig,
        pd: PdConfig,
    ) -> Result<Self> {
        let p: Vec<String> = (0..prefill).map(|i| format!("p{i}")).collect();
        let d: Vec<String> = (0..decode).map(|i| format!("d{i}")).collect();
        let router = PdRouter::new(&p, &d, policy, block_tokens, seed, config, pd)
            .map_err(|e| SimError::Router(e.to_string()))?;
        Ok(Self {
            router,
            prefill,
            names: p.into_iter().chain(d).collect(),
            chain: Vec::new(),
            turns: TurnFeed::default(),
        })
    }

    /// The same placer, telling the router each request's turn as `turns` says.
    #[must_use]
    pub fn with_turns(mut self, turns: TurnFeed) -> Self {
        self.turns = turns;
        self
    }

    /// The wrapped router (for its stats).
    pub fn router(&self) -> &PdRouter {
        &self.router
    }
}

impl Placer for CorePdPlacer {
    fn policy(&self) -> String {
        self.router.prefill().policy().name().to_owned()
    }

    fn decode_rule(&self) -> String {
        self.router.decode_rule().name().to_owned()
    }

    fn place(&mut self, request: &PlaceRequest<'_>) -> Result<Placement> {
        self.chain.clear();
        self.chain.extend(request.chain.iter().map(|&h| BlockHash(h)));
        let decision = self
            .router
            .route(&request.route_request(&self.chain, self.turns, &self.names))
            .map_err(|e| SimError::Router(e.to_string()))?;
        let p = &decision.prefill;
        Ok(Placement {
            instance: p.instance.0,
            first_turn: Some(p.first_turn),
            local_hit_tokens: p.local_hit_tokens,
            global_hit_tokens: p.global_hit_tokens,
            prefill_tokens: p.prefill_tokens,
            reason: p.reason.name(),
            decode_instance: Some(self.prefill + decision.decode_instance.0),
            held: false,
            release_at_s: None,
        })
    }

    fn on_prefilled(&mut self, request_id: u64, now: f64) {
        // The simulated clock is finite and >= 0, so the call cannot fail; the router's
        // answer (whether a counter changed) carries nothing the simulation needs.
        let _ = self.router.on_prefilled_at(RequestId(request_id), Some(now));
    }

    fn on_transferred(&mut self, request_id: u64, _now: f64) {
        self.router.on_transferred(RequestId(request_id));
    }

    fn on_finished(&mut self, request_id: u64, output_tokens: u32, _now: f64) {
        self.router.on_finished(RequestId(request_id), u64::from(output_tokens));
    }

    fn on_load(&mut self, instance: u32, snapshot: EngineLoadReport, now: f64) {
        let Some(name) = self.names.get(instance as usize) else {
            return;
        };
        // Every name exists (the router was built from them) and the usage is a share in
        // [0, 1], so neither call can fail.
        if instance < self.prefill {
            let _ = self.router.prefill().update_load(
                name,
                Some(u64::from(snapshot.running)),
                Some(u64::from(snapshot.waiting)),
                Some(snapshot.kv_usage),
                Some(now),
            );
        } else {
            let _ = self
                .router
                .update_decode_load(name, snapshot.kv_usage.clamp(0.0, 1.0), Some(now));
        }
    }
}
