//! The decode side of a PD decision: which decode instance receives a prefilled request.
//!
//! Every rule first filters to the instances where the request fits: free KV blocks (the
//! capacity minus what the router reserved there, or the engine's reported usage when that
//! is higher) ≥ the blocks of the request's full context, and a batch below the engine's
//! `max_num_seqs`. When none fits, every instance is a candidate (the engine queues the
//! request; the router never refuses). Then:
//!
//! * [`DecodeRule::KvFit`] (smetric) — argmin `used_tokens + pull_tokens`: the KV tokens the
//!   instance's decode steps already read (a decode step's time grows with the context it
//!   attends over, perf-model §6) plus the tokens this request must pull over the network
//!   (its context minus what the decode instance's own prefix cache still holds: vLLM pulls
//!   only the blocks it lacks). Both are tokens, so no weight is needed. Ties → smaller
//!   batch → random.
//! * [`DecodeRule::LeastBatch`] — argmin batch (the first suggestion of `docs/algorithms.md` §4).
//! * [`DecodeRule::PowerOfTwo`] — vllm-router's and SMG's recommended decode policy: two
//!   distinct random instances, the one with fewer requests in flight (ties: the first drawn).
//! * [`DecodeRule::RoundRobin`] — vLLM's toy proxy.
//!
//! Why KvFit for smetric: on agent traces decode contexts are long (tens of thousands of
//! tokens) and output short, so a decode instance's step time and its preemption risk follow
//! its resident KV, not its request count; and a session's follow-up sent to the decode
//! instance that served its previous turn pulls only the new tokens.
//!
//! What the alternatives measured (docs/results.md §12.5, tuning window Weka 0476–0549, smetric
//! on the prefill side, peak prefill TPS under the TTFT SLO, mean of 3 seeds): at 8P:8D kv_fit
//! 77,747, least_batch 77,548, power_of_two 72,441, round_robin 42,368; at 6P:10D 73,546,
//! 69,551, 70,829, 43,223. On the report windows the whole of smetric's PD lead over the
//! baselines is this rule's: a baseline's prefill policy with kv_fit matches it (§12.2).
//!
//! Complexity: O(decode instances) per decision.

use crate::policy::argmin_by;
use crate::rng::DrawCounter;

/// How the decode instance is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeRule {
    /// smetric: least resident KV plus transfer, among the instances where the context fits.
    KvFit,
    /// Fewest requests in flight.
    LeastBatch,
    /// Two random instances, the less loaded (vllm-router `power_of_two`).
    PowerOfTwo,
    /// Rotate.
    RoundRobin,
}

impl DecodeRule {
    /// Every rule, in report order.
    pub const ALL: [DecodeRule; 4] = [Self::KvFit, Self::LeastBatch, Self::PowerOfTwo, Self::RoundRobin];

    /// The rule's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::KvFit => "kv_fit",
            Self::LeastBatch => "least_batch",
            Self::PowerOfTwo => "power_of_two",
            Self::RoundRobin => "round_robin",
        }
    }

    /// Parses a rule name.
    pub fn parse(name: &str) -> crate::Result<Self> {
        Self::ALL
            .into_iter()
            .find(|r| r.name() == name)
            .ok_or_else(|| crate::SmetricError::InvalidConfig {
                field: "decode_rule",
                reason: format!("{name:?} is not one of {}", Self::ALL.map(DecodeRule::name).join(", ")),
            })
    }

    /// The decode rule a peer router runs beside `policy` on the prefill side: round-robin
    /// with round-robin (vLLM's proxy), KvFit with smetric, power-of-two with every other
    /// (vllm-router and SMG: cache-aware prefill, power-of-two decode).
    pub fn peer_form(policy: crate::PolicyKind) -> Self {
        match policy {
            crate::PolicyKind::RoundRobin => Self::RoundRobin,
            crate::PolicyKind::Smetric => Self::KvFit,
            _ => Self::PowerOfTwo,
        }
    }
}

/// One decode instance as the rule sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecodeCandidate {
    /// Requests in flight (routed, not finished).
    pub bs: u64,
    /// KV blocks in use: the router's reservations, or the engine's usage when higher.
    pub used_blocks: u64,
    /// Blocks of the request's context the instance's prefix cache holds.
    pub hit_blocks: u64,
}

/// What the rule needs about the request and the pool.
#[derive(Clone, Copy, Debug)]
pub struct DecodeInput<'a> {
    /// The candidates, in slot order (never empty).
    pub candidates: &'a [DecodeCandidate],
    /// Blocks of the request's full context.
    pub context_blocks: u64,
    /// Blocks per decode instance.
    pub capacity_blocks: u64,
    /// Batch bound per decode instance.
    pub max_batch: u64,
    /// Tokens per block.
    pub block_size: u32,
}

impl DecodeInput<'_> {
    fn fits(&self, i: usize) -> bool {
        let c = &self.candidates[i];
        c.used_blocks + self.context_blocks <= self.capacity_blocks && c.bs < self.max_batch
    }
}

