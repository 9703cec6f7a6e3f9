"""Seeded differential test: the Rust core (`smetric.Router`) against the plain-Python reference.

Both routers are built from the same arguments and driven by the same random operation stream;
after every operation the test compares the return values (every §8 `Decision` / `IndexHits`
field, lifecycle booleans, `hash_tokens` output), `instances`, `load(name)` of every instance and
a few `stats()` counters. docs/routing-semantics.md decides who is right when they differ.

Knobs (environment):
  SMETRIC_DIFF_SEED   base seed (default 20250611); every case derives its own stream from it.
  SMETRIC_DIFF_CASES  number of operation streams (default 64, at 400 operations each).
  SMETRIC_DIFF_OPS    operations per stream (default 400).
On a mismatch the failure message names the seed, case and operation index and lists the
operations so far; a standalone replay script (and a cheaply shrunk one) is written under /tmp.

The stream is generated *while* it runs: the generator reads the reference's results (chosen
instance, live names, request ids) to pick plausible next operations, and records every call
with concrete arguments, so the op list replays without the generator.
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

# Collected but skipped until the extension is built (`maturin develop`). Everything from the
# package is fetched through importorskip so that no import statement follows a call.
_core = pytest.importorskip("smetric._core")
smetric = pytest.importorskip("smetric")
_reference = pytest.importorskip("smetric.reference")
_hashing = pytest.importorskip("smetric.reference.hashing")
ReferenceConfig = _reference.ReferenceConfig
ReferenceRouter = _reference.ReferenceRouter
ref_hash_tokens = _reference.ref_hash_tokens
request_id_value = _hashing.request_id_value

if TYPE_CHECKING:
    from smetric.reference import ReferenceRouter as ReferenceRouterT

SEED = int(os.environ.get("SMETRIC_DIFF_SEED", "20250611"))
CASES = int(os.environ.get("SMETRIC_DIFF_CASES", "64"))
OPS_PER_CASE = int(os.environ.get("SMETRIC_DIFF_OPS", "400"))
HASH_CASES = 2000  # extra pure hash_tokens comparisons (cheap)
SHRINK_BUDGET_S = 20.0

U64 = 1 << 64
AUTO_ID_BASE = 1 << 63
NAMES = tuple(f"i{k}" for k in range(8))
BIG_NAMES = tuple(f"i{k}" for k in range(72))  # every 16th case: slots past 64 (a second bitset word)
DECISION_FIELDS = (
    "instance",
    "first_turn",
    "turn_source",
    "local_hit_tokens",
    "global_hit_tokens",
    "prefill_tokens",
    "reason",
    "request_id",
    "policy",
)
LOAD_FIELDS = ("batch_size", "waiting", "queued", "active", "engine_running", "engine_waiting", "kv_usage")
# Compared when both report them.
STATS_FIELDS = ("routed", "unknown_request_events", "in_flight", "output_tokens", "random_draws")

# (policy, cache_first_mode) x index mode: every policy in both index modes
# (`test_every_policy_has_streams` keeps this list in step with `smetric.POLICIES`).
COMBOS: tuple[tuple[str, str, str], ...] = tuple(
    (policy, cf_mode, mode)
    for mode in ("approximate", "exact")
    for policy, cf_mode in (
        ("round_robin", "weighted"),
        ("least_load", "weighted"),
        ("cache_first", "weighted"),
        ("cache_first", "argmax"),
        ("cache_first", "max_hit"),
        ("linear", "weighted"),
        ("lmetric", "weighted"),
        ("lpwl", "weighted"),
        ("llmd_prefix_load", "weighted"),
        ("dynamo_host_tier", "weighted"),
        ("bailian_top3", "weighted"),
        ("vllm_router_smetric", "weighted"),
        ("preble", "weighted"),
        ("llmd_session_affinity", "weighted"),
        ("consistent_hash", "weighted"),
        ("rendezvous_hash", "weighted"),
        ("power_of_two", "weighted"),
        ("vllm_router_cache_aware", "weighted"),
        ("smetric", "weighted"),
        ("smetric", "weighted"),  # the policy this project is about gets twice the streams
    )
)


# --------------------------------------------------------------------------------------------
# Operations and their replay
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Op:
    """One recorded call: `getattr(router, name)(*args, **kwargs)`."""

    name: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CaseSpec:
    """Everything needed to build the two routers of one case."""

    instances: tuple[str, ...]
    names: tuple[str, ...]  # the pool add_instance draws from (names are reused)
    policy: str
    block_size: int
    seed: int
    config: dict[str, Any]
    hot: bool = False  # a few sessions re-sent over and over: many stale LRU copies, few evictions

    def build(self, router_cls: Callable[..., Any], config_cls: Callable[..., Any]) -> Any:
        return router_cls(
            list(self.instances),
            policy=self.policy,
            block_size=self.block_size,
            seed=self.seed,
            config=config_cls(**self.config),
        )


def build_pair(spec: CaseSpec) -> tuple[Any, ReferenceRouterT]:
    return spec.build(smetric.Router, smetric.RouterConfig), spec.build(ReferenceRouter, ReferenceConfig)


def canon(value: Any) -> Any:
    """A comparable, type-strict form of a return value (`True` != `1`, numpy ints are not ints)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if type(value) is int:
        return ("int", value)
    if type(value) is float:
        return ("float", value)
    if isinstance(value, list):
        return [canon(v) for v in value]
    if isinstance(value, tuple):
        return tuple(canon(v) for v in value)
    if isinstance(value, dict):
        return [(k, canon(v)) for k, v in value.items()]  # order matters (slot order)
    if hasattr(value, "deepest_blocks"):  # IndexHits
        return {
            "local": canon(dict(value.local)) if not isinstance(value.local, dict) else canon(value.local),
            "global_hit_tokens": canon(value.global_hit_tokens),
            "deepest_blocks": canon(value.deepest_blocks),
            "branches": canon(value.branches),
        }
    if hasattr(value, "prefill_tokens"):  # Decision
        return {f: canon(getattr(value, f)) for f in DECISION_FIELDS}
    return ("?", type(value).__name__, repr(value))


