"""Load board: per-instance counters, the engine snapshot, and the request table.

Mirrors docs/routing-semantics.md §3. Counters are the router's own bookkeeping; the engine
snapshot comes from `update_load` and only counts while it is fresh. Every decrement saturates at
0, like the Rust core's unsigned counters.
"""

from __future__ import annotations

from dataclasses import dataclass


def sat_sub(value: int, amount: int) -> int:
    """`value - amount`, floored at 0 (§3: every decrement saturates)."""
    return max(value - amount, 0)


@dataclass
class InstanceLoad:
    """One live instance's load (§3). A freshly added instance starts with all zeros."""

    bs: int = 0  # requests routed here and not finished
    waiting: int = 0  # routed, not prefilled
    queued: int = 0  # uncached prompt tokens routed, not prefilled
    active: int = 0  # prompt tokens of the requests in flight
    running_e: int = 0  # engine snapshot (update_load) ...
    waiting_e: int = 0
    kv_usage: float = 0.0
    stamp_ms: int | None = None  # ... and when it was taken; None: no snapshot yet

    def effective(self, now_ms: int, staleness_ms: int) -> tuple[int, int]:
        """(bs_eff, waiting_eff): the engine snapshot only counts while it exists and is fresh."""
        if self.stamp_ms is not None and max(now_ms - self.stamp_ms, 0) <= staleness_ms:
            return max(self.bs, self.running_e + self.waiting_e), max(self.waiting, self.waiting_e)
        return self.bs, self.waiting

    def as_dict(self) -> dict[str, int | float]:
        """The shape of `Router.load(name)` (§8; `smetric.InstanceLoad` names the keys)."""
        return {
            "batch_size": self.bs,
            "waiting": self.waiting,
            "queued": self.queued,
            "active": self.active,
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
    prefilled: bool = False


def apply_routed(load: InstanceLoad, prefill: int, n: int) -> None:
    load.bs += 1
    load.waiting += 1
    load.queued += prefill
    load.active += n


def apply_prefilled(load: InstanceLoad, record: RequestRecord) -> None:
    """The prefilled step; callers check that it has not happened yet."""
    load.waiting = sat_sub(load.waiting, 1)
    load.queued = sat_sub(load.queued, record.prefill)
    record.prefilled = True


def apply_finished(load: InstanceLoad, record: RequestRecord) -> None:
    """Finish or abort: a request that never reported prefilled is prefilled first."""
    if not record.prefilled:
        apply_prefilled(load, record)
    load.bs = sat_sub(load.bs, 1)
    load.active = sat_sub(load.active, record.n)
