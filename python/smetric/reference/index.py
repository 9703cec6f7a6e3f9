"""Two-tier KV$ index: entries with children counters, per-holder LRU sets, TTL, sent blocks.

Mirrors docs/routing-semantics.md §2 (2.1 state, 2.2 touch, 2.3 removal, 2.4 query matching,
2.5 TTL, 2.7 sent-not-confirmed blocks of exact mode). Holders are keyed by instance slot (0, 1,
...) or `GLOBAL` for the global tier. Each holder is an `OrderedDict` from block hash to touch
time in ms, least recently used first, so eviction is `popitem(last=False)` and a touch is
`move_to_end`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

GLOBAL = -1
"""Holder key of the global tier (instance slots are >= 0)."""

CHILDREN_MAX = 65535
"""`children` is a saturating u16 in the Rust core (§2.1)."""


@dataclass
class Entry:
    """One block hash present in at least one holder (§2.1)."""

    children: int = 0


@dataclass
class Holder:
    """One holder's set S_X with its LRU order and touch times (§2.1)."""

    capacity: int
    ttl_ms: int | None  # None: no TTL (always None for the global tier, §2.5)
    blocks: OrderedDict[int, int] = field(default_factory=OrderedDict)  # hash -> touch ms, LRU first
    # The newest touch time of a block given up for room or by a removal event (not for age):
    # `smetric`'s displacement guard reads `now - evicted_touch_ms` (§6 item 8).
    evicted_touch_ms: int | None = None


