"""Routing policies and the counter-based random generator they break ties with.

Mirrors docs/routing-semantics.md §5 (random numbers) and §6 (policies). Each policy is one
function returning (position in the candidate list, reason). All scores are Python floats (IEEE
f64) computed in the order the spec writes them, so they round exactly like the Rust core.
Ties are exact float equality; a random tie-break draws only when more than one candidate is tied.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .config import ReferenceConfig
from .load import prefill_work

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def splitmix64_mix(z: int) -> int:
    """The splitmix64 finaliser of §5, everything mod 2^64."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


class CounterRng:
    """Draw k is mix(seed + (k + 1) * golden): stateless apart from the draw counter (§5)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed & _MASK64
        self.draws = 0  # k of the next draw

    def next_u64(self) -> int:
        z = (self.seed + (self.draws + 1) * _GOLDEN) & _MASK64
        self.draws += 1
        return splitmix64_mix(z)

    def uniform(self) -> float:
        """A float in [0, 1): the top 53 bits of a draw."""
        return (self.next_u64() >> 11) * 2.0**-53

    def below(self, m: int) -> int:
        """`draw % m`; callers only ask when m > 1."""
        return self.next_u64() % m


@dataclass(frozen=True)
class Candidate:
    """One live instance as the policies see it (§6), in slot order."""

    local_hit: int  # L_i, local hit tokens
    bs: int  # effective (§3)
    waiting: int  # effective (§3)
    queued: int  # router's own
    active: int  # router's own
    queued_work: int = 0  # router's own (§6 item 8)
    drain_rate: float = 22000.0  # work units/s: configured, learned or the fallback (§6 item 8)
    peer_drain_rate: float | None = None  # vllm-router's: configured or its learned p90 (§6 item 12)
    recent_requests: int = 0  # `preble`: requests routed here within the window (§6 item 13)
    recent_cost_us: int = 0  # `preble`: their AIBrix cost, microseconds
    name_hash: int = 0  # xxh3_64 of the instance's name: its identity to the hash policies (§6 item 15)
    evicted_age_s: float | None = None  # seconds since the newest block its GPU cache gave up was used (§6 item 8)
    tpot_s: float | None = None  # predicted decode pace with the request added, s a token (§6 item 8)
    fetch_cost: float = 0.0  # work units a token loaded from the store costs here (§6 item 8; 0: free)


def evicted_age_s(evicted_touch_ms: int | None, now_ms: int) -> float | None:
    """`Candidate.evicted_age_s` from the index's newest given-up touch time."""
    return None if evicted_touch_ms is None else float(max(now_ms - evicted_touch_ms, 0)) / 1000.0


@dataclass(frozen=True)
class RouteInput:
    """Per-request inputs shared by all candidates."""

    n: int  # prompt tokens
    global_hit: int  # Gh; 0 when the global tier is disabled
    block_size: int
    first_turn: bool
    previous: int | None = None  # position of the caller's previous_instance, if a candidate (§6 item 14)
    hash_key: int = 0  # the caller's session_key, else prompt_key (§6 item 15)


def pick_among(positions: Sequence[int], rng: CounterRng) -> int:
    """Random tie-break among `positions` (slot order); no draw when only one is left (§5)."""
    if len(positions) == 1:
        return positions[0]
    return positions[rng.below(len(positions))]


def keep_min(positions: Sequence[int], value: Callable[[int], float]) -> list[int]:
    """The positions whose value equals the minimum value (exact float equality), in order."""
    best = min(value(i) for i in positions)
    return [i for i in positions if value(i) == best]


def keep_max(positions: Sequence[int], value: Callable[[int], float]) -> list[int]:
    best = max(value(i) for i in positions)
    return [i for i in positions if value(i) == best]


def argmin(positions: Sequence[int], value: Callable[[int], float], rng: CounterRng) -> int:
    return pick_among(keep_min(positions, value), rng)


# --- 1. round_robin -------------------------------------------------------------------------
def round_robin(cands: Sequence[Candidate], rr: int) -> tuple[int, str]:
    """`candidates[rr % N]`; the caller owns and advances `rr`."""
    return rr % len(cands), "round-robin"