def call(router: Any, op: Op) -> Any:
    """Run one op; an exception becomes a marker (both sides must raise, any class will do)."""
    try:
        return canon(getattr(router, op.name)(*op.args, **op.kwargs))
    except Exception as exc:
        return ("raised", type(exc).__name__, str(exc))


def raised(outcome: Any) -> bool:
    return isinstance(outcome, tuple) and len(outcome) == 3 and outcome[0] == "raised"


def state(router: Any) -> dict[str, Any]:
    """What is compared after every op besides its return value."""
    names = list(router.instances)
    loads = {}
    for name in names:
        load = router.load(name)
        loads[name] = {k: canon(load[k]) for k in LOAD_FIELDS}
    stats = router.stats()
    return {"instances": names, "loads": loads, "stats": {k: stats[k] for k in STATS_FIELDS if k in stats}}


def compare_state(rust: Any, ref: ReferenceRouterT) -> str | None:
    s_rust, s_ref = state(rust), state(ref)
    common = s_rust["stats"].keys() & s_ref["stats"].keys()
    s_rust["stats"] = {k: s_rust["stats"][k] for k in sorted(common)}
    s_ref["stats"] = {k: s_ref["stats"][k] for k in sorted(common)}
    if s_rust == s_ref:
        return None
    lines = [
        f"  {key}:\n    rust: {s_rust[key]!r}\n    ref:  {s_ref[key]!r}"
        for key in ("instances", "loads", "stats")
        if s_rust[key] != s_ref[key]
    ]
    return "state after the op differs:\n" + "\n".join(lines)


def step(rust: Any, ref: ReferenceRouterT, op: Op) -> tuple[str | None, Any]:
    """Apply `op` to both routers; returns (mismatch description or None, reference outcome)."""
    got, want = call(rust, op), call(ref, op)
    if raised(got) != raised(want) or (not raised(got) and got != want):
        return f"return value differs:\n  rust: {got!r}\n  ref:  {want!r}", want
    return compare_state(rust, ref), want


def first_mismatch(spec: CaseSpec, ops: Sequence[Op]) -> tuple[int, str] | None:
    """Replay `ops` on fresh routers; the index and description of the first mismatch."""
    rust, ref = build_pair(spec)
    for i, op in enumerate(ops):
        problem, _ = step(rust, ref, op)
        if problem is not None:
            return i, problem
    return None


def shrink(spec: CaseSpec, ops: list[Op], budget_s: float = SHRINK_BUDGET_S) -> list[Op]:
    """Cheap delta debugging: drop chunks of ops while the last op still mismatches."""
    deadline = time.monotonic() + budget_s
    target = ops[-1].name
    chunk = max(len(ops) // 2, 1)
    while chunk >= 1 and time.monotonic() < deadline:
        i = 0
        while i < len(ops) - 1 and time.monotonic() < deadline:
            candidate = ops[:i] + ops[min(i + chunk, len(ops) - 1) :]
            found = first_mismatch(spec, candidate)
            if found is not None and candidate[found[0]].name == target:
                ops = candidate[: found[0] + 1]
            else:
                i += chunk
        chunk //= 2
    return ops


# --------------------------------------------------------------------------------------------
# Repro scripts
# --------------------------------------------------------------------------------------------
def src(value: Any) -> str:
    """Python source for an op argument (numpy arrays included)."""
    if isinstance(value, np.ndarray):
        return f"np.array({value.tolist()!r}, dtype=np.{value.dtype.name})"
    if isinstance(value, list):
        return "[" + ", ".join(src(v) for v in value) + "]"
    if isinstance(value, tuple):
        return "(" + "".join(src(v) + ", " for v in value) + ")"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {src(v)}" for k, v in value.items()) + "}"
    return repr(value)


def render(op: Op) -> str:
    parts = [src(a) for a in op.args] + [f"{k}={src(v)}" for k, v in op.kwargs.items()]
    return f"{op.name}({', '.join(parts)})"


def repro_script(spec: CaseSpec, ops: Sequence[Op]) -> str:
    op_lines = "\n".join(f"    ({op.name!r}, {src(op.args)}, {src(op.kwargs)}),  # {i}" for i, op in enumerate(ops))
    return f'''"""Replays a smetric differential-test case on the Rust core and the Python reference."""
import numpy as np
import smetric
from smetric.reference import ReferenceConfig, ReferenceRouter

KW = {spec.config!r}


def build(router_cls, config_cls):
    return router_cls({list(spec.instances)!r}, policy={spec.policy!r}, block_size={spec.block_size!r},
                      seed={spec.seed!r}, config=config_cls(**KW))


rust, ref = build(smetric.Router, smetric.RouterConfig), build(ReferenceRouter, ReferenceConfig)
OPS = [
{op_lines}
]
FIELDS = {DECISION_FIELDS!r}


def norm(x):
    """What the test compares: Decision / IndexHits fields; any exception is just "raised"."""
    if isinstance(x, BaseException):
        return "raised"
    if hasattr(x, "prefill_tokens"):
        return {{f: getattr(x, f) for f in FIELDS}}
    if hasattr(x, "deepest_blocks"):
        return (list(x.local.items()), x.global_hit_tokens, x.deepest_blocks, x.branches)
    return x


for i, (name, args, kwargs) in enumerate(OPS):
    outs = []
    for r in (rust, ref):
        try:
            outs.append(getattr(r, name)(*args, **kwargs))
        except Exception as exc:
            outs.append(exc)
    loads = [[(n, r.load(n)) for n in r.instances] for r in (rust, ref)]
    flag = "" if norm(outs[0]) == norm(outs[1]) and loads[0] == loads[1] else "   <-- differs"
    print(i, name, "rust:", repr(outs[0]), "| ref:", repr(outs[1]), flag)
    if flag:
        print("  rust loads:", loads[0])
        print("  ref loads: ", loads[1])
'''


