//! Test helper: a route of an already hashed chain, as the lifecycle tests send them.

use super::Router;
use crate::ids::{BlockHash, RequestId};
use crate::router::request::{Decision, Prompt, RouteRequest};
use crate::turn::TurnHint;

/// Routes request `id`: `tokens` prompt tokens whose full blocks are `chain`, as turn `turn`
/// (2 or more: a follow-up), at `now`, kept off `exclude`.
pub(super) fn route_chain(
    r: &Router,
    id: u64,
    chain: &[BlockHash],
    tokens: u64,
    turn: u32,
    now: f64,
    exclude: &[&str],
) -> Decision {
    r.route(&RouteRequest {
        turn: TurnHint::Turn(turn),
        request_id: Some(RequestId(id)),
        now: Some(now),
        exclude,
        ..RouteRequest::new(Prompt::Hashes {
            hashes: chain,
            num_tokens: Some(tokens),
        })
    })
    .unwrap()
}