# --- 2. least_load ---------------------------------------------------------------------------
def least_load(cands: Sequence[Candidate], rng: CounterRng) -> tuple[int, str]:
    """vLLM's DP balancer: argmin 4*w + bs."""
    return argmin(range(len(cands)), lambda i: 4.0 * float(cands[i].waiting) + float(cands[i].bs), rng), "least-load"


# --- 3. cache_first --------------------------------------------------------------------------
def _clamp01(x: float) -> float:
    return min(max(x, 0.0), 1.0)


def cache_first_scores(cands: Sequence[Candidate], req: RouteInput, weights: tuple[float, float, float]) -> list[float]:
    """The min-max normalised weighted score p_i of every candidate (§6.3)."""
    hit = [float(c.local_hit) / float(max(req.n, 1)) for c in cands]
    bs = [float(c.bs) for c in cands]
    act = [float(c.active) for c in cands]
    lo_hit, hi_hit = min(hit), max(hit)
    lo_bs, hi_bs = min(bs), max(bs)
    lo_a, hi_a = min(act), max(act)
    alpha, beta, gamma = weights
    p: list[float] = []
    for i in range(len(cands)):
        n0 = _clamp01((hit[i] - lo_hit) / max(hi_hit - lo_hit, 1e-6))
        n1 = _clamp01((hi_bs - bs[i]) / max(hi_bs - lo_bs, 1e-6))
        n2 = _clamp01((hi_a - act[i]) / max(hi_a - lo_a, 1e-6))
        p.append(alpha * n0 + beta * n1 + gamma * n2)
    return p


def cache_first_weighted(
    cands: Sequence[Candidate], req: RouteInput, weights: tuple[float, float, float], rng: CounterRng
) -> tuple[int, str]:
    """Bailian's scheduler: sample proportionally to a min-max normalised weighted score."""
    reason = "cache-first: weighted"
    p = cache_first_scores(cands, req, weights)
    total = 0.0
    for p_i in p:
        total += p_i
    if total <= 0.0:
        # Uniform pick: a tie among all N, so (like every tie-break) no draw when N == 1.
        return pick_among(range(len(cands)), rng), reason
    u = rng.uniform() * total
    running = 0.0
    for i, p_i in enumerate(p):
        running += p_i
        if running > u:
            return i, reason
    return len(cands) - 1, reason  # float round-off: the last candidate


def cache_first_argmax(
    cands: Sequence[Candidate], req: RouteInput, weights: tuple[float, float, float], rng: CounterRng
) -> tuple[int, str]:
    """The deterministic form: argmax p_i, ties at random."""
    p = cache_first_scores(cands, req, weights)
    return pick_among(keep_max(range(len(cands)), lambda i: p[i]), rng), "cache-first: argmax"


def cache_first_max_hit(cands: Sequence[Candidate], rng: CounterRng) -> tuple[int, str]:
    """argmax L; ties to the lowest bs; remaining ties at random."""
    tied = keep_max(range(len(cands)), lambda i: float(cands[i].local_hit))
    tied = keep_min(tied, lambda i: float(cands[i].bs))
    return pick_among(tied, rng), "cache-first: max-hit"


# --- 4. linear -------------------------------------------------------------------------------
def linear(cands: Sequence[Candidate], req: RouteInput, prefill_weight: float, rng: CounterRng) -> tuple[int, str]:
    """Dynamo's cost: argmin w*(q + new)/B + a/B, with new = n - L."""
    b = float(req.block_size)

    def cost(i: int) -> float:
        c = cands[i]
        new = float(req.n - c.local_hit)
        return prefill_weight * (float(c.queued) + new) / b + float(c.active) / b

    return argmin(range(len(cands)), cost, rng), "linear"