def write_repro(spec: CaseSpec, ops: Sequence[Op], tag: str) -> str:
    directory = Path(tempfile.gettempdir()) / "smetric-diff"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"repro_seed{SEED}_{tag}.py"
    path.write_text(repro_script(spec, ops))
    return str(path)


# --------------------------------------------------------------------------------------------
# The random operation stream
# --------------------------------------------------------------------------------------------
@dataclass
class Session:
    """One conversation: each request re-sends the whole history (agent-style)."""

    tokens: list[int]  # prompt of the latest request (token sessions)
    chain: list[int]  # synthetic hash chain (hash sessions)
    synthetic: bool
    namespace: str | None
    turns: int = 0
    roles: list[str] = field(default_factory=lambda: ["system", "user"])
    last_instance: str | None = None  # where its previous turn went (llm-d's session cookie)
    key: int | str = 0  # its session key (vllm-router's x-session-id), drawn when it opens


@dataclass
class InFlight:
    rid: int  # Decision.request_id
    given: int | str | None  # what the caller passed, to sometimes use it again
    instance: str = ""  # where it was routed
    chain: list[int] = field(default_factory=list)  # the chain it was routed with
    session: Session | None = None  # the session whose turn it was
    num_tokens: int = 0  # its prompt length


class StreamGen:
    """Generates plausible, valid operations from the reference's view of the world."""

    def __init__(self, rnd: random.Random, spec: CaseSpec) -> None:
        self.rnd = rnd
        self.spec = spec
        self.block = spec.block_size
        self.exact = spec.config["index_mode"] == "exact"
        self.global_on = spec.config["global_capacity_blocks"] > 0
        self.ttl = spec.config.get("local_ttl_s")
        self.staleness = spec.config["engine_load_staleness_s"]
        self.now = rnd.choice([0.0, 0.0, rnd.uniform(0, 100), float(rnd.randrange(1000))])
        b = self.block

        def system_len() -> int:
            if spec.hot:  # long shared prompts: many blocks per re-send
                return rnd.randrange(40, 120)
            return rnd.randrange(0, 6 * b + 1) + rnd.randrange(b)

        self.systems = [self._tokens(system_len()) for _ in range(rnd.randint(1, 4))]
        self.synthetic_prefixes = [[rnd.randrange(U64) for _ in range(rnd.randint(0, 5))] for _ in range(2)]
        self.sessions: list[Session] = []
        self.inflight: dict[int, InFlight] = {}
        self.done: list[InFlight] = []
        self.chains: list[list[int]] = []  # recently routed chains, for store/remove/query
        self.pending: list[Op] = []  # ops queued by the previous op (e.g. KV events after a route)
        # Exact mode: KV events held back past later decisions, as vLLM publishes them late
        # (docs/routing-semantics.md §2.7); each is issued with the clock of its delivery.
        self.late_events: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self.str_ids = 0
        self.last_session: Session | None = None  # the session of the last route
        self.next_session: Session | None = None  # a session whose next turn comes next

    # -- building blocks -----------------------------------------------------------------------
    def _tokens(self, count: int) -> list[int]:
        rnd = self.rnd
        big = rnd.random() < 0.1  # now and then ids up to 2^32 - 1
        top = (1 << 32) if big else 50_000
        return [rnd.randrange(top) for _ in range(count)]

    def _advance(self) -> float:
        rnd = self.rnd
        r = rnd.random()
        if r < 0.3:
            dt = 0.0
        elif r < 0.8:
            dt = rnd.uniform(0, 0.05)
        elif r < 0.9:
            dt = rnd.choice([0.0004, 0.001, 0.0015, 0.999, 1.0])  # sub-ms and boundary steps
        elif r < 0.97:
            dt = rnd.uniform(0.05, 0.5)
        else:  # jump past the TTL and the staleness bound
            dt = (self.ttl or 1.0) + self.staleness + rnd.choice([0.0, 0.001, rnd.uniform(0, 3)])
        self.now += dt
        return self.now

    def _array(self, tokens: list[int]) -> Any:
        rnd = self.rnd
        kinds = ["list", "list", "uint32", "int64"]
        if all(t < (1 << 31) for t in tokens):
            kinds.append("int32")
        kind = rnd.choice(kinds)
        if kind == "list":
            return list(tokens)
        dtype = {"int32": np.int32, "uint32": np.uint32, "int64": np.int64}[kind]
        if rnd.random() < 0.05:  # a list of numpy scalars, as `list(array)` gives
            return list(np.array(tokens, dtype=dtype))
        if rnd.random() < 0.15:  # a non-contiguous view (every other element of a doubled array)
            return np.repeat(np.array(tokens, dtype=dtype), 2)[::2]
        return np.array(tokens, dtype=dtype)

    def _hashes(self, chain: list[int]) -> Any:
        """A pre-hashed chain as a list or, now and then, a numpy uint64 array."""
        return np.array(chain, dtype=np.uint64) if self.rnd.random() < 0.1 else list(chain)

    def _live(self, ref: ReferenceRouterT) -> list[str]:
        return list(ref.instances)

    def _request_id(self) -> int | str | None:
        """None (router-issued), a fresh or re-used string, or an int; never one still in flight."""
        rnd = self.rnd
        r = rnd.random()
        given: int | str | None
        if r < 0.45:
            return None
        if r < 0.7:
            self.str_ids += 1
            given = f"req-{self.str_ids}"
        elif r < 0.8 and self.done:
            given = rnd.choice(self.done).given  # re-use a finished request's id
        elif r < 0.93:
            given = rnd.randrange(5000)
        else:
            given = rnd.randrange(1 << 32, AUTO_ID_BASE)
        if given is None or request_id_value(given) in self.inflight:
            return None  # re-routing an id in flight is not exercised (see the spec, §8)
        return given

    # -- routes --------------------------------------------------------------------------------
    def _new_session(self) -> Session:
        rnd = self.rnd
        namespace = rnd.choice([None] * 8 + ["lora-a", "tenant/β", ""])
        if rnd.random() < 0.2:
            prefix = list(rnd.choice(self.synthetic_prefixes))
            chain = prefix + [rnd.randrange(U64) for _ in range(rnd.randint(0, 3))]
            return Session([], chain, True, None, key=self._session_key())
        system = rnd.choice(self.systems)
        user = self._tokens(rnd.randint(1, 3 * self.block))
        return Session(system + user, [], False, namespace, key=self._session_key())

    def _session_key(self) -> int | str:
        rnd = self.rnd
        return rnd.randrange(U64) if rnd.random() < 0.5 else f"session-{rnd.randrange(1 << 20)}"

    def _pick_session(self) -> Session:
        rnd = self.rnd
        if self.next_session is not None and self.next_session in self.sessions:
            s, self.next_session = self.next_session, None
            return self._next_turn(s)
        if not self.sessions or rnd.random() < (0.02 if self.spec.hot else 0.3):
            s = self._new_session()
            self.sessions.append(s)
            if len(self.sessions) > 12:
                self.sessions.pop(0)
            return s
        s = rnd.choice(self.sessions)
        if self.spec.hot and rnd.random() < 0.9:
            return s  # re-sent unchanged (a retry storm): its blocks are touched again
        if rnd.random() < 0.1:  # fork (a retry or a sub-agent): shares the whole history
            key = s.key if rnd.random() < 0.5 else self._session_key()  # a sub-agent: its own session or not
            s = Session(list(s.tokens), list(s.chain), s.synthetic, s.namespace, s.turns, list(s.roles), key=key)
            self.sessions.append(s)
        return self._next_turn(s)

    def _next_turn(self, s: Session) -> Session:
        rnd = self.rnd
        # The next turn: the model's output then a new user (or tool) message.
        if s.turns > 0:
            if s.synthetic:
                s.chain += [rnd.randrange(U64) for _ in range(rnd.randint(1, 3))]
            else:
                s.tokens += self._tokens(rnd.randint(0, 2 * self.block))
                s.tokens += self._tokens(rnd.randint(1, 2 * self.block))
            s.roles += ["assistant", rnd.choice(["user", "user", "tool"])]
        return s

    def _route(self) -> Op:
        rnd = self.rnd
        s = self._pick_session()
        self.last_session = s
        s.turns += 1
        kw: dict[str, Any] = {}
        if s.synthetic:
            chain = list(s.chain)
            kw["hashes"] = self._hashes(chain)
            r = rnd.random()
            if r < 0.4:
                kw["num_tokens"] = len(chain) * self.block + rnd.randrange(self.block)
            elif r < 0.6 and chain:
                kw["num_tokens"] = len(chain) * self.block - rnd.randrange(self.block)  # trace-style ceil
        elif rnd.random() < 0.2:
            chain = ref_hash_tokens(s.tokens, self.block, self.spec.config["hash_seed"], s.namespace)
            kw["hashes"] = self._hashes(chain)
            if rnd.random() < 0.6:
                kw["num_tokens"] = len(s.tokens)
        else:
            tokens = [] if rnd.random() < 0.01 else s.tokens
            chain = ref_hash_tokens(tokens, self.block, self.spec.config["hash_seed"], s.namespace)
            kw["tokens"] = self._array(tokens)
            if s.namespace is not None:
                kw["namespace"] = s.namespace
        r = rnd.random()
        if r < 0.15:
            kw["turn"] = s.turns
        elif r < 0.3:
            msgs = [{"role": role, "content": "..."} for role in s.roles]
            if rnd.random() < 0.1:
                msgs = rnd.choice([[], [{"role": "user"}], [{"role": "ipython"}, {"role": "user"}]])
            kw["messages"] = msgs
        rid = self._request_id()
        if rid is not None:
            kw["request_id"] = rid
        r = rnd.random()
        if r < 0.6 and s.last_instance is not None:  # the client echoes its session's cookie
            kw["previous_instance"] = s.last_instance
        elif r < 0.7:  # any name of the pool, live or not, or one the router never had
            kw["previous_instance"] = rnd.choice([*self.spec.names, "nope"])
        r = rnd.random()
        if r < 0.6:  # the client's session header; else the prompt is the hash policies' key
            kw["session_key"] = s.key
        elif r < 0.65:
            kw["session_key"] = rnd.choice([0, U64 - 1, "", "sess-β"])
        kw["now"] = self._advance()
        self.chains.append(chain)
        if len(self.chains) > 16:
            self.chains.pop(0)
        return Op("route", (), kw)

    def after_route(self, op: Op, decision: Any) -> None:
        """Record the request and, in exact mode, queue the KV events an engine would send."""
        if not isinstance(decision, dict):
            return  # refused (no instances)
        echoed = decision["request_id"]  # canon(): a str, or ("int", value)
        rid = request_id_value(echoed if isinstance(echoed, str) else echoed[1])
        if self.last_session is not None:
            self.last_session.last_instance = decision["instance"]
        chain = self.chains[-1]
        kw = op.kwargs
        n = len(kw["tokens"]) if "tokens" in kw else kw.get("num_tokens", len(chain) * self.block)
        self.inflight[rid] = InFlight(rid, kw.get("request_id"), decision["instance"], chain, self.last_session, n)
        rnd = self.rnd
        if not chain:
            return
        if self.exact and rnd.random() < 0.3:
            # A back-to-back turn (§2.7 "The answer"): this request finishes at once, its answer
            # events may lag, and its session's next turn comes next.
            req = self.inflight.pop(rid)
            self.done.append(req)
            out = rnd.randrange(500) if rnd.random() < 0.3 else rnd.randrange(3 * self.block)
            given = req.given if req.given is not None else rid
            self.pending.append(Op("on_finished", (given, out), {"now": self.now}))
            self._answer_events(req, out)
            self.next_session = req.session
        if self.exact or rnd.random() < 0.15:
            if rnd.random() < 0.75:
                target = decision["instance"]
                late = self.exact and rnd.random() < 0.5
                events: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
                if rnd.random() < 0.4 and len(chain) > 1:  # two events: head, then tail under parent
                    k = rnd.randrange(1, len(chain))
                    events.append(((target, chain[:k]), {}))
                    events.append(((target, chain[k:]), {"parent": chain[k - 1]}))
                else:
                    events.append(((target, chain), {}))
                if late:
                    self.late_events.extend(events)
                else:
                    self.pending.extend(Op("store_blocks", a, {**kw, "now": self.now}) for a, kw in events)
            if rnd.random() < 0.3 and (self.global_on or rnd.random() < 0.2):
                self.pending.append(Op("store_blocks", (None, chain), {"tier": "global", "now": self.now}))

    # -- other ops -----------------------------------------------------------------------------
    def _lifecycle(self) -> Op:
        rnd = self.rnd
        name = rnd.choices(["on_prefilled", "on_finished", "on_aborted"], [40, 45, 15])[0]
        r = rnd.random()
        rid: int | str
        req: InFlight | None = None
        if r < 0.85 and (self.inflight or self.done):
            pool = list(self.inflight.values()) if (r < 0.7 and self.inflight) or not self.done else self.done
            req = rnd.choice(pool)  # in flight, or already finished (double finish, late prefilled)
            rid = req.given if req.given is not None and rnd.random() < 0.7 else req.rid
            if name != "on_prefilled" and req.rid in self.inflight:
                self.done.append(self.inflight.pop(req.rid))
                if len(self.done) > 50:
                    self.done.pop(0)
        elif rnd.random() < 0.7:
            rid = rnd.randrange(AUTO_ID_BASE + 2000)  # unknown, or an auto id not issued yet
        else:
            rid = f"never-{rnd.randrange(10**6)}"
        args: tuple[Any, ...] = (rid,)
        if name == "on_finished" and rnd.random() < 0.7:
            # Sometimes as long as the next turn's echo of it (0..2 blocks), so that the answer
            # credit (§2.7), not the chain's end, bounds a follow-up's hit.
            args = (rid, rnd.randrange(500) if rnd.random() < 0.4 else rnd.randrange(3 * self.block))
            if self.exact and req is not None and rnd.random() < 0.5:
                self._answer_events(req, args[1])
        self._advance()  # time passes: on_prefilled reads it (a drain-rate sample), on_finished too
        # (exact mode credits the answer's blocks until now + TTL, §2.7); on_aborted does not
        return Op(name, args, {"now": self.now} if name != "on_aborted" else {})

    def _answer_events(self, req: InFlight, output_tokens: int) -> None:
        """Queue the KV events of a finished request's answer (§2.7 "The answer"): its first
        full blocks (all, or a prefix: the rest still in flight) under the prompt's last one,
        now or late. A synthetic session still at this turn repeats the whole answer in its next
        turn; otherwise no follow-up does (a re-rendered answer). Sometimes the engine evicts
        the anchor instead."""
        rnd = self.rnd
        cached = (req.num_tokens + output_tokens - 1) // self.block - len(req.chain)
        if not req.chain or cached <= 0:
            return
        answer = [rnd.randrange(U64) for _ in range(cached)]
        s = req.session
        if s is not None and s.synthetic and s.chain and s.chain[-1] == req.chain[-1]:
            s.chain += answer
        stored = answer[: rnd.randint(1, len(answer))]
        event: tuple[tuple[Any, ...], dict[str, Any]] = ((req.instance, stored), {"parent": req.chain[-1]})
        if rnd.random() < 0.2:
            self.pending.append(Op("remove_blocks", (req.instance, req.chain[-1:]), {}))
        elif rnd.random() < 0.5:
            self.late_events.append(event)
        else:
            self.pending.append(Op("store_blocks", event[0], {**event[1], "now": self.now}))

    def _update_load(self, live: list[str]) -> Op:
        rnd = self.rnd
        kw: dict[str, Any] = {}
        if rnd.random() < 0.8:
            kw["running"] = rnd.randrange(0, 12)
        if rnd.random() < 0.7:
            kw["waiting"] = rnd.randrange(0, 8)
        if rnd.random() < 0.5:
            kw["kv_usage"] = rnd.choice([0.0, 1.0, round(rnd.random(), 3)])
        kw["now"] = self._advance()
        return Op("update_load", (rnd.choice(live),), kw)

    def _some_chain(self) -> list[int]:
        rnd = self.rnd
        if self.chains and rnd.random() < 0.9:
            return rnd.choice(self.chains)
        return [rnd.randrange(U64) for _ in range(rnd.randint(1, 4))]

    def _store(self, live: list[str]) -> Op:
        rnd = self.rnd
        chain = self._some_chain()
        a = rnd.randrange(len(chain)) if chain and rnd.random() < 0.4 else 0
        b = rnd.randint(a, len(chain))
        kw: dict[str, Any] = {}
        if a > 0 and rnd.random() < 0.7:
            kw["parent"] = chain[a - 1]
        elif rnd.random() < 0.05:
            kw["parent"] = rnd.randrange(U64)
        kw["now"] = self._advance()
        if rnd.random() < 0.3:
            return Op("store_blocks", (None, chain[a:b]), {"tier": "global", **kw})
        return Op("store_blocks", (rnd.choice(live), chain[a:b]), kw)

    def _remove(self, live: list[str]) -> Op:
        rnd = self.rnd
        chain = self._some_chain()
        if rnd.random() < 0.6:
            blocks = chain[rnd.randrange(len(chain) + 1) :]  # a tail, as engines free them
        else:
            blocks = [h for h in chain if rnd.random() < 0.4] + [rnd.randrange(U64)]
        if rnd.random() < 0.3:
            return Op("remove_blocks", (None, blocks), {"tier": "global"})
        return Op("remove_blocks", (rnd.choice(live), blocks), {})

    def _query(self) -> Op:
        rnd = self.rnd
        kw: dict[str, Any] = {}
        if self.sessions and rnd.random() < 0.8:
            s = rnd.choice(self.sessions)
            if s.synthetic:
                kw["hashes"] = list(s.chain)
                if rnd.random() < 0.5:
                    kw["num_tokens"] = len(s.chain) * self.block + rnd.randrange(self.block)
            else:
                cut = len(s.tokens) if rnd.random() < 0.5 else rnd.randint(0, len(s.tokens))
                kw["tokens"] = self._array(s.tokens[:cut])
                if s.namespace is not None:
                    kw["namespace"] = s.namespace
        else:
            kw["hashes"] = self._some_chain()
        kw["now"] = self._advance()
        return Op("query", (), kw)

    def next_op(self, ref: ReferenceRouterT) -> Op:
        if self.pending:
            return self.pending.pop(0)
        rnd = self.rnd
        if self.late_events and rnd.random() < 0.2:  # a late KV event arrives
            args, kw = self.late_events.pop(0)
            return Op("store_blocks", args, {**kw, "now": self._advance()})
        live = self._live(ref)
        kinds = ["route", "lifecycle", "update_load", "store", "remove", "clear", "add", "remove_instance", "query"]
        weights = [38, 27, 6, 6, 3, 1, 2, 2, 8]
        kinds.append("hash")
        weights.append(2)
        if self.exact:
            weights[3] = 10
        kind = rnd.choices(kinds, weights)[0]
        if kind == "hash":
            s = self._tokens(rnd.randrange(0, 5 * self.block))
            ns = rnd.choice([None, None, "lora-a", ""])
            return Op("hash_tokens", (self._array(s),), {} if ns is None else {"namespace": ns})
        if not live and kind not in ("add", "lifecycle", "query", "route"):
            kind = "add"
        if kind == "add" or (kind == "remove_instance" and len(live) <= 1 and rnd.random() < 0.9):
            free = [n for n in self.spec.names if n not in live]
            if not free:
                return self._route()
            return Op("add_instance", (rnd.choice(free),), {})
        match kind:
            case "route":
                return self._route()
            case "lifecycle":
                return self._lifecycle()
            case "update_load":
                return self._update_load(live)
            case "store":
                return self._store(live)
            case "remove":
                return self._remove(live)
            case "clear":
                if rnd.random() < 0.5:
                    return Op("clear", (None,), {"tier": "global"})
                return Op("clear", (rnd.choice(live),), {})
            case "remove_instance":
                return Op("remove_instance", (rnd.choice(live),), {})
            case _:
                return self._query()


