//! [`CorePlacer`]: the real `smetric_core::Router` behind the simulator's [`Placer`] seam.
//!
//! Every decision goes through `Router::route` with the request's trace chain as a
//! pre-hashed prompt (`Prompt::Hashes`), `TurnHint::Unknown` (the router infers the turn from
//! its index, statelessly, as in production) and the simulated time. Lifecycle calls are
//! forwarded at the simulated times the engine produces them. The router keeps its own
//! approximate index (insert on route) sized like the simulated pools, so its view of the
//! caches can drift from the engines' exactly as a real deployment's would.
//!
//! Complexity: one `route` per request (the core's cost) plus an O(chain) copy into a reused
//! `Vec<BlockHash>`.

use smetric_core::{BlockHash, PolicyKind, Prompt, RequestId, RouteRequest, Router, RouterConfig, TurnHint};

use crate::error::{Result, SimError};
use crate::placement::{LoadSnapshot, PlaceRequest, Placement, Placer};

/// The routing core as a placer.
#[derive(Debug)]
pub struct CorePlacer {
    router: Router,
    names: Vec<String>,
    chain: Vec<BlockHash>,
}

impl CorePlacer {
    /// A router over instances `i0 … i{n-1}` with `block_tokens`-token blocks.
    pub fn new(instances: u32, policy: PolicyKind, block_tokens: u32, seed: u64, config: RouterConfig) -> Result<Self> {
        let names: Vec<String> = (0..instances).map(|i| format!("i{i}")).collect();
        let router =
            Router::new(&names, policy, block_tokens, seed, config).map_err(|e| SimError::Router(e.to_string()))?;
        Ok(Self {
            router,
            names,
            chain: Vec::new(),
        })
    }

    /// The wrapped router (for its stats).
    pub fn router(&self) -> &Router {
        &self.router
    }
}

impl Placer for CorePlacer {
    fn policy(&self) -> String {
        self.router.policy().name().to_owned()
    }

    fn place(&mut self, request: &PlaceRequest<'_>) -> Result<Placement> {
        self.chain.clear();
        self.chain.extend(request.chain.iter().map(|&h| BlockHash(h)));
        let decision = self
            .router
            .route(&RouteRequest {
                prompt: Prompt::Hashes {
                    hashes: &self.chain,
                    num_tokens: Some(u64::from(request.prompt_tokens)),
                },
                namespace: None,
                turn: TurnHint::Unknown,
                request_id: Some(RequestId(request.request_id)),
                now: Some(request.now),
            })
            .map_err(|e| SimError::Router(e.to_string()))?;
        Ok(Placement {
            instance: decision.instance.0,
            first_turn: Some(decision.first_turn),
            local_hit_tokens: decision.local_hit_tokens,
            global_hit_tokens: decision.global_hit_tokens,
            prefill_tokens: decision.prefill_tokens,
            reason: decision.reason.as_str(),
        })
    }

    fn on_prefilled(&mut self, request_id: u64, _now: f64) {
        self.router.on_prefilled(RequestId(request_id));
    }

    fn on_finished(&mut self, request_id: u64, output_tokens: u32, _now: f64) {
        self.router.on_finished(RequestId(request_id), u64::from(output_tokens));
    }

    fn on_load(&mut self, instance: u32, snapshot: LoadSnapshot, now: f64) {
        if let Some(name) = self.names.get(instance as usize) {
            // The name always exists (the router was built from these names), so the
            // result carries no information worth propagating.
            let _ = self.router.update_load(
                name,
                Some(u64::from(snapshot.running)),
                Some(u64::from(snapshot.waiting)),
                Some(snapshot.kv_usage),
                Some(now),
            );
        }
    }
}
