"""Load board: per-instance counters, the engine snapshot, and the request table.

Mirrors docs/routing-semantics.md §3. Counters are the router's own bookkeeping; the engine
snapshot comes from `update_load` and only counts while it is fresh. Every decrement saturates at
0, like the Rust core's unsigned counters.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field


def sat_sub(value: int, amount: int) -> int:
    """`value - amount`, floored at 0 (§3: every decrement saturates)."""
    return max(value - amount, 0)


def prefill_work(new_tokens: int, n: int, l_eq_tokens: float) -> int:
    """§3 / §6 item 8: `ceil(p + p * (n - p / 2) * (1 / L_EQ))`, in the core's operation order."""
    p, length = float(new_tokens), float(n)
    return math.ceil(p + p * (length - p / 2.0) * (1.0 / l_eq_tokens))


@dataclass
class DrainRate:
    """§6 item 8: an instance's learned drain rate, the median of its last `window` samples."""

    samples: list[float] = field(default_factory=list)
    learned: float | None = None

    def record(self, work: int, elapsed_ms: int, window: int, min_samples: int) -> None:
        if work == 0 or elapsed_ms == 0:
            return
        self.samples.append(float(work) * 1000.0 / float(elapsed_ms))
        del self.samples[: max(len(self.samples) - window, 0)]
        if len(self.samples) < min_samples:
            return
        ordered = sorted(self.samples)
        mid = len(ordered) // 2
        self.learned = ordered[mid] if len(ordered) % 2 == 1 else (ordered[mid - 1] + ordered[mid]) / 2.0

    own_work_samples: list[float] = field(default_factory=list)
    peer_p90: float | None = None

    def record_own_work(self, work: int, elapsed_ms: int) -> None:
        """§6 item 12: vllm-router's estimator, the p90 of the last 64 own-work samples (>= 8)."""
        if work == 0 or elapsed_ms == 0:
            return
        if len(self.own_work_samples) == 64:
            del self.own_work_samples[0]
        self.own_work_samples.append(float(work) * 1000.0 / float(elapsed_ms))
        if len(self.own_work_samples) < 8:
            return
        ordered = sorted(self.own_work_samples)
        x = float(len(ordered) - 1) * 0.9
        whole = int(x)
        self.peer_p90 = ordered[whole + 1 if x - float(whole) >= 0.5 else whole]  # round half away, as Rust


@dataclass
class RecentLoad:
    """§6 item 13: the requests routed to an instance within `preble_window_s`, as
    `(routed_ms, cost_us)` in routing order; a read drops expired entries from the front."""

    entries: deque[tuple[int, int]] = field(default_factory=deque)
    cost_us: int = 0

    def record(self, now_ms: int, cost_us: int) -> None:
        self.entries.append((now_ms, cost_us))
        self.cost_us += cost_us

    def read(self, now_ms: int, window_ms: int) -> tuple[int, int]:
        """(requests, cost_us) still in the window at `now_ms`."""
        while self.entries and self.entries[0][0] + window_ms <= now_ms:
            self.cost_us -= self.entries.popleft()[1]
        return len(self.entries), self.cost_us


@dataclass
class InstanceLoad:
    """One live instance's load (§3). A freshly added instance starts with all zeros."""

    bs: int = 0  # requests routed here and not finished
    waiting: int = 0  # routed, not prefilled
    queued: int = 0  # uncached prompt tokens routed, not prefilled
    queued_work: int = 0  # their prefill work (§6 item 8)
    active: int = 0  # prompt tokens of the requests in flight
    running_e: int = 0  # engine snapshot (update_load) ...
    waiting_e: int = 0
    kv_usage: float = 0.0
    stamp_ms: int | None = None  # ... and when it was taken; None: no snapshot yet
    drain: DrainRate = field(default_factory=DrainRate)
    recent: RecentLoad = field(default_factory=RecentLoad)  # `preble` only (§6 item 13)
    peers: dict[str, int] = field(default_factory=dict)  # set_peer_load: peer replicas' work (§3)

    def peer(self, key: str) -> int:
        return self.peers.get(key, 0)

    def effective(self, now_ms: int, staleness_ms: int) -> tuple[int, int]:
        """(bs_eff, waiting_eff): the engine snapshot only counts while it exists and is fresh."""
        bs, waiting = self.bs + self.peer("batch_size"), self.waiting + self.peer("waiting")
        if self.stamp_ms is not None and max(now_ms - self.stamp_ms, 0) <= staleness_ms:
            return max(bs, self.running_e + self.waiting_e), max(waiting, self.waiting_e)
        return bs, waiting

    def as_dict(self) -> dict[str, int | float | None]:
        """The shape of `Router.load(name)` (§8; `smetric.InstanceLoad` names the keys)."""
        return {
            "batch_size": self.bs,
            "waiting": self.waiting,
            "queued": self.queued,
            "queued_work": self.queued_work,
            "active": self.active,
            "drain_rate": self.drain.learned,
            "engine_running": self.running_e,
            "engine_waiting": self.waiting_e,
            "kv_usage": self.kv_usage,
        }


@dataclass
class RequestRecord:
    """What the request table remembers about a routed request (§3)."""

    slot: int
    generation: int  # the slot's generation at routing time: detects removed/reused slots
    prefill: int  # prefill(r, X): what was added to `queued`
    n: int  # prompt tokens: what was added to `active`
    work: int = 0  # what was added to `queued_work`
    work_ahead: int = 0  # X's queued_work before the decision
    routed_ms: int = 0
    prefilled: bool = False
    anchor: int | None = None  # §2.7: the routed chain's last block (None: shorter than a block)
    prompt_blocks: int = 0  # blocks of the routed chain


def apply_routed(load: InstanceLoad, prefill: int, n: int, work: int) -> None:
    load.bs += 1
    load.waiting += 1
    load.queued += prefill
    load.queued_work += work
    load.active += n


def apply_prefilled(load: InstanceLoad, record: RequestRecord) -> None:
    """The prefilled step; callers check that it has not happened yet."""
    load.waiting = sat_sub(load.waiting, 1)
    load.queued = sat_sub(load.queued, record.prefill)
    load.queued_work = sat_sub(load.queued_work, record.work)
    record.prefilled = True


def apply_finished(load: InstanceLoad, record: RequestRecord) -> None:
    """Finish or abort: a request that never reported prefilled is prefilled first."""
    if not record.prefilled:
        apply_prefilled(load, record)
    load.bs = sat_sub(load.bs, 1)
    load.active = sat_sub(load.active, record.n)