class KvIndex:
    """The index of §2: one entry table shared by all holders."""

    def __init__(self, pending_ttl_ms: int = 0, pending_capacity: int = 0, answer_credit: bool = False) -> None:
        self.entries: dict[int, Entry] = {}
        self.holders: dict[int, Holder] = {}
        # §2.7: per instance slot, the blocks sent and not yet confirmed, least recently sent first:
        # hash -> (deadline ms, a sent chain continued past it). TTL 0: none are ever recorded.
        self.pending_ttl_ms = pending_ttl_ms
        self.pending_capacity = pending_capacity
        self.pending: dict[int, OrderedDict[int, tuple[int, bool]]] = {}
        # §2.7 "The answer": per instance slot, finished requests' answers, least recently
        # credited first: anchor hash -> (answer blocks, deadline ms).
        self.answer_credit = answer_credit and pending_ttl_ms > 0
        self.credits: dict[int, OrderedDict[int, tuple[int, int]]] = {}

    # -- holders -------------------------------------------------------------------------------
    def add_holder(self, key: int, capacity: int, ttl_ms: int | None) -> None:
        self.holders[key] = Holder(capacity=capacity, ttl_ms=ttl_ms)
        self.pending.pop(key, None)
        self.credits.pop(key, None)

    def drop_holder(self, key: int) -> None:
        """Forget a removed instance: each of its blocks goes through §2.3 first (§7)."""
        self.clear(key)
        del self.holders[key]

    # -- §2.7 sent, not yet confirmed ----------------------------------------------------------
    def send(self, key: int, chain: list[int], now_ms: int) -> None:
        """Exact mode's record of a decision: the chain's blocks `key` does not hold are sent."""
        if self.pending_ttl_ms <= 0:
            return
        sent = self.pending.setdefault(key, OrderedDict())
        while sent and next(iter(sent.values()))[0] <= now_ms:  # expiry, least recently sent first
            sent.popitem(last=False)
        held = self.holders[key].blocks
        for i in range(len(chain) - 1, -1, -1):  # tail to head: the head ends up most recent
            block = chain[i]
            if block in held:
                continue
            _, had_child = sent.pop(block, (0, False))
            sent[block] = (now_ms + self.pending_ttl_ms, had_child or i < len(chain) - 1)
        while len(sent) > self.pending_capacity:  # the memory bound, least recently sent first
            sent.popitem(last=False)

    def end_pending(self, key: int, blocks: list[int]) -> None:
        """An event stored (confirmed) or removed (evicted) these blocks of instance `key`."""
        sent = self.pending.get(key)
        if sent:
            for block in blocks:
                sent.pop(block, None)

    def _sent_mark(self, key: int, block: int) -> tuple[int, bool] | None:
        sent = self.pending.get(key)
        return None if sent is None else sent.get(block)

    def sent_counts(self, key: int, block: int, now_ms: int) -> bool:
        mark = self._sent_mark(key, block)
        return mark is not None and now_ms < mark[0]

    def sent_has_child(self, key: int, block: int, now_ms: int) -> bool:
        mark = self._sent_mark(key, block)
        return mark is not None and now_ms < mark[0] and mark[1]

    def matched_with_sent(self, key: int, chain: list[int], now_ms: int) -> int:
        """Largest k with every chain[i < k] held by `key` or sent to it (§2.7), then extended by
        the answer credits anchored at some chain[p], p < k, to p + 1 + blocks (the larger)."""
        blocks = self.holders[key].blocks
        k = 0
        while k < len(chain) and (chain[k] in blocks or self.sent_counts(key, chain[k], now_ms)):
            k += 1
        best = k
        credits = self.credits.get(key, OrderedDict())
        for p in range(k if credits else 0):
            credit = credits.get(chain[p])
            if credit is not None and now_ms < credit[1]:
                best = max(best, min(len(chain), p + 1 + credit[0]))
        return best

    # -- §2.7 "The answer" -----------------------------------------------------------------------
    def credit(self, key: int, anchor: int, blocks: int, now_ms: int) -> None:
        """A finished request's `blocks` answer blocks hang past `anchor` on instance `key`."""
        if not self.answer_credit or blocks <= 0:
            return
        credits = self.credits.setdefault(key, OrderedDict())
        while credits and next(iter(credits.values()))[1] <= now_ms:  # expiry, oldest first
            credits.popitem(last=False)
        credits.pop(anchor, None)
        credits[anchor] = (blocks, now_ms + self.pending_ttl_ms)
        while sum(b for b, _ in credits.values()) > self.pending_capacity:  # the memory bound
            credits.popitem(last=False)

    def confirm_credits(self, key: int, run: list[int], parent: int | None) -> None:
        """A store event: a credit anchored at `parent` or inside `run` (not its last block) sees
        blocks confirmed; it ends when the run covers it, else moves to the run's last block."""
        credits = self.credits.get(key)
        if not credits or not run:
            return
        last = len(run) - 1
        anchors = ([(parent, len(run))] if parent is not None else []) + [(run[i], last - i) for i in range(last)]
        moved: tuple[int, int] | None = None
        for anchor, after in anchors:
            credit = credits.pop(anchor, None)
            if credit is not None and credit[0] > after:
                rest = (credit[0] - after, credit[1])
                moved = rest if moved is None or rest[0] > moved[0] else moved
        if moved is not None:
            credits.pop(run[last], None)
            credits[run[last]] = moved

    def end_credits(self, key: int, blocks: list[int]) -> None:
        """An event evicted these blocks of instance `key`: credits anchored there end."""
        credits = self.credits.get(key)
        if credits:
            for block in blocks:
                credits.pop(block, None)

    # -- §2.3 removal --------------------------------------------------------------------------
    def remove(self, key: int, block: int) -> None:
        """Remove `block` from holder `key`; drop its entry when no holder holds it any more.

        The parent's children counter is deliberately left alone (§2.3).
        """
        holder = self.holders[key]
        if block not in holder.blocks:
            return
        del holder.blocks[block]
        if not any(block in h.blocks for h in self.holders.values()):
            del self.entries[block]

    def give_up(self, key: int, block: int) -> None:
        """Remove `block` from holder `key` for room or by an engine's event, recording its touch
        time as the holder's newest block given up (instances only)."""
        holder = self.holders[key]
        touched_ms = holder.blocks.get(block)
        if touched_ms is None:
            return
        if key != GLOBAL:
            latest = holder.evicted_touch_ms
            holder.evicted_touch_ms = touched_ms if latest is None else max(latest, touched_ms)
        self.remove(key, block)

    def clear(self, key: int) -> None:
        for block in list(self.holders[key].blocks):
            self.remove(key, block)
        self.pending.pop(key, None)
        self.credits.pop(key, None)
        self.holders[key].evicted_touch_ms = None

    def _evict_lru(self, key: int) -> None:
        lru_block = next(iter(self.holders[key].blocks))
        self.remove(key, lru_block)

    # -- §2.5 TTL ------------------------------------------------------------------------------
    def purge(self, key: int, now_ms: int) -> None:
        """Evict from the LRU end while the LRU block is expired (now - touch >= ttl)."""
        holder = self.holders[key]
        if holder.ttl_ms is None:
            return
        while holder.blocks:
            touched_ms = next(iter(holder.blocks.values()))
            if now_ms - touched_ms < holder.ttl_ms:
                break
            self._evict_lru(key)

    # -- §2.2 touch ----------------------------------------------------------------------------
    def _bump_children(self, block: int) -> None:
        entry = self.entries[block]
        entry.children = min(entry.children + 1, CHILDREN_MAX)

    def touch(self, key: int, run: list[int], now_ms: int, parent: int | None = None) -> None:
        holder = self.holders[key]
        # 1. TTL purge of this holder only.
        self.purge(key, now_ms)
        self.end_pending(key, run)  # §2.7: stored, so confirmed (the global tier has none)
        self.confirm_credits(key, run, parent)  # §2.7 "The answer": confirmed past the anchor
        # 2. Creation pass, head to tail: a new entry counts as one more child of its parent.
        for i, block in enumerate(run):
            if block in self.entries:
                continue
            self.entries[block] = Entry()
            if i > 0:
                self._bump_children(run[i - 1])
            elif parent is not None and parent in self.entries:
                self._bump_children(parent)
        # 3. Touch pass, tail to head: the head ends up most recent, so the tail is evicted first.
        for block in reversed(run):
            holder.blocks[block] = now_ms  # inserts at the MRU end when absent ...
            holder.blocks.move_to_end(block)  # ... and moves it there when present
        # 4. Capacity: evict LRU blocks until the holder fits (only after the whole run is in).
        while len(holder.blocks) > holder.capacity:
            self.give_up(key, next(iter(holder.blocks)))

    # -- §2.4 query helpers ----------------------------------------------------------------------
    def matched_blocks(self, key: int, chain: list[int]) -> int:
        """Largest k with chain[0..k) all held by `key`. Touches nothing."""
        blocks = self.holders[key].blocks
        k = 0
        while k < len(chain) and chain[k] in blocks:
            k += 1
        return k

    def children(self, block: int) -> int:
        entry = self.entries.get(block)  # a block only sent (§2.7) has no entry
        return 0 if entry is None else entry.children
