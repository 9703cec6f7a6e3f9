"""`ReferenceRouter`: the plain-Python twin of `smetric.Router`.

Mirrors docs/routing-semantics.md as a whole: the §8 surface (same constructor, methods and
result fields), §7 instance slots and generations, §4 turn inference, §2.6 index modes, and the
glue between the index (index.py), the load board (load.py) and the policies (policies.py).
It is the oracle of the differential test: every step is written out in spec order, with no
caching and no shortcuts, so that a reader can check it line by line against the spec.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import SupportsIndex

from . import policies
from .config import ReferenceConfig
from .hashing import (
    InvalidInputError,
    chain_root,
    check_u64,
    hash_blocks,
    name_hash,
    request_id_value,
    token_list,
)
from .index import GLOBAL, KvIndex
from .load import InstanceLoad, RequestRecord, apply_finished, apply_prefilled, apply_routed, prefill_work
from .policies import Candidate, CounterRng, RouteInput, evicted_age_s

POLICIES = (
    "round_robin",
    "least_load",
    "cache_first",
    "linear",
    "lmetric",
    "lpwl",
    "llmd_prefix_load",
    "dynamo_host_tier",
    "bailian_top3",
    "vllm_router_smetric",
    "preble",
    "llmd_session_affinity",
    "consistent_hash",
    "rendezvous_hash",
    "power_of_two",
    "vllm_router_cache_aware",
    "smetric",
)
TIERS = ("local", "global")
AUTO_REQUEST_ID_BASE = 1 << 63  # §8: generated request ids are 2^63, 2^63 + 1, ...
FOLLOW_UP_ROLES = frozenset({"assistant", "tool", "function", "ipython"})  # §4.2


class NoInstancesError(ValueError):
    """route() on a router with no live instance (§7)."""


class UnknownInstanceError(ValueError):
    """An instance name that is not live (§7)."""


class DuplicateInstanceError(ValueError):
    """add_instance() with a name that is already live (§7)."""


@dataclass(frozen=True)
class Decision:
    """The result of route() (§8)."""

    instance: str
    first_turn: bool
    turn_source: str  # "hint" | "messages" | "index"
    local_hit_tokens: int  # of the chosen instance
    global_hit_tokens: int
    prefill_tokens: int  # prefill(r, X) of §3
    reason: str
    request_id: int | str  # the caller's id as given, or the issued int
    policy: str


@dataclass(frozen=True)
class IndexHits:
    """The result of query() (§8, §2.4)."""

    local: dict[str, int]  # instance name -> local hit tokens, in slot order
    global_hit_tokens: int
    deepest_blocks: int
    branches: int


@dataclass
class _Slot:
    """A live instance in its slot."""

    name: str
    generation: int
    load: InstanceLoad


@dataclass(frozen=True)
class _Hits:
    """Index matches of one chain, in blocks, before conversion to tokens."""

    local_blocks: dict[int, int]  # slot -> blocks, slot order
    global_blocks: int
    deepest: int
    branches: int


def _ms(seconds: float) -> int:
    """§ Notation: a time is stored as floor(seconds * 1000) ms."""
    return math.floor(seconds * 1000.0)


def _role(message: object) -> object:
    """The role of a chat message given as a mapping (OpenAI style) or an object with `.role`."""
    if isinstance(message, Mapping):
        return message.get("role")
    return getattr(message, "role", None)


class ReferenceRouter:
    """Plain-Python router with exactly the §8 surface."""

    def __init__(
        self,
        instances: Sequence[str],
        *,
        policy: str = "smetric",
        block_size: int = 16,  # vLLM's default, as a literal: the oracle imports nothing of smetric
        seed: int = 0,
        config: ReferenceConfig | None = None,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; expected one of {POLICIES}")
        if block_size < 1:
            raise InvalidInputError(f"block_size must be >= 1, got {block_size}")
        self._policy = policy
        self._block_size = block_size
        self._config = config if config is not None else ReferenceConfig()
        self._rng = CounterRng(check_u64(seed, "seed"))
        self._rr = 0  # round-robin counter (§6.1)
        self._next_auto_id = AUTO_REQUEST_ID_BASE
        self._clock_origin = time.monotonic()

        cfg = self._config
        self._ttl_ms = None if cfg.local_ttl_s is None else _ms(cfg.local_ttl_s)
        # §3: freshness is compared in ms, against floor(staleness_s * 1000).
        self._staleness_ms = _ms(cfg.engine_load_staleness_s)
        self._global_enabled = cfg.global_capacity_blocks > 0

        pending_ttl_ms = _ms(cfg.exact_pending_ttl_s) if cfg.index_mode == "exact" else 0  # §2.7
        self._index = KvIndex(pending_ttl_ms, cfg.local_capacity_blocks, cfg.exact_answer_credit)
        self._index.add_holder(GLOBAL, cfg.global_capacity_blocks, None)  # the global tier has no TTL
        self._slots: list[_Slot | None] = []
        self._generations: list[int] = []  # per slot, survives the slot being freed (§7)
        self._slot_of: dict[str, int] = {}
        self._requests: dict[int, RequestRecord] = {}
        self._unknown_request_events = 0
        self._output_tokens = 0
        self._routed = 0
        if not instances:
            raise NoInstancesError("a router needs at least one instance")  # §7
        for name in instances:
            self.add_instance(name)

    # -- small helpers -------------------------------------------------------------------------
    def _now_ms(self, now: float | None) -> int:
        # Without an explicit `now` the router reads its own monotonic clock; the differential
        # test always passes `now`, so this path is never compared.
        seconds = time.monotonic() - self._clock_origin if now is None else now
        return _ms(seconds)

    def _live_slots(self) -> list[int]:
        return [i for i, s in enumerate(self._slots) if s is not None]

    def _slot(self, name: str) -> _Slot:
        if name not in self._slot_of:
            raise UnknownInstanceError(f"unknown instance {name!r}")
        slot = self._slots[self._slot_of[name]]
        assert slot is not None
        return slot

    def _hit_tokens(self, blocks: int, n: int) -> int:
        """§2.4: whole blocks within the first ``n - 1`` tokens (vLLM always recomputes the last
        prompt token, and counts only the blocks that fit before it)."""
        return min(blocks, max(n - 1, 0) // self._block_size) * self._block_size

    def _prompt(
        self,
        tokens: Iterable[SupportsIndex] | None,
        hashes: Iterable[SupportsIndex] | None,
        num_tokens: int | None,
        namespace: str | None,
    ) -> tuple[list[int], int]:
        """(chain, n) of a request given as tokens or as pre-hashed blocks (§1)."""
        if (tokens is None) == (hashes is None):
            raise InvalidInputError("pass exactly one of tokens= and hashes=")
        if tokens is not None:
            if num_tokens is not None:
                raise InvalidInputError("num_tokens= only goes with hashes=")
            ids = token_list(tokens)
            return hash_blocks(ids, self._block_size, chain_root(self._config.hash_seed, namespace)), len(ids)
        assert hashes is not None
        chain = [check_u64(int(h), "block hash") for h in hashes]  # used as is; namespace ignored
        if num_tokens is None:
            return chain, len(chain) * self._block_size
        if num_tokens < 0:
            raise InvalidInputError("num_tokens must be >= 0")
        return chain, num_tokens

    # -- §2.4 query ----------------------------------------------------------------------------
    def _match(self, chain: list[int], now_ms: int) -> _Hits:
        live = self._live_slots()
        for slot in live:  # 1. TTL purge of every instance, slot order (the global tier has no TTL)
            self._index.purge(slot, now_ms)
        # 2., with §2.7: a block sent to an instance and not yet confirmed counts there.
        local = {slot: self._index.matched_with_sent(slot, chain, now_ms) for slot in live}
        global_blocks = self._index.matched_blocks(GLOBAL, chain)
        deepest = max([*local.values(), global_blocks])  # 3.
        branches = 0
        if deepest > 0:
            last = chain[deepest - 1]
            sent_child = any(self._index.sent_has_child(slot, last, now_ms) for slot in live)
            branches = max(self._index.children(last), int(sent_child))
        return _Hits(local, global_blocks, deepest, branches)

    def query(
        self,
        tokens: Iterable[SupportsIndex] | None = None,
        *,
        hashes: Iterable[SupportsIndex] | None = None,
        num_tokens: int | None = None,
        namespace: str | None = None,
        now: float | None = None,
    ) -> IndexHits:
        chain, n = self._prompt(tokens, hashes, num_tokens, namespace)
        hits = self._match(chain, self._now_ms(now))
        local = {self._name(slot): self._hit_tokens(k, n) for slot, k in hits.local_blocks.items()}
        return IndexHits(local, self._hit_tokens(hits.global_blocks, n), hits.deepest, hits.branches)

    def _name(self, slot: int) -> str:
        s = self._slots[slot]
        assert s is not None
        return s.name

    # -- §4 turn inference ---------------------------------------------------------------------
    def _infer_turn(self, turn: int | None, messages: Sequence[object] | None, hits: _Hits) -> tuple[bool, str]:
        if turn is not None:
            return turn == 1, "hint"
        if messages is not None:
            # Everything but the last message: an agent's follow-up may end in a `tool` message.
            earlier = list(messages)[:-1]
            return not any(_role(m) in FOLLOW_UP_ROLES for m in earlier), "messages"
        first = hits.deepest == 0 or hits.branches >= self._config.first_turn_min_branches
        return first, "index"

    # -- route ---------------------------------------------------------------------------------
    def route(
        self,
        tokens: Iterable[SupportsIndex] | None = None,
        *,
        hashes: Iterable[SupportsIndex] | None = None,
        num_tokens: int | None = None,
        messages: Sequence[object] | None = None,
        turn: int | None = None,
        request_id: int | str | None = None,
        namespace: str | None = None,
        now: float | None = None,
        previous_instance: str | None = None,
        session_key: int | str | None = None,
    ) -> Decision:
        chain, n = self._prompt(tokens, hashes, num_tokens, namespace)
        now_ms = self._now_ms(now)
        if turn is not None and turn < 1:
            raise InvalidInputError(f"turn must be >= 1, got {turn}")
        key = None if request_id is None else request_id_value(request_id)  # validated before any change
        # §8: mapped as a request id; without one the hash policies hash the prompt (§6 item 15)
        hash_key = policies.prompt_key(chain, n) if session_key is None else request_id_value(session_key)
        live = self._live_slots()
        if not live:
            # Refused before anything happens: no purge, no id issued, no draw.
            raise NoInstancesError("the router has no instances")

        hits = self._match(chain, now_ms)
        first_turn, turn_source = self._infer_turn(turn, messages, hits)
        global_hit = self._hit_tokens(hits.global_blocks, n) if self._global_enabled else 0

        cands: list[Candidate] = []
        cfg = self._config
        preble = self._policy == "preble"
        window_ms = _ms(cfg.preble_window_s)
        previous = None
        for slot in live:
            s = self._slots[slot]
            assert s is not None
            if s.name == previous_instance:  # §8: a name that is not live counts as none
                previous = len(cands)
            bs_eff, waiting_eff = s.load.effective(now_ms, self._staleness_ms)
            recent_requests, recent_cost_us = s.load.recent.read(now_ms, window_ms) if preble else (0, 0)
            local_hit = self._hit_tokens(hits.local_blocks[slot], n)
            rate = cfg.smetric_drain_rate
            if rate is None:
                rate = s.load.drain.learned if s.load.drain.learned is not None else cfg.smetric_drain_rate_fallback
            peer_rate = cfg.smetric_drain_rate if cfg.smetric_drain_rate is not None else s.load.drain.peer_p90
            cands.append(
                Candidate(
                    local_hit,
                    bs_eff,
                    waiting_eff,
                    s.load.queued + s.load.peer("queued"),
                    s.load.active + s.load.peer("active"),
                    s.load.queued_work + s.load.peer("queued_work"),
                    rate,
                    peer_rate,
                    recent_requests,
                    recent_cost_us,
                    name_hash(s.name),
                    evicted_age_s(self._index.holders[slot].evicted_touch_ms, now_ms),
                )
            )
        req = RouteInput(
            n=n,
            global_hit=global_hit,
            block_size=self._block_size,
            first_turn=first_turn,
            previous=previous,
            hash_key=hash_key,
        )
        pos, reason = self._choose(cands, req)

        chosen_slot = live[pos]
        chosen = self._slots[chosen_slot]
        assert chosen is not None
        local_hit = cands[pos].local_hit
        prefill = n - max(local_hit, global_hit)  # §3
        if key is None:  # §8: issued ids count up from 2^63, for routed requests only
            key = self._next_auto_id
            self._next_auto_id += 1
        work = prefill_work(prefill, n, cfg.smetric_l_eq_tokens)
        # §3: an id still in flight is simply overwritten (its old record is lost).
        self._requests[key] = RequestRecord(
            chosen_slot,
            chosen.generation,
            prefill,
            n,
            work=work,
            work_ahead=cands[pos].queued_work,
            routed_ms=now_ms,
            anchor=chain[-1] if chain else None,
            prompt_blocks=len(chain),
        )
        apply_routed(chosen.load, prefill, n, work)
        if preble:  # §6 item 13: AIBrix adds the prompt to its histogram at routing, for good
            chosen.load.recent.record(now_ms, policies.preble_routed_cost_us(n, cands))
        self._routed += 1

        if self._config.index_mode == "approximate":  # §2.6: insert-on-route
            self._index.touch(chosen_slot, chain, now_ms)
            if self._global_enabled:
                self._index.touch(GLOBAL, chain, now_ms)
        else:  # §2.7: sent, not yet confirmed by the engine's events
            self._index.send(chosen_slot, chain, now_ms)

        return Decision(
            instance=chosen.name,
            first_turn=first_turn,
            turn_source=turn_source,
            local_hit_tokens=local_hit,
            global_hit_tokens=global_hit,
            prefill_tokens=prefill,
            reason=reason,
            request_id=key if request_id is None else request_id,  # §8: the caller's id as given
            policy=self._policy,
        )

    def _choose(self, cands: list[Candidate], req: RouteInput) -> tuple[int, str]:
        cfg, rng = self._config, self._rng
        match self._policy:
            case "round_robin":
                pos, reason = policies.round_robin(cands, self._rr)
                self._rr += 1
                return pos, reason
            case "least_load":
                return policies.least_load(cands, rng)
            case "cache_first" if cfg.cache_first_mode == "argmax":
                return policies.cache_first_argmax(cands, req, cfg.cache_first_weights, rng)
            case "cache_first" if cfg.cache_first_mode == "max_hit":
                return policies.cache_first_max_hit(cands, rng)
            case "cache_first":
                return policies.cache_first_weighted(cands, req, cfg.cache_first_weights, rng)
            case "linear":
                return policies.linear(cands, req, cfg.linear_prefill_weight, rng)
            case "lmetric":
                return policies.lmetric(cands, req, rng)
            case "lpwl":
                return policies.lpwl(cands, req, rng)
            case "llmd_prefix_load":
                return policies.llmd_prefix_load(cands, req, cfg.local_capacity_blocks, rng)
            case "dynamo_host_tier":
                return policies.dynamo_host_tier(cands, req, cfg.linear_prefill_weight, rng)
            case "bailian_top3":
                return policies.bailian_top3(cands, req, rng)
            case "vllm_router_smetric":
                return policies.vllm_router_smetric(cands, req, cfg, rng)
            case "preble":
                return policies.preble(cands, req, cfg, rng)
            case "llmd_session_affinity":
                return policies.llmd_session_affinity(cands, req, rng)
            case "consistent_hash":
                return policies.consistent_hash(cands, req, rng)
            case "rendezvous_hash":
                return policies.rendezvous_hash(cands, req, rng)
            case "power_of_two":
                return policies.power_of_two(cands, rng)
            case "vllm_router_cache_aware":
                return policies.vllm_router_cache_aware(cands, req, cfg, rng)
            case _ if cfg.smetric_rule == "v2":
                return policies.smetric_paper(cands, req, cfg, rng)
            case _:
                return policies.smetric(cands, req, cfg, rng)

    # -- §3 lifecycle --------------------------------------------------------------------------
    def _board_of(self, record: RequestRecord) -> InstanceLoad | None:
        """The load a request still counts on: its slot must be live and on the same generation."""
        s = self._slots[record.slot] if record.slot < len(self._slots) else None
        if s is None or s.generation != record.generation:
            return None
        return s.load

    def on_prefilled(self, request_id: int | str, now: float | None = None) -> bool:
        now_ms = self._now_ms(now)
        record = self._requests.get(request_id_value(request_id))
        if record is None:
            self._unknown_request_events += 1
            return False
        load = self._board_of(record)
        if load is None or record.prefilled:
            return False
        apply_prefilled(load, record)
        cfg = self._config
        load.drain.record(
            record.work_ahead + record.work,
            max(now_ms - record.routed_ms, 0),
            cfg.smetric_drain_window,
            cfg.smetric_drain_min_samples,
        )
        if self._policy == "vllm_router_smetric":  # the PR-literal form learns over linear work
            own = record.prefill if cfg.vllm_router_smetric_form == "pr_literal" else record.work
            load.drain.record_own_work(own, max(now_ms - record.routed_ms, 0))
        return True

    def _finish(self, request_id: int | str) -> RequestRecord | None:
        """Forget the request and release its load; the record when its instance still counts it."""
        record = self._requests.pop(request_id_value(request_id), None)
        if record is None:
            self._unknown_request_events += 1
            return None
        load = self._board_of(record)
        if load is None:  # slot removed or reused: just forget the request
            return None
        apply_finished(load, record)
        return record

    def on_finished(self, request_id: int | str, output_tokens: int = 0, now: float | None = None) -> bool:
        now_ms = self._now_ms(now)
        record = self._finish(request_id)
        if record is None:
            return False
        self._output_tokens += output_tokens
        # §2.7 "The answer": vLLM caches the full blocks of the first n + output - 1 tokens.
        if self._config.index_mode == "exact" and record.anchor is not None and output_tokens > 0:
            blocks = (record.n + output_tokens - 1) // self._block_size - record.prompt_blocks
            if blocks > 0:
                self._index.credit(record.slot, record.anchor, blocks, now_ms)
        return True

    def on_aborted(self, request_id: int | str) -> bool:
        return self._finish(request_id) is not None

    # -- §7 instances --------------------------------------------------------------------------
    def add_instance(self, name: str) -> None:
        if name in self._slot_of:
            raise DuplicateInstanceError(f"instance {name!r} already exists")
        free = [i for i, s in enumerate(self._slots) if s is None]
        if free:
            slot = free[0]
        else:
            slot = len(self._slots)
            self._slots.append(None)
            self._generations.append(0)
        self._generations[slot] += 1
        self._slots[slot] = _Slot(name, self._generations[slot], InstanceLoad())
        self._slot_of[name] = slot
        self._index.add_holder(slot, self._config.local_capacity_blocks, self._ttl_ms)

    def remove_instance(self, name: str) -> None:
        self._slot(name)  # raises for unknown names
        slot = self._slot_of.pop(name)
        self._index.drop_holder(slot)  # §2.3 for each of its blocks
        self._slots[slot] = None  # its load goes with it

    # -- §3 engine snapshot --------------------------------------------------------------------
    def update_load(
        self,
        instance: str,
        *,
        running: int | None = None,
        waiting: int | None = None,
        kv_usage: float | None = None,
        now: float | None = None,
    ) -> None:
        load = self._slot(instance).load
        now_ms = self._now_ms(now)
        if running is not None:
            load.running_e = running
        if waiting is not None:
            load.waiting_e = waiting
        if kv_usage is not None:
            load.kv_usage = kv_usage
        load.stamp_ms = now_ms

    def set_peer_load(
        self,
        instance: str,
        *,
        batch_size: int = 0,
        waiting: int = 0,
        queued: int = 0,
        queued_work: int = 0,
        active: int = 0,
    ) -> None:
        """§3: peer router replicas' in-flight work here, added to the router's own at read time."""
        self._slot(instance).load.peers = {
            "batch_size": batch_size,
            "waiting": waiting,
            "queued": queued,
            "queued_work": queued_work,
            "active": active,
        }

    def peer_load(self, instance: str) -> dict[str, int]:
        load = self._slot(instance).load
        return {k: load.peer(k) for k in ("batch_size", "waiting", "queued", "queued_work", "active")}

    # -- §2.6 explicit index maintenance -------------------------------------------------------
    def _holder(self, instance: str | None, tier: str) -> int | None:
        """Holder key for (instance, tier); None when the tier is the disabled global tier."""
        if tier not in TIERS:
            raise InvalidInputError(f"tier must be one of {TIERS}, got {tier!r}")
        if tier == "global":
            if instance is not None:
                raise InvalidInputError('tier="global" takes instance=None')
            return GLOBAL if self._global_enabled else None
        if instance is None:
            raise InvalidInputError('tier="local" needs an instance')
        self._slot(instance)
        return self._slot_of[instance]

    def store_blocks(
        self,
        instance: str | None,
        hashes: Iterable[SupportsIndex],
        tier: str = "local",
        *,
        parent: int | None = None,
        now: float | None = None,
    ) -> None:
        run = [check_u64(int(h), "block hash") for h in hashes]
        if parent is not None:
            check_u64(parent, "parent")
        key = self._holder(instance, tier)
        now_ms = self._now_ms(now)
        if key is not None:  # a disabled global tier never holds a block
            self._index.touch(key, run, now_ms, parent)

    def remove_blocks(self, instance: str | None, hashes: Iterable[SupportsIndex], tier: str = "local") -> None:
        blocks = [check_u64(int(h), "block hash") for h in hashes]
        key = self._holder(instance, tier)
        if key is not None:
            if key != GLOBAL:
                self._index.end_pending(key, blocks)  # §2.7: evicted by the engine
                self._index.end_credits(key, blocks)  # §2.7: an answer past an evicted anchor
            for block in blocks:
                self._index.give_up(key, block)

    def clear(self, instance: str | None = None, tier: str = "local") -> None:
        key = self._holder(instance, tier)
        if key is not None:
            self._index.clear(key)

    # -- read-only surface ---------------------------------------------------------------------
    def load(self, instance: str) -> dict[str, int | float | None]:
        return self._slot(instance).load.as_dict()

    def hash_tokens(self, tokens: Iterable[SupportsIndex], namespace: str | None = None) -> list[int]:
        return hash_blocks(token_list(tokens), self._block_size, chain_root(self._config.hash_seed, namespace))

    def stats(self) -> dict[str, int]:
        return {
            "routed": self._routed,
            "in_flight": len(self._requests),
            "unknown_request_events": self._unknown_request_events,
            "output_tokens": self._output_tokens,
            "random_draws": self._rng.draws,
            "instances": len(self._slot_of),
        }

    @property
    def instances(self) -> list[str]:
        """Live instance names in slot order."""
        return [s.name for s in self._slots if s is not None]

    @property
    def policy(self) -> str:
        return self._policy

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def config(self) -> ReferenceConfig:
        return self._config
