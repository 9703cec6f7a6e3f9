"""``smetric fake-engine``: an OpenAI-compatible test double of one vLLM instance.

It speaks vLLM 0.33's protocols so that a router can be tested against it as against vLLM:
the OpenAI API with vLLM's ``usage`` fields (:mod:`.server`), vLLM's ``/metrics`` names, a real
bounded prefix cache keyed by vLLM's block hashes (:mod:`.cache`), vLLM's KV events over ZMQ with
the replay socket (:mod:`.kv_publisher`), and ``GET /kv_event_sources``. Timings come from the
simulator's analytic H20 model (``docs/perf-model.md``, :class:`smetric._core.PerfModel`) run
``speedup`` times faster, under a continuous-batching loop (:mod:`.engine`). Text is tokenized
reproducibly (:mod:`.tokens`). Everything runs on one asyncio loop, plus one thread for the ZMQ
sockets.

``GET /kv_event_sources`` answers ``{"0": KVEventsConfig}`` as vLLM does, with the fields and
defaults of vLLM's ``KVEventsConfig``; one choice is the fake engine's own: the endpoints are the
ports actually bound (``tcp://*:PORT`` rather than the configured ``tcp://*:0``), so an ephemeral
port (``--kv-events-port 0``) can be discovered. The host stays the wildcard, as vLLM reports a
bound endpoint (a consumer substitutes the engine's host), even though the sockets bind
``--kv-events-host`` (127.0.0.1 by default). Without ``--kv-events-port`` events
are off (vLLM's default): ``enable_kv_cache_events`` is false and ``publisher`` ``"null"``.

LoRA adapters (``--lora-modules name=path``) are served beside the model as vLLM serves them:
listed in ``/v1/models`` with the model as ``parent``, and a request naming one is hashed with
the adapter in every block (vLLM's extra keys), so it shares no cached block with the base model,
and its ``BlockStored`` events carry its ``lora_name``.

Simplifications, all stated where they live: one data-parallel rank, ``n=1``, one prompt per
``/v1/completions`` request, no preemption, generated tokens never cached, no sampling
parameters but ``max_tokens`` / ``max_completion_tokens``, filler output text.

Requires the ``fake-engine`` extra (``aiohttp``, ``pyzmq``; ``tokenizers`` for ``--tokenizer``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["FakeEngine", "FakeEngineConfig", "serve"]


def __getattr__(name: str) -> Any:
    # Lazy, so that `smetric.fake_engine.cli` (imported by `smetric`'s CLI) needs no extra.
    if name in __all__:
        from . import run

        return getattr(run, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