PAPER_FIELDS = {k: v for k, v in smetric.RouterConfig().paper().to_dict().items() if k.startswith("smetric_")}
"""The ``smetric_*`` fields of ``RouterConfig.paper()`` (the authors' shipped configuration)."""
PAPER_UNMASKED = PAPER_FIELDS | {"smetric_decode_mask": "off"}
"""The shipped configuration without its decode mask, which the reference does not model (the
mask's branches are unit-tested in the core: ``policy/smetric_paper.rs``, ``router/decode_mask_tests.rs``)."""
V2_PORT_FIELDS = {k: v for k, v in smetric.RouterConfig().v2_port().to_dict().items() if k.startswith("smetric_")}
"""The ``smetric_*`` fields of ``RouterConfig.v2_port()`` (our port of the v2 rule)."""
V1_FIELDS = {k: v for k, v in smetric.RouterConfig().v1().to_dict().items() if k.startswith("smetric_")}
"""The ``smetric_*`` fields of ``RouterConfig.v1()`` (the July rule)."""


def v2_fields(rnd: random.Random) -> dict[str, Any]:
    """Tunables of the v2 rule, scaled so that the stream's small prompts and short gaps reach
    every gate branch: budgets from generous to none, fixed and learned rates, short windows."""
    window = rnd.choice([64, 1, 2, 3, 8])
    rule = rnd.choice(["v1", "v2", "v2"])
    # v2's own gate decides only under the "threshold" migration rule: give it most v2 streams.
    migration = rnd.choice(["threshold", "threshold", "threshold", "cost", "work", "fetch"])
    return {
        **({"smetric_migration": migration} if rule == "v2" else {}),
        "smetric_rule": rule,
        "smetric_l_eq_tokens": rnd.choice([6923.0, 13568.0, 100.0, 7.5]),
        "smetric_ttft_slack": rnd.choice([1.0, 0.5, 2.0, 0.0]),
        "smetric_ttft_base_s": rnd.choice([1.0, 0.0, 0.001, 0.02, 0.1]),
        "smetric_ttft_s_per_token": rnd.choice([1.0 / 16000.0, 0.0, 1e-4, 1e-3]),
        "smetric_drain_rate": rnd.choice([None, None, None, 500.0, 20_000.0]),
        "smetric_drain_rate_fallback": rnd.choice([22_000.0, 300.0, 2_000.0, 50.0]),
        "smetric_drain_window": window,
        "smetric_drain_min_samples": rnd.randint(1, min(window, 4)),
        "smetric_store_pricing": rnd.choice([True, False]),
        # The displacement guard, off, short (the stream's gaps: some instances churn), long.
        "smetric_retention_s": rnd.choice([0.0, 0.0, 0.05, 0.3, 5.0]),
        # The KV-bound regime, off or at shares the stream's small capacities reach.
        "smetric_kv_bound_share": rnd.choice([0.0, 0.0, 0.1, 0.3, 0.6]),
        # The decode budget (`smetric_tpot_budget_s`) stays off: the reference router does not
        # learn the pace fit (the reference policy's branches: `test_reference_unit.py`; the fit
        # and the router's feed: `decode_model.rs`, `router/decode_budget_tests.rs`).
        # The learned fetch cost (`smetric_learn_fetch_cost`) stays off for the same reason: the
        # reference router does not learn it (its policy's pricing: `test_reference_unit.py`; the
        # learner and the router's charge: `fetch_cost.rs`, `router/fetch_cost_tests.rs`).
    }


