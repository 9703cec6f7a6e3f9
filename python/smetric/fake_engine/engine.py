"""The fake engine's scheduler: continuous batching over the simulator's step-time model.

One asyncio task runs vLLM's loop. Each step:

1. admits waiting requests in arrival order while fewer than ``max_num_seqs`` run and the
   prefix cache can reserve their blocks (:meth:`PrefixCache.admit`; the head of the queue
   blocks the rest, as vLLM's FCFS scheduler does);
2. schedules every running decode (one token each), then prefill chunks of the running
   requests in admission order until ``max_num_batched_tokens`` is spent (chunked prefill);
3. sleeps ``PerfModel.step_time(prefills, decodes) / speedup`` seconds, measured against an
   absolute deadline so that Python's overhead and the 1 ms timer resolution do not add up
   (a step that overran is followed by shorter sleeps until the deadline is caught up);
4. applies it: a request whose prefill completes stores its blocks and emits its first token;
   each decode emits one token; a request with all its tokens is released. The step's cache
   events are published as one ``KVEventBatch``.

Before a request reaches the queue it waits ``PerfModel.frontend_time(prompt) / speedup``
(vLLM's API server and tokenisation). Simplifications against vLLM: no preemption (a request
reserves its whole output at admission, so it never runs out of blocks), generated tokens are
never cached, no speculative decoding, one data-parallel rank.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from dataclasses import dataclass, field

from smetric._core import PerfModel

from .cache import Allocation, PrefixCache
from .kv_publisher import KvEventPublisher


@dataclass(eq=False, slots=True)
class Request:
    """One request inside the engine."""

    tokens: list[int]
    output_tokens: int
    """Tokens to generate."""
    hashes: list[int]
    arrival: float = field(default_factory=time.monotonic)
    alloc: Allocation | None = None
    computed: int = 0
    """Prompt tokens in KV (cached or prefilled)."""
    cached_tokens: int = 0
    generated: int = 0
    aborted: bool = False
    done: bool = False
    out: asyncio.Queue[int | None] = field(default_factory=asyncio.Queue)
    """Receives the count of generated tokens after each step that produced one; None at the end."""
    first_token_at: float | None = None
    hold: bool = False
    """Keep the blocks pinned at the end (a prefill for remote decode: a decode engine reads them)."""
    lora_name: str | None = None
    """The LoRA adapter the request names (its blocks are hashed and published under it)."""


@dataclass(slots=True)
class Counters:
    """Totals for ``/metrics``."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: int = 0
    aborted: int = 0
    steps: int = 0
    modelled_s: float = 0.0
    """Sum of the steps' modelled durations, seconds on the profile's hardware."""


class Engine:
    """Continuous batching over a :class:`PerfModel` (see the module docs)."""

    def __init__(
        self,
        cache: PrefixCache,
        perf: PerfModel,
        *,
        speedup: float = 100.0,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 8192,
        publisher: KvEventPublisher | None = None,
    ) -> None:
        if speedup <= 0:
            raise ValueError("speedup must be > 0")
        self.cache = cache
        self.perf = perf
        self.speedup = speedup
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.publisher = publisher
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.counters = Counters()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Starts the loop on the running event loop."""
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="smetric-fake-engine")

    async def stop(self) -> None:
        """Stops the loop; every request still in the engine ends (its queue gets None)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for r in [*self.running, *self.waiting]:
            self._end(r)
        self.running.clear()
        self.waiting.clear()
        self._publish()

    async def submit(self, r: Request) -> None:
        """Waits the frontend time, then queues the request."""
        await asyncio.sleep(self.perf.frontend_time(len(r.tokens)) / self.speedup)
        if r.aborted:
            r.done = True
            return
        self.waiting.append(r)
        self.counters.prompt_tokens += len(r.tokens)
        self._wake.set()

    def abort(self, r: Request) -> None:
        """Marks a request aborted (client gone); it leaves the engine at the next step."""
        if not r.done:
            r.aborted = True
            self._wake.set()

    # -- the loop ----------------------------------------------------------------------------

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        while True:
            self._drop_aborted()
            self._admit()
            if not self.running:
                self._wake.clear()
                await self._wake.wait()
                deadline = loop.time()
                continue
            prefills, decodes, plan = self._schedule()
            step = self.perf.step_time(prefills, decodes)
            self.counters.steps += 1
            self.counters.modelled_s += step
            deadline = max(deadline, loop.time() - 0.05) + step / self.speedup
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            self._apply(plan)
            self._publish()

    def _drop_aborted(self) -> None:
        if any(r.aborted for r in self.running):
            for r in [r for r in self.running if r.aborted]:
                self._finish(r, aborted=True)
        if any(r.aborted for r in self.waiting):
            self.waiting = deque(r for r in self.waiting if not r.aborted or self._end(r))

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.max_num_seqs:
            r = self.waiting[0]
            a = self.cache.admit(r.tokens, r.output_tokens, r.hashes, r.lora_name)
            if a is None:
                return
            self.waiting.popleft()
            r.alloc = a
            r.computed = r.cached_tokens = a.hit_blocks * self.cache.block_size
            self.running.append(r)

    def _schedule(self) -> tuple[list[tuple[int, int]], list[int], list[tuple[Request, int]]]:
        budget = self.max_num_batched_tokens
        decodes = []
        plan: list[tuple[Request, int]] = []
        for r in self.running:
            if r.computed == len(r.tokens) and budget > 0:
                decodes.append(r.computed + r.generated)
                plan.append((r, 0))
                budget -= 1
        prefills = []
        for r in self.running:
            if budget <= 0:
                break
            left = len(r.tokens) - r.computed
            if left > 0:
                chunk = min(left, budget)
                prefills.append((chunk, r.computed))
                plan.append((r, chunk))
                budget -= chunk
        return prefills, decodes, plan

    def _apply(self, plan: list[tuple[Request, int]]) -> None:
        now = time.monotonic()
        for r, chunk in plan:
            if r.aborted:
                continue
            if chunk:
                r.computed += chunk
                if r.computed < len(r.tokens):
                    continue
                assert r.alloc is not None
                self.cache.store(r.alloc)
                r.first_token_at = now
            r.generated += 1
            self.counters.generation_tokens += 1
            r.out.put_nowait(r.generated)
            if r.generated >= r.output_tokens:
                self._finish(r, aborted=False)

    def _finish(self, r: Request, *, aborted: bool) -> None:
        self.running.remove(r)
        if r.alloc is not None and (aborted or not r.hold):
            self.cache.release(r.alloc)
        if aborted:
            self.counters.aborted += 1
        else:
            self.counters.finished += 1
        self._end(r)

    def _end(self, r: Request) -> bool:
        if not r.done:
            r.done = True
            r.out.put_nowait(None)
        return False

    def _publish(self) -> None:
        events = self.cache.take_events()
        if events and self.publisher is not None:
            self.publisher.publish(events)
