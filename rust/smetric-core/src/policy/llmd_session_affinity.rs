//! `llmd_session_affinity`: llm-d's session-affinity + active-requests profile, the second
//! llm-d baseline of the SMetric paper (arXiv 2607.08565 v2: "llm-d session affinity + active
//! requests").
//!
//! Sources, read and restated here in our words: the scorers `pkg/plugins/scorer/
//! session_affinity.go` (at `0b592cd`) and `pkg/plugins/scorer/active_request.go` (at
//! `139bcce`) of `llm-d/llm-d-inference-scheduler`; the profile is llm-d's shipped
//! `payload-agnostic.yaml` (`config/charts/routerlib/templates/_config.yaml` of
//! `llm-d/llm-d-router` at `00bacf3`), which weighs `active-request-scorer` 1 and
//! `session-affinity-scorer` 1 under the default max-score picker; the SMetric authors ran
//! that profile (`LlmdSessionLoad` in `python/ssched/scheduler/policy/external.py` of
//! `clateral912/smetric-router-repro` at `a1c815b`).
//!
//! The peer form. After each response llm-d's endpoint picker sets a session cookie naming the
//! endpoint that served it; a client that echoes the cookie gets, on its next request, score 1
//! for that endpoint and 0 for every other one (the session-affinity scorer). The
//! active-request scorer counts the picker's own requests in flight per endpoint (opened when a
//! request is sent, closed when its response completes, dropped after a 2-minute timeout) and
//! scores `(max − count) / max`, `max` the largest count, 1 for an endpoint with none (or when
//! every count is 0). The picker takes the largest weighted sum, ties at random. Affinity is
//! soft: the previous endpoint at the largest count (sum 1) ties an idle one (sum 1).
//!
//! Mapping to this router: the cookie → `RouteRequest::previous_instance` (the caller names the
//! instance that served the session last; the proxy or the simulator's driver fills it the way
//! the client's echo would), resolved by the router to `SelectionInput::previous`, `None` when
//! the named instance is not a candidate (llm-d then scores every endpoint 0 too); the
//! picker's count → `bs`, requests in flight (the router's own count fused with a fresh engine
//! snapshot, as every policy here reads it; no 2-minute drop), `max` over the candidates.
//!
//! Score: `1 · (1 if i = previous else 0) + 1 · (1 if bs_i = 0 or max bs = 0 else (max bs −
//! bs_i) / max bs)`, argmax, ties at random.
//!
//! Invariants: reads no tunable; no state; scores are computed in one fixed order so the
//! Python reference finds the same ties.
//!
//! Complexity: O(N), two passes (the largest count, then the scores).

use super::{Policy, Reason, Selection, SelectionInput, argmin};

/// Weight of the session-affinity scorer in the profile.
const SESSION_WEIGHT: f64 = 1.0;
/// Weight of the active-request scorer in the profile.
const ACTIVE_WEIGHT: f64 = 1.0;

/// llm-d's session-affinity + active-requests profile.
#[derive(Debug, Default)]
pub struct LlmdSessionAffinity;

impl Policy for LlmdSessionAffinity {
    fn name(&self) -> &'static str {
        "llmd_session_affinity"
    }

    fn select(&self, input: &SelectionInput<'_>) -> Selection {
        let c = input.candidates;
        let max_bs = c.iter().map(|x| x.bs).max().unwrap_or(0);
        let total = |i: usize| {
            let active = if c[i].bs == 0 || max_bs == 0 {
                1.0
            } else {
                (max_bs - c[i].bs) as f64 / max_bs as f64
            };
            let session = if input.previous == Some(i) { 1.0 } else { 0.0 };
            ACTIVE_WEIGHT * active + SESSION_WEIGHT * session
        };
        // The highest total as the lowest negated one: the same exact-equality ties.
        let index = argmin(c.len(), input.rng, |i| -total(i));
        Selection {
            index,
            reason: Reason::LlmdSessionAffinity,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RouterConfig;
    use crate::policy::SelectionInput;
    use crate::policy::test_support::{cand, input};
    use crate::rng::DrawCounter;

    fn with_previous<'a>(base: &SelectionInput<'a>, previous: Option<usize>) -> SelectionInput<'a> {
        SelectionInput { previous, ..*base }
    }

    #[test]
    fn the_previous_instance_wins_unless_it_is_the_busiest() {
        let cfg = RouterConfig::default();
        let rng = DrawCounter::new(0);
        // In flight 2, 4, 3: active scores 0.5, 0, 0.25.
        let c = [cand(0, 0, 2, 0), cand(1, 0, 4, 0), cand(2, 0, 3, 0)];
        let at = |previous| LlmdSessionAffinity.select(&with_previous(&input(&c, 100, false, &cfg, &rng), previous));
        assert_eq!(at(Some(2)).index, 2, "1 + 0.25 beats 0.5");
        assert_eq!(at(None).index, 0, "no session: the least busy");
        assert_eq!(at(Some(0)).reason, Reason::LlmdSessionAffinity);
        assert_eq!(rng.draws(), 0);
        // The busiest previous instance (1 + 0) ties an idle one (0 + 1): ties at random.
        let c = [cand(0, 0, 4, 0), cand(1, 0, 0, 0)];
        let picks: Vec<usize> = (0..30)
            .map(|seed| {
                let rng = DrawCounter::new(seed);
                LlmdSessionAffinity
                    .select(&with_previous(&input(&c, 100, false, &cfg, &rng), Some(0)))
                    .index
            })
            .collect();
        assert!(picks.contains(&0) && picks.contains(&1), "{picks:?}");
    }

    #[test]
    fn an_idle_fleet_scores_every_instance_one() {
        let cfg = RouterConfig::default();
        let c = [cand(0, 0, 0, 0), cand(1, 0, 0, 0), cand(2, 0, 0, 0)];
        let rng = DrawCounter::new(3);
        let s = LlmdSessionAffinity.select(&with_previous(&input(&c, 100, false, &cfg, &rng), Some(1)));
        assert_eq!(s.index, 1);
        let picks: Vec<usize> = (0..30)
            .map(|seed| {
                let rng = DrawCounter::new(seed);
                LlmdSessionAffinity.select(&input(&c, 100, false, &cfg, &rng)).index
            })
            .collect();
        assert!([0, 1, 2].iter().all(|k| picks.contains(k)), "{picks:?}");
    }
}