def case_spec(rnd: random.Random, case: int) -> CaseSpec:
    policy, cf_mode, mode = COMBOS[case % len(COMBOS)]
    default = rnd.random() < 0.25  # now and then the shipped tunables, unchanged
    config: dict[str, Any] = {
        "hash_seed": 0 if rnd.random() < 0.5 else rnd.randrange(U64),
        "index_mode": mode,
        "local_capacity_blocks": rnd.randint(8, 64),
        "global_capacity_blocks": 0 if rnd.random() < 0.35 else rnd.randint(16, 128),
        "local_ttl_s": None if rnd.random() < 0.5 else rnd.choice([0.05, 0.3, 0.3005, 1.0, 2.5]),
        "engine_load_staleness_s": rnd.choice([0.0, 0.1, 0.25, 0.3, 1.0, 2.0]),
        "first_turn_min_branches": rnd.choice([1, 1, 1, 2, 3]),
        "cache_first_mode": cf_mode,
        "exact_answer_credit": rnd.random() < 0.6,  # §2.7 "The answer" (off by default)
    }
    if not default:
        config |= {
            "cache_first_weights": rnd.choice(
                [(0.7, 0.15, 0.15), (1.0, 0.0, 0.0), (0.0, 0.0, 0.0), (0.3, 0.3, 0.4), (0.5, 0.25, 0.1)]
            ),
            "linear_prefill_weight": rnd.choice([1.0, 0.0, 0.5, 2.0, 0.3]),
            "global_fetch_cost": rnd.choice([0.1, 0.0, 0.5, 1.0, 0.37]),
            "min_local_hit_ratio": rnd.choice([0.5, 0.0, 0.25, 0.9, 1.0]),
            "overload_factor": rnd.choice([1.5, 1.0, 1.2, 2.0]),
            "overload_slack_tokens": rnd.choice([8192, 0, 0, 8, 32, 128]),
            "overload_slack_requests": rnd.choice([4, 0, 0, 1, 1, 2]),
            "smetric_active_weight": rnd.choice([0.0, 0.0, 0.5, 1.0]),
            "smetric_batch_term": rnd.choice([True, True, False]),
            "smetric_migration": rnd.choice(["threshold", "cost", "work", "fetch"]),
            "smetric_migration_margin": rnd.choice([0.0, 0.25, 1.0]),
            "smetric_kv_fit": rnd.choice([True, False]),
            "smetric_growth_headroom_tokens": rnd.choice([0.0, 16.0, 64.0]),
            "exact_pending_ttl_s": rnd.choice([2.0, 0.0, 0.05, 0.3, 0.0305]),
            # Windows short enough for the stream's clock to age entries out.
            "preble_window_s": rnd.choice([180.0, 0.05, 0.3, 0.3005, 1.0, 2.5]),
            "preble_hit_threshold": rnd.choice([0.5, 0.0, 0.25, 0.9, 1.0]),
            "preble_imbalance_requests": rnd.choice([8, 0, 1, 2]),
            # Small thresholds too, so the stream's few requests in flight reach every branch.
            "cache_aware_cache_threshold": rnd.choice([0.3, 0.0, 0.5, 0.9, 1.0]),
            "cache_aware_balance_abs_threshold": rnd.choice([64, 0, 1, 2]),
            "cache_aware_balance_rel_threshold": rnd.choice([1.5, 0.0, 1.0, 2.0]),
            "vllm_router_smetric_form": rnd.choice(["tokens", "pr_literal"]),
        } | v2_fields(rnd)
    elif rnd.random() < 0.5:  # the paper's forms: `smetric_paper` (unmasked), `smetric_v2_port`, `smetric_v1`
        config |= rnd.choice([PAPER_UNMASKED, V2_PORT_FIELDS, V1_FIELDS])
    names = BIG_NAMES if case % 16 == 15 else NAMES
    count = rnd.randint(63, 70) if names is BIG_NAMES else rnd.randint(1, 5)
    hot = case % 16 == 7
    if hot:  # room for the hot set, so blocks are re-touched far more often than evicted
        config["local_capacity_blocks"] = rnd.randint(150, 400)
        config["global_capacity_blocks"] = rnd.choice([0, 500])
        count = rnd.randint(1, 2)
    return CaseSpec(
        instances=names[:count],
        names=names,
        policy=policy,
        block_size=rnd.randint(1, 2) if hot else rnd.randint(1, 8),
        seed=rnd.randrange(U64),
        config=config,
        hot=hot,
    )