# --- 5. lmetric ------------------------------------------------------------------------------
def lmetric(cands: Sequence[Candidate], req: RouteInput, rng: CounterRng) -> tuple[int, str]:
    """argmin max(q + new, 1) * (bs + 1)."""

    def score(i: int) -> float:
        c = cands[i]
        new = float(req.n - c.local_hit)
        return max(float(c.queued) + new, 1.0) * (float(c.bs) + 1.0)

    return argmin(range(len(cands)), score, rng), "lmetric"


# --- 7. lpwl ---------------------------------------------------------------------------------
def lpwl(cands: Sequence[Candidate], req: RouteInput, rng: CounterRng) -> tuple[int, str]:
    """Least pending prefill work: argmin q + (n - max(L, Gh)), no batch term."""
    n = float(req.n)
    gh = float(req.global_hit)

    def work(i: int) -> float:
        c = cands[i]
        return float(c.queued) + (n - min(max(float(c.local_hit), gh), n))

    return argmin(range(len(cands)), work, rng), "lpwl"


# --- 9. llmd_prefix_load -----------------------------------------------------------------------
def llmd_prefix_load(
    cands: Sequence[Candidate], req: RouteInput, local_capacity_blocks: int, rng: CounterRng
) -> tuple[int, str]:
    """llm-d's prefix + load profile: argmax 2*prefix + free KV + inverse queue, ties at random."""
    b = req.block_size
    hashed = float(req.n // b * b)
    per_hashed = 1.0 / hashed if hashed > 0.0 else 0.0
    capacity = float(local_capacity_blocks) * float(b)
    q_lo = min(c.bs for c in cands)
    q_hi = max(c.bs for c in cands)

    def total(i: int) -> float:
        c = cands[i]
        prefix = min(float(c.local_hit) * per_hashed, 1.0)
        free_kv = 1.0 - min(max(float(c.active) / capacity, 0.0), 1.0)
        queue = 1.0 if q_lo == q_hi else float(q_hi - c.bs) / float(q_hi - q_lo)
        return 2.0 * prefix + free_kv + queue

    return argmin(range(len(cands)), lambda i: -total(i), rng), "llmd-prefix-load"


# --- 10. dynamo_host_tier ------------------------------------------------------------------------
def dynamo_host_tier(
    cands: Sequence[Candidate], req: RouteInput, prefill_weight: float, rng: CounterRng
) -> tuple[int, str]:
    """Dynamo's cost with tiered credit: argmin w*max(0, (q + n)/B - (dev + 0.75*host)/B) + a/B."""
    b = float(req.block_size)
    n = req.n
    global_hit = min(req.global_hit, n)

    def cost(i: int) -> float:
        c = cands[i]
        device = min(c.local_hit, n)
        host = max(global_hit - device, 0)
        raw = float(c.queued + n) / b
        credit = float(device) / b + 0.75 * (float(host) / b)
        return prefill_weight * max(raw - credit, 0.0) + float(c.active) / b

    return argmin(range(len(cands)), cost, rng), "dynamo-host-tier"


# --- 11. bailian_top3 ----------------------------------------------------------------------------
def bailian_top3(cands: Sequence[Candidate], req: RouteInput, rng: CounterRng) -> tuple[int, str]:
    """Bailian's rule as the SMetric authors port it: w_i = 2^(50*reuse + 20*(mean load - load)),
    load = bs / max bs; the three heaviest kept (ties in slot order), one sampled by weight."""
    per_token = 1.0 / float(req.n) if req.n > 0 else 0.0
    max_bs = max(c.bs for c in cands)
    max_load = 1.0 if max_bs == 0 else float(max_bs)
    loads = [float(c.bs) / max_load for c in cands]
    total_load = 0.0
    for x in loads:  # a plain left-to-right sum, as the core adds
        total_load += x
    mean = total_load / float(len(cands))
    weights = [
        2.0 ** (50.0 * min(float(c.local_hit) * per_token, 1.0) + 20.0 * (mean - loads[i])) for i, c in enumerate(cands)
    ]
    top = sorted(range(len(cands)), key=lambda i: -weights[i])[:3]
    if len(top) == 1:
        return top[0], "bailian-top3"
    total = 0.0
    for i in top:
        total += weights[i]
    u = rng.uniform() * total
    running = 0.0
    for i in top:
        running += weights[i]
        if running > u:
            return i, "bailian-top3"
    return top[-1], "bailian-top3"


# --- 12. vllm_router_smetric ---------------------------------------------------------------------
def vllm_router_smetric(
    cands: Sequence[Candidate], req: RouteInput, cfg: ReferenceConfig, rng: CounterRng, prefill_only: bool = False
) -> tuple[int, str]:
    """vllm-router's SMetric (PR #330): e_i = qw_i + work(n - min(L_i, n), n); meets_i when no rate is
    known or e_i / rate_i <= budget; score e_i * bs_i; a follow-up sticks to argmax L_i iff its hit
    beats HIT_RATIO * n and (it meets or nobody does)."""
    if cfg.vllm_router_smetric_form == "pr_literal":
        return _vllm_router_smetric_pr(cands, req, rng)
    n = req.n
    budget = cfg.smetric_ttft_slack * (cfg.smetric_ttft_base_s + cfg.smetric_ttft_s_per_token * float(n))
    everyone = range(len(cands))

    def pending(i: int) -> float:
        c = cands[i]
        return float(c.queued_work + prefill_work(n - min(c.local_hit, n), n, cfg.smetric_l_eq_tokens))

    def meets(i: int) -> bool:
        rate = cands[i].peer_drain_rate
        return rate is None or pending(i) / rate <= budget

    def score(i: int) -> float:
        return pending(i) if prefill_only else pending(i) * float(cands[i].bs)

    if req.first_turn:
        return argmin(everyone, score, rng), "first-turn: least-loaded"
    home = pick_among(keep_max(everyone, lambda i: float(cands[i].local_hit)), rng)
    if float(cands[home].local_hit) <= cfg.min_local_hit_ratio * float(n):
        return argmin(everyone, score, rng), "follow-up: migrate (local KV$ evicted)"
    if meets(home):
        return home, "follow-up: sticky"
    if not any(meets(i) for i in everyone):
        return home, "follow-up: sticky (no instance meets TTFT budget)"
    return argmin(everyone, score, rng), "follow-up: migrate (home misses TTFT budget)"


PR_HIT_RATIO = 0.5  # PR #330's constants (§6 item 12, PR-literal form)
PR_SLACK = 1.0
PR_TTFT_BASE_S = 1.0
PR_TTFT_S_PER_TOKEN = 0.0625 / 1000.0


def _vllm_router_smetric_pr(cands: Sequence[Candidate], req: RouteInput, rng: CounterRng) -> tuple[int, str]:
    """PR #330 as it ships: e_i = q_i + (n - min(L_i, n)) (linear work); budget SLACK * (1 s + 0.0625 s
    per 1K tokens * n); the home is argmax L_i, ties to the least e_i then at random; a follow-up
    sticks iff L_h > HIT_RATIO * n and (it meets or nobody does); else argmin e_i * bs_i."""
    n = req.n
    budget = PR_SLACK * (PR_TTFT_BASE_S + PR_TTFT_S_PER_TOKEN * float(n))
    everyone = range(len(cands))

    def pending(i: int) -> float:
        return float(cands[i].queued + (n - min(cands[i].local_hit, n)))

    def meets(i: int) -> bool:
        rate = cands[i].peer_drain_rate
        return rate is None or pending(i) / rate <= budget

    def score(i: int) -> float:
        return pending(i) * float(cands[i].bs)

    if req.first_turn:
        return argmin(everyone, score, rng), "first-turn: least-loaded"
    home = argmin(keep_max(everyone, lambda i: float(cands[i].local_hit)), pending, rng)
    if float(cands[home].local_hit) <= PR_HIT_RATIO * float(n):
        return argmin(everyone, score, rng), "follow-up: migrate (local KV$ evicted)"
    if meets(home):
        return home, "follow-up: sticky"
    if not any(meets(i) for i in everyone):
        return home, "follow-up: sticky (no instance meets TTFT budget)"
    return argmin(everyone, score, rng), "follow-up: migrate (home misses TTFT budget)"


# --- 13. preble --------------------------------------------------------------------------------
def _preble_linear_s(t: float) -> float:
    if t >= 384.0:
        return (0.27106428 * t + 10.52444263) / 1000.0
    if t >= 192.0:
        return (-295.0 + 3.125 * t - 6.4e-3 * (t * t)) / 1000.0
    return 55.0 / 1000.0


def _preble_attention_s(context: int, unique: int) -> float:
    unique = context if unique == 0 else unique
    if context <= 1024:
        return 0.80 / 1000.0
    forward = 4.65e-4 * float(context) + 0.398
    if unique <= 1024:
        forward /= 2.0
    return forward / 1000.0


def _preble_quadratic_s(t: float) -> float:
    if t >= 4096.0:
        return (-18.425 + 9.65e-3 * t + 5.4e-6 * (t * t)) / 1000.0
    return 0.0


def preble_routed_cost_us(n: int, cands: Sequence[Candidate]) -> int:
    """What a routed request adds to its instance's window: AIBrix's node cost
    miss * T(new, n) + 45 * 0.15 with new = n - max L, truncated to whole microseconds."""
    new = n - min(max(c.local_hit for c in cands), n)
    miss = float(new) / float(n) if n > 0 else 1.0
    t = float(new)
    prefill = (_preble_linear_s(t) + _preble_attention_s(n, new) + _preble_quadratic_s(t)) / 0.9
    return int((miss * prefill + 45.0 * 0.15) * 1e6)


def preble(cands: Sequence[Candidate], req: RouteInput, cfg: ReferenceConfig, rng: CounterRng) -> tuple[int, str]:
    """Preble as AIBrix ports it: gate to the least busy when in-flight counts differ by more than
    preble_imbalance_requests; if max L / n > preble_hit_threshold, the gated holders of the
    longest gated match with the fewest windowed requests, else the least windowed cost."""
    lo = min(c.bs for c in cands)
    hi = max(c.bs for c in cands)
    imbalanced = hi - lo > cfg.preble_imbalance_requests
    gated = [i for i, c in enumerate(cands) if not imbalanced or c.bs == lo]
    n = req.n
    ratio = float(max(c.local_hit for c in cands)) / float(n) if n > 0 else 0.0
    if ratio > cfg.preble_hit_threshold:
        longest = max(cands[i].local_hit for i in gated)
        holders = [i for i in gated if cands[i].local_hit == longest]
        return argmin(holders, lambda i: float(cands[i].recent_requests), rng), "preble: exploit"
    return argmin(gated, lambda i: float(cands[i].recent_cost_us), rng), "preble: explore"


# --- 14. llmd_session_affinity ---------------------------------------------------------------------
def llmd_session_affinity(cands: Sequence[Candidate], req: RouteInput, rng: CounterRng) -> tuple[int, str]:
    """llm-d's session-affinity + active-requests profile: argmax 1 * (i is the previous instance)
    + 1 * active score, active = 1 for bs 0 (or every bs 0), else (max bs - bs) / max bs."""
    max_bs = max(c.bs for c in cands)

    def total(i: int) -> float:
        c = cands[i]
        active = 1.0 if c.bs == 0 or max_bs == 0 else float(max_bs - c.bs) / float(max_bs)
        session = 1.0 if req.previous == i else 0.0
        return 1.0 * active + 1.0 * session

    return argmin(range(len(cands)), lambda i: -total(i), rng), "llmd-session-affinity"


# --- 15. consistent_hash, 16. rendezvous_hash -----------------------------------------------------
def prompt_key(chain: Sequence[int], n: int) -> int:
    """The hash key of a request without a session key: mix(last ^ n), last = the chain's last
    block hash (0 for a prompt shorter than a block)."""
    return splitmix64_mix((chain[-1] if chain else 0) ^ n)


def _argmax_u64(scores: Sequence[int], rng: CounterRng) -> int:
    best = max(scores)
    return pick_among([i for i, v in enumerate(scores) if v == best], rng)


VIRTUAL_NODES = 160  # vllm-router's virtual nodes per worker


def _ring_distance(point: int, name_hash: int) -> int:
    """Clockwise distance (mod 2^64) from `point` to the nearest of the instance's virtual nodes,
    node v at mix(name_hash + v * golden), v = 1..160."""
    return min(
        (splitmix64_mix((name_hash + v * _GOLDEN) & _MASK64) - point) & _MASK64 for v in range(1, VIRTUAL_NODES + 1)
    )


def consistent_hash(cands: Sequence[Candidate], req: RouteInput, rng: CounterRng) -> tuple[int, str]:
    """vllm-router's ring: the key's point mix(key); the owner is the candidate with the nearest
    virtual node at or after it, wrapping. Ties (one node point shared) at random."""
    point = splitmix64_mix(req.hash_key)
    dist = [_ring_distance(point, c.name_hash) for c in cands]
    return _argmax_u64([_MASK64 - d for d in dist], rng), "consistent-hash"


def rendezvous_hash(cands: Sequence[Candidate], req: RouteInput, rng: CounterRng) -> tuple[int, str]:
    """vllm-router's highest random weight: argmax mix(mix(key) ^ name_hash), ties at random."""
    k = splitmix64_mix(req.hash_key)
    return _argmax_u64([splitmix64_mix(k ^ c.name_hash) for c in cands], rng), "rendezvous-hash"


# --- 17. power_of_two ------------------------------------------------------------------------------
def power_of_two(cands: Sequence[Candidate], rng: CounterRng) -> tuple[int, str]:
    """Two distinct candidates a = below(N), b = below(N - 1) (+1 when >= a); b iff bs_b < bs_a.
    One candidate takes no draw, two take one (b is forced)."""
    if len(cands) < 2:
        return 0, "power-of-two"
    a = rng.below(len(cands))
    b = rng.below(len(cands) - 1) if len(cands) > 2 else 0  # of two, the second is forced: no draw
    if b >= a:
        b += 1
    return (b if cands[b].bs < cands[a].bs else a), "power-of-two"


# --- 18. vllm_router_cache_aware ---------------------------------------------------------------------
def vllm_router_cache_aware(
    cands: Sequence[Candidate], req: RouteInput, cfg: ReferenceConfig, rng: CounterRng
) -> tuple[int, str]:
    """vllm-router's cache_aware: the least loaded when hi - lo > abs and hi > rel * lo; else the
    holders of the best match when max L / n > cache_threshold; else the least loaded."""
    everyone = range(len(cands))
    lo = min(c.bs for c in cands)
    hi = max(c.bs for c in cands)
    imbalanced = hi - lo > cfg.cache_aware_balance_abs_threshold
    if imbalanced and float(hi) > float(lo) * cfg.cache_aware_balance_rel_threshold:
        return argmin(everyone, lambda i: float(cands[i].bs), rng), "vllm-router-cache-aware: load balance"
    best = max(c.local_hit for c in cands)
    rate = float(best) / float(req.n) if req.n > 0 else 0.0
    if rate > cfg.cache_aware_cache_threshold:
        return pick_among(
            [i for i in everyone if cands[i].local_hit == best], rng
        ), "vllm-router-cache-aware: cache affinity"
    return argmin(everyone, lambda i: float(cands[i].bs), rng), "vllm-router-cache-aware: low match"


# --- 6. smetric ------------------------------------------------------------------------------
def smetric(cands: Sequence[Candidate], req: RouteInput, cfg: ReferenceConfig, rng: CounterRng) -> tuple[int, str]:
    """First turns spread by a cache-blind cost; follow-ups stick to their home unless it lost
    its cache or is overloaded (the paper's threshold rule), or unless another instance scores
    better (the cost rule). The ``smetric_*`` switches of §6.6; all off is the paper's form."""
    f = cfg.global_fetch_cost
    w = cfg.smetric_active_weight
    n = float(req.n)
    gh = float(req.global_hit)
    everyone = range(len(cands))
    capacity = float(cfg.local_capacity_blocks) * float(req.block_size)

    def full(i: int, need: float) -> bool:
        return cfg.smetric_kv_fit and float(cands[i].active) + need > capacity

    def cost(i: int) -> float:
        li = float(cands[i].local_hit)
        return (n - max(li, gh)) + max(gh - li, 0.0) * f

    def work(i: int) -> float:
        c = cands[i]
        return float(c.queued) + cost(i) + w * float(c.active)

    def score(i: int) -> float:
        load = work(i)
        return max(load, 1.0) * (float(cands[i].bs) + 1.0) if cfg.smetric_batch_term else load

    if req.first_turn:
        blind = (n - gh) + gh * f  # local hits ignored on purpose (§6.6)

        def first_score(i: int) -> float:
            c = cands[i]
            load = float(c.queued) + blind + w * float(c.active)
            return load * (float(c.bs) + 1.0) if cfg.smetric_batch_term else load

        need = n + cfg.smetric_growth_headroom_tokens
        roomy_first = [i for i in everyone if not full(i, need)] or list(everyone)
        return argmin(roomy_first, first_score, rng), "first-turn: least-loaded"

    home_tied = keep_max(everyone, lambda i: float(cands[i].local_hit))
    home = argmin(home_tied, score, rng)
    roomy = [i for i in everyone if not full(i, n)]
    targets = roomy or list(everyone)
    evicted = float(cands[home].local_hit) < cfg.min_local_hit_ratio * n
    by_cost = cfg.smetric_migration in ("cost", "work") or (
        cfg.smetric_migration == "fetch" and gh >= cfg.min_local_hit_ratio * n
    )
    if by_cost:
        best = argmin(targets, score, rng)
        compared = work if cfg.smetric_migration == "work" else score
        if home in targets and compared(home) <= (1.0 + cfg.smetric_migration_margin) * compared(best):
            return home, "follow-up: sticky"
        if evicted:
            return best, "follow-up: migrate (local KV$ evicted)"
        return best, "follow-up: migrate (cheaper elsewhere)"
    if evicted:
        return argmin(targets, score, rng), "follow-up: migrate (local KV$ evicted)"

    count = float(len(cands))
    sum_q = 0.0
    sum_bs = 0.0
    for c in cands:
        sum_q += float(c.queued)
        sum_bs += float(c.bs)
    mean_q = sum_q / count
    mean_bs = sum_bs / count

    def blocked(i: int) -> bool:
        c = cands[i]
        overloaded = float(c.queued) > cfg.overload_factor * mean_q + float(cfg.overload_slack_tokens) or float(
            c.bs
        ) > cfg.overload_factor * mean_bs + float(cfg.overload_slack_requests)
        return overloaded or full(i, n)  # a full home is left even when every instance is full

    if blocked(home):
        calm = [i for i in everyone if not blocked(i)] or list(everyone)
        return argmin(calm, score, rng), "follow-up: migrate (home overloaded)"
    return home, "follow-up: sticky"


# --- 8. smetric v2 (the paper's SLO-feasibility rule) ----------------------------------------
def smetric_paper(
    cands: Sequence[Candidate], req: RouteInput, cfg: ReferenceConfig, rng: CounterRng
) -> tuple[int, str]:
    """§6 item 8: a follow-up sticks to its home iff the home meets its TTFT budget (or nobody
    does); first turns, evicted sessions and moves take the least pending work (times the batch,
    co-located; the reference has no PD pool)."""
    n = req.n
    gh = min(req.global_hit, n)
    # Local-only pricing (``smetric_store_pricing`` off): a global hit is computed like a miss.
    priced_gh = gh if cfg.smetric_store_pricing else 0
    everyone = range(len(cands))
    capacity = float(cfg.local_capacity_blocks) * float(req.block_size)
    budget = cfg.smetric_ttft_slack * (cfg.smetric_ttft_base_s + cfg.smetric_ttft_s_per_token * float(n))

    # A store hit loaded at the instance's learned fetch cost, or free.
    fetch_priced = cfg.smetric_store_pricing and cfg.smetric_learn_fetch_cost

    def pending(i: int) -> float:
        c = cands[i]
        x = n - min(max(c.local_hit, priced_gh), n)
        work = prefill_work(x, n, cfg.smetric_l_eq_tokens)
        if fetch_priced:
            work += math.ceil(float(max(gh - min(c.local_hit, n), 0)) * c.fetch_cost)
        return float(c.queued_work + work)

    def score(i: int) -> float:
        load = pending(i) + cfg.smetric_active_weight * float(cands[i].active)
        return load * float(cands[i].bs) if cfg.smetric_batch_term else load

    def meets(i: int) -> bool:
        return pending(i) / cands[i].drain_rate <= budget

    headroom = cfg.smetric_growth_headroom_tokens if req.first_turn else 0.0
    roomy = [i for i in everyone if not cfg.smetric_kv_fit or float(cands[i].active) + float(n) + headroom <= capacity]
    placeable = roomy or list(everyone)
    # The displacement guard: prefer instances whose cache gives up nothing used recently.
    guard = cfg.smetric_retention_s > 0.0

    def calm(i: int) -> bool:
        age = cands[i].evicted_age_s
        return not guard or age is None or age >= cfg.smetric_retention_s

    calm_targets = [i for i in placeable if calm(i)] if guard else []
    targets = calm_targets or placeable
    churning_everywhere = guard and not calm_targets
    # The decode budget: prefer instances predicted within it per output token.
    tpot_budget = cfg.smetric_tpot_budget_s

    def paced(i: int) -> bool:
        p = cands[i].tpot_s
        return tpot_budget <= 0.0 or p is None or p <= tpot_budget

    paced_targets = [i for i in targets if paced(i)] if tpot_budget > 0.0 else []
    targets = paced_targets or targets
    # The KV-bound regime: the fleet's in-flight prompts fill this share of its GPU KV.
    kv_bound = cfg.smetric_kv_bound_share > 0.0 and float(
        sum(c.active for c in cands)
    ) >= cfg.smetric_kv_bound_share * capacity * float(len(cands))

    if req.first_turn:
        return argmin(targets, score, rng), "first-turn: least-loaded"
    home = argmin(keep_max(everyone, lambda i: float(cands[i].local_hit)), score, rng)

    def unless_over_budget(stay: tuple[int, str]) -> tuple[int, str]:
        """A stay stands unless the home is over the decode budget and a paced target meets (not
        while the fleet is KV-bound)."""
        if paced(home) or not paced_targets or kv_bound:
            return stay
        ok = [i for i in targets if meets(i)]
        return (argmin(ok, score, rng), "follow-up: migrate (home misses TPOT budget)") if ok else stay

    if float(cands[home].local_hit) <= cfg.min_local_hit_ratio * float(n):
        return argmin(targets, score, rng), "follow-up: migrate (local KV$ evicted)"
    if home not in placeable:
        return argmin(targets, score, rng), "follow-up: migrate (home overloaded)"
    by_cost = cfg.smetric_migration in ("cost", "work") or (
        cfg.smetric_migration == "fetch" and float(gh) >= cfg.min_local_hit_ratio * float(n)
    )
    if by_cost:
        if churning_everywhere:
            return home, "follow-up: sticky (every target churning)"
        best = argmin(targets, score, rng)
        compared = pending if cfg.smetric_migration == "work" else score
        if compared(home) <= (1.0 + cfg.smetric_migration_margin) * compared(best):
            return unless_over_budget((home, "follow-up: sticky"))
        if kv_bound:
            return home, "follow-up: sticky (fleet KV-bound)"
        return best, "follow-up: migrate (cheaper elsewhere)"
    if meets(home):
        return unless_over_budget((home, "follow-up: sticky"))
    if not any(meets(i) for i in targets):
        return home, "follow-up: sticky (no instance meets TTFT budget)"
    if churning_everywhere:
        return home, "follow-up: sticky (every target churning)"
    if kv_bound:
        return home, "follow-up: sticky (fleet KV-bound)"
    return argmin(targets, score, rng), "follow-up: migrate (home misses TTFT budget)"