/// The chosen candidate's index. `rr` is the rotation counter of [`DecodeRule::RoundRobin`].
pub fn choose(rule: DecodeRule, input: &DecodeInput<'_>, rng: &DrawCounter, rr: &mut u64) -> usize {
    let n = input.candidates.len();
    let any_fits = (0..n).any(|i| input.fits(i));
    let allowed = |i: usize| !any_fits || input.fits(i);
    let cands = input.candidates;
    let block = f64::from(input.block_size);
    match rule {
        DecodeRule::RoundRobin => {
            let k = (*rr % n as u64) as usize;
            *rr += 1;
            k
        }
        DecodeRule::LeastBatch => argmin_by(n, rng, allowed, |i| cands[i].bs as f64).unwrap_or(0),
        DecodeRule::KvFit => {
            let pull = |i: usize| input.context_blocks.saturating_sub(cands[i].hit_blocks);
            let score = |i: usize| (cands[i].used_blocks + pull(i)) as f64 * block;
            // Ties of the token score go to the smaller batch, then at random.
            let best = (0..n).filter(|&i| allowed(i)).map(score).fold(f64::INFINITY, f64::min);
            #[allow(clippy::float_cmp)]
            let tied = |i: usize| allowed(i) && score(i) == best;
            argmin_by(n, rng, tied, |i| cands[i].bs as f64).unwrap_or(0)
        }
        DecodeRule::PowerOfTwo => {
            let pool: Vec<usize> = (0..n).filter(|&i| allowed(i)).collect();
            if pool.len() == 1 {
                return pool[0];
            }
            let first = rng.pick(pool.len());
            let mut second = rng.pick(pool.len() - 1);
            if second >= first {
                second += 1;
            }
            let (first, second) = (pool[first], pool[second]);
            if cands[second].bs < cands[first].bs {
                second
            } else {
                first
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(bs: u64, used: u64, hit: u64) -> DecodeCandidate {
        DecodeCandidate {
            bs,
            used_blocks: used,
            hit_blocks: hit,
        }
    }

    fn input(c: &[DecodeCandidate], context: u64) -> DecodeInput<'_> {
        DecodeInput {
            candidates: c,
            context_blocks: context,
            capacity_blocks: 100,
            max_batch: 8,
            block_size: 16,
        }
    }

    #[test]
    fn kv_fit_prefers_least_kv_plus_pull_among_fitting() {
        let rng = DrawCounter::new(0);
        let mut rr = 0;
        // 0: lots of KV; 1: little KV; 2: more KV than 1 but holds the prefix.
        let c = [cand(1, 80, 0), cand(5, 30, 0), cand(2, 40, 30)];
        assert_eq!(choose(DecodeRule::KvFit, &input(&c, 40), &rng, &mut rr), 2);
        // Without the hit, instance 1 wins.
        let c = [cand(1, 80, 0), cand(5, 30, 0), cand(2, 40, 0)];
        assert_eq!(choose(DecodeRule::KvFit, &input(&c, 40), &rng, &mut rr), 1);
        // Instance 0 would be cheapest (it holds the prefix) but 60 + 50 blocks do not fit.
        let fit = [cand(0, 60, 50), cand(0, 45, 0)];
        assert_eq!(choose(DecodeRule::KvFit, &input(&fit, 50), &rng, &mut rr), 1);
        // Nothing fits: least KV over all.
        assert_eq!(choose(DecodeRule::KvFit, &input(&c, 90), &rng, &mut rr), 1);
        // A full batch does not fit.
        let c = [cand(8, 0, 0), cand(1, 10, 0)];
        assert_eq!(choose(DecodeRule::KvFit, &input(&c, 10), &rng, &mut rr), 1);
        // Token ties go to the smaller batch.
        let c = [cand(3, 10, 0), cand(1, 10, 0)];
        assert_eq!(choose(DecodeRule::KvFit, &input(&c, 10), &rng, &mut rr), 1);
    }

    #[test]
    fn power_of_two_takes_the_less_loaded_of_two_distinct() {
        let c = [cand(9, 0, 0), cand(1, 0, 0), cand(5, 0, 0)];
        let mut rr = 0;
        let mut seen = [0; 3];
        for seed in 0..200 {
            let rng = DrawCounter::new(seed);
            let k = choose(DecodeRule::PowerOfTwo, &input(&c, 1), &rng, &mut rr);
            seen[k] += 1;
        }
        // Instance 0 (bs 9) is not allowed (batch bound 8) and loses every pair anyway.
        assert_eq!(seen[0], 0);
        assert!(seen[1] > 0 && seen[2] == 0, "{seen:?}");
        let c = [cand(0, 0, 0), cand(1, 0, 0), cand(2, 0, 0), cand(3, 0, 0)];
        let mut seen = [0; 4];
        for seed in 0..400 {
            let rng = DrawCounter::new(seed);
            seen[choose(DecodeRule::PowerOfTwo, &input(&c, 1), &rng, &mut rr)] += 1;
        }
        // The most loaded is never picked (it loses every pair); the least loaded most often.
        assert_eq!(seen[3], 0);
        assert!(seen[0] > seen[1] && seen[1] > seen[2] && seen[2] > 0, "{seen:?}");
    }

    #[test]
    fn round_robin_rotates_and_names_round_trip() {
        let c = [cand(0, 0, 0); 3];
        let rng = DrawCounter::new(0);
        let mut rr = 0;
        let picks: Vec<usize> = (0..4)
            .map(|_| choose(DecodeRule::RoundRobin, &input(&c, 1), &rng, &mut rr))
            .collect();
        assert_eq!(picks, [0, 1, 2, 0]);
        for r in DecodeRule::ALL {
            assert_eq!(DecodeRule::parse(r.name()).unwrap(), r);
        }
        assert!(DecodeRule::parse("nope").is_err());
        assert_eq!(
            DecodeRule::peer_form(crate::PolicyKind::Lmetric),
            DecodeRule::PowerOfTwo
        );
        assert_eq!(DecodeRule::peer_form(crate::PolicyKind::Smetric), DecodeRule::KvFit);
    }
}