def run_case(case: int) -> int:
    """Generates and checks one stream; returns the number of ops run."""
    rnd = random.Random(SEED * 1_000_003 + case)
    spec = case_spec(rnd, case)
    rust, ref = build_pair(spec)
    assert (rust.policy, rust.block_size) == (ref.policy, ref.block_size)
    at_start = compare_state(rust, ref)
    assert at_start is None, at_start
    gen = StreamGen(rnd, spec)
    ops: list[Op] = []
    for index in range(OPS_PER_CASE):
        op = gen.next_op(ref)
        ops.append(op)
        problem, outcome = step(rust, ref, op)
        if problem is not None:
            fail(spec, case, index, ops, problem)
        if op.name == "route":
            gen.after_route(op, outcome)
    return len(ops)


def fail(spec: CaseSpec, case: int, index: int, ops: list[Op], problem: str) -> None:
    full = write_repro(spec, ops, f"case{case}")
    small = shrink(spec, list(ops))
    shrunk = write_repro(spec, small, f"case{case}_shrunk")
    small_found = first_mismatch(spec, small)
    small_problem = small_found[1] if small_found is not None else "(shrunk list no longer fails)"
    listing = "\n".join(f"  [{i}] {render(op)}" for i, op in enumerate(ops))
    small_listing = "\n".join(f"  [{i}] {render(op)}" for i, op in enumerate(small))
    pytest.fail(
        f"differential mismatch: SMETRIC_DIFF_SEED={SEED} case={case} op={index} ({render(ops[-1])})\n"
        f"{problem}\n"
        f"router: Router({list(spec.instances)!r}, policy={spec.policy!r}, block_size={spec.block_size}, "
        f"seed={spec.seed}, config=RouterConfig(**{spec.config!r}))\n"
        f"shrunk repro ({len(small)} ops, {shrunk}):\n{small_listing}\n{small_problem}\n"
        f"full op list so far ({len(ops)} ops, {full}):\n{listing}",
        pytrace=False,
    )


# --------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------
def test_every_policy_has_streams() -> None:
    """A policy added to the core (`PolicyKind::ALL`) must get streams here, in both index modes,
    and the default case count must reach every combination."""
    covered = {(policy, mode) for policy, _, mode in COMBOS[: min(CASES, len(COMBOS))]}
    assert covered == {(p, m) for p in smetric.POLICIES for m in ("approximate", "exact")}
    assert set(smetric.POLICIES) == set(_reference.router.POLICIES)


@pytest.mark.parametrize("case", range(CASES))
def test_random_operation_stream(case: int) -> None:
    assert run_case(case) == OPS_PER_CASE


def test_hash_tokens_agree() -> None:
    """Pure hashing on many random prompts, dtypes, block sizes, seeds and namespaces."""
    rnd = random.Random(SEED ^ 0x5EED)
    for i in range(HASH_CASES):
        block = rnd.randint(1, 20) if rnd.random() < 0.9 else rnd.choice([64, 129, 200])  # >128: streaming path
        hash_seed = rnd.choice([0, rnd.randrange(U64), U64 - 1])
        spec = CaseSpec(("a",), ("a",), "round_robin", block, 0, {"hash_seed": hash_seed})
        rust, ref = spec.build(smetric.Router, smetric.RouterConfig), spec.build(ReferenceRouter, ReferenceConfig)
        top = rnd.choice([10, 50_000, 1 << 31, 1 << 32])
        tokens = [rnd.randrange(top) for _ in range(rnd.randrange(0, 4 * block + 2))]
        dtype = rnd.choice([None, np.uint32, np.int64] + ([np.int32] if top <= (1 << 31) else []))
        arg: Any = tokens if dtype is None else np.array(tokens, dtype=dtype)
        ns = rnd.choice([None, None, "", "lora-a", "ünïcode/ns"])
        op = Op("hash_tokens", (arg,), {} if ns is None else {"namespace": ns})
        problem, want = step(rust, ref, op)
        if problem is not None:
            pytest.fail(f"hash mismatch: SMETRIC_DIFF_SEED={SEED} hash case {i}: {render(op)} {spec}\n{problem}")
        assert want == canon(ref_hash_tokens(tokens, block, hash_seed, ns))


if __name__ == "__main__":  # quick manual run: python tests/test_differential.py [cases]
    total = 0
    start = time.monotonic()
    for c in range(int(sys.argv[1]) if len(sys.argv) > 1 else CASES):
        total += run_case(c)
    print(f"{total} ops in {time.monotonic() - start:.1f}s")


def test_reference_defaults_and_paper_preset_follow_the_core() -> None:
    """The reference restates the core's defaults; they must agree field for field, and so must
    the paper preset (``RouterConfig.paper()`` / ``ReferenceConfig.paper()``)."""
    import dataclasses

    core, ref = smetric.RouterConfig().to_dict(), dataclasses.asdict(ReferenceConfig())
    assert {k: (float(v) if isinstance(v, int) and not isinstance(v, bool) else v) for k, v in core.items()} == {
        k: (float(v) if isinstance(v, int) and not isinstance(v, bool) else v) for k, v in ref.items()
    }
    assert smetric.RouterConfig().paper().to_dict() != core, "the smetric+ defaults differ from the paper's form"
    paper_ref = dataclasses.asdict(ReferenceConfig().paper())
    assert {k: v for k, v in paper_ref.items() if k.startswith("smetric_")} == PAPER_FIELDS
    v1_ref = dataclasses.asdict(ReferenceConfig().v1())
    assert {k: v for k, v in v1_ref.items() if k.startswith("smetric_")} == V1_FIELDS
    port_ref = dataclasses.asdict(ReferenceConfig().v2_port())
    assert {k: v for k, v in port_ref.items() if k.startswith("smetric_")} == V2_PORT_FIELDS
    assert (PAPER_FIELDS["smetric_rule"], V1_FIELDS["smetric_rule"]) == ("v2", "v1")
    # The shipped configuration: local-only pricing, the honest mask, a fixed rate; the port not.
    assert (PAPER_FIELDS["smetric_store_pricing"], PAPER_FIELDS["smetric_decode_mask"]) == (False, "honest")
    assert PAPER_FIELDS["smetric_drain_rate"] == 21400.0
    assert (V2_PORT_FIELDS["smetric_store_pricing"], V2_PORT_FIELDS["smetric_decode_mask"]) == (True, "off")
