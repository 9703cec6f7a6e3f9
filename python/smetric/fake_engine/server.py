"""The fake engine's HTTP surface: vLLM's OpenAI-compatible API on aiohttp.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``/v1/responses`` (and its
stored responses' routes: :mod:`.responses`), Anthropic's ``POST /v1/messages`` and
``/v1/messages/count_tokens`` (:mod:`.messages`), ``GET /v1/models``,
``GET /health``, ``GET /metrics``, ``GET /kv_event_sources``. Bodies follow vLLM 0.33:

* non-streaming: one ``chat.completion`` / ``text_completion`` object with ``usage``
  (``prompt_tokens``, ``completion_tokens``, ``total_tokens``, and
  ``prompt_tokens_details.cached_tokens``, which vLLM fills with ``--enable-prompt-tokens-details``;
  the fake engine always does);
* streaming: ``text/event-stream``, one ``data: {chunk}\\n\\n`` per generated token (chat's
  first chunk carries ``delta.role``), the last token's chunk carries ``finish_reason``, then a
  usage chunk with ``choices: []`` when ``stream_options.include_usage`` is true, then
  ``data: [DONE]``;
* errors: ``{"error": {"message", "type", "param", "code"}}`` with the HTTP status in ``code``:
  malformed JSON, a wrong type, a missing field or too long a prompt is 400
  (``BadRequestError``), an unknown model 404 (``NotFoundError``);
* ``--api-key``: as vLLM's, it guards the ``/v1`` paths only — a request without
  ``Authorization: Bearer <key>`` gets 401 ``{"error": "Unauthorized"}``; ``/health``,
  ``/metrics`` and ``/kv_event_sources`` stay open.

A client that disconnects from a stream aborts its request (it leaves the engine at the next
step).

HTTP stack: aiohttp, the only one considered, because one measurement already clears the need by
a wide margin: ``benches/fake_engine_load.py`` (server pinned to one core, 32 streaming clients,
256-token prompts, 16 output tokens, the model's wait removed with ``--speedup 1e6``) sustained
1,874 streaming requests/s (31,850 SSE events/s, p50 17 ms, p99 30 ms) on a 2-core machine whose
cores were both busy with a simulation.
"""

from __future__ import annotations

from . import _deps  # noqa: F401  (names the extra when a package is missing)

# isort: split

import hashlib
import hmac
import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from .engine import Engine, Request
from .messages import MessagesRoutes
from .pd import DecodeSide, KvTransferError, PrefillSide
from .responses import ResponsesEndpoint
from .tokens import Tokenizer, default_output_tokens, filler, render_chat

FAKE_KV_BYTES_PER_TOKEN = 98_304
"""KV bytes per token the fake announces (``kv_cache_memory_bytes / kv_cache_size_tokens``):
Qwen3-Coder-30B-A3B's 96 KiB (docs/perf-model.md), so an announced offload size reads as a real one."""
GIB = 1 << 30

log = logging.getLogger(__name__)


class ApiError(Exception):
    """An OpenAI-style error response."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def response(self) -> web.Response:
        kind = {400: "BadRequestError", 404: "NotFoundError"}.get(self.status, "InternalServerError")
        body = {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.status}}
        return web.json_response(body, status=self.status, dumps=_dumps)


def _dumps(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """What the HTTP layer needs besides the engine."""

    model: str
    max_model_len: int
    kv_event_sources: Mapping[str, Mapping[str, Any]]
    """The ``GET /kv_event_sources`` answer."""
    prefill: PrefillSide | None = None
    """Set for ``--role prefill``: honours ``do_remote_decode`` and serves KV pulls."""
    decode: DecodeSide | None = None
    """Set for ``--role decode``: honours ``do_remote_prefill`` by pulling the KV first."""
    lora_modules: Mapping[str, str] = field(default_factory=dict)
    """Served LoRA adapters, name → path (vLLM's ``--lora-modules name=path``): a request naming
    one as its ``model`` is cached and published under it."""
    api_key: str | None = None
    """vLLM's ``--api-key``: the ``/v1`` paths need ``Authorization: Bearer <key>``."""


def _int_field(body: Mapping[str, Any], name: str, default: int | None, minimum: int) -> int | None:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise ApiError(400, f"{name} must be an integer, got {type(value).__name__}", name)
    if value < minimum:
        raise ApiError(400, f"{name} must be at least {minimum}, got {value}", name)
    return value


def _bool_field(body: Mapping[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(400, f"{name} must be a boolean, got {type(value).__name__}", name)
    return value


def _api_key_guard(key: str) -> Any:
    """vLLM's ``--api-key`` check: ``/v1`` paths only, the bearer token compared in constant time."""
    expected = hashlib.sha256(f"Bearer {key}".encode()).digest()

    @web.middleware
    async def guard(request: web.Request, handler: Callable[[web.Request], Any]) -> web.StreamResponse:
        if request.path.startswith("/v1"):
            given = hashlib.sha256(request.headers.get("Authorization", "").encode()).digest()
            if not hmac.compare_digest(given, expected):
                return web.json_response({"error": "Unauthorized"}, status=401)
        response: web.StreamResponse = await handler(request)
        return response

    return guard


class FakeEngineApp:
    """Builds the aiohttp application around an :class:`Engine`."""

    def __init__(self, engine: Engine, tokenizer: Tokenizer, config: ServerConfig) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.config = config
        self.started = int(time.time())

    def build(self) -> web.Application:
        """The application (routes only; the caller starts and stops the engine)."""
        middlewares = [] if self.config.api_key is None else [_api_key_guard(self.config.api_key)]
        app = web.Application(client_max_size=64 << 20, middlewares=middlewares)
        app.router.add_post("/v1/chat/completions", self._handler(chat=True))
        app.router.add_post("/v1/completions", self._handler(chat=False))
        ResponsesEndpoint(self).install(app)
        MessagesRoutes(self).add_to(app.router)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/kv_event_sources", self.kv_event_sources)
        if self.config.prefill is not None:
            app.router.add_post("/fake_kv/pull", self.kv_pull)
        return app

    async def kv_pull(self, request: web.Request) -> web.Response:
        """A decode engine reads the KV a prefill left for it (the fake's NIXL side channel)."""
        assert self.config.prefill is not None
        try:
            body = json.loads(await request.read())
            return web.json_response(self.config.prefill.pull(body), dumps=_dumps)
        except (ValueError, AttributeError) as e:
            return ApiError(400, f"malformed pull: {e}").response()
        except KvTransferError as e:
            return ApiError(404, str(e)).response()

    # -- small endpoints -----------------------------------------------------------------------

    async def health(self, _: web.Request) -> web.Response:
        """``200`` with an empty body, as vLLM answers."""
        return web.Response(status=200)

    async def models(self, _: web.Request) -> web.Response:
        """The served model and its LoRA adapters, in vLLM's ``ModelCard`` form (an adapter's
        ``root`` is its path, its ``parent`` the base model)."""
        card = {
            "id": self.config.model,
            "object": "model",
            "created": self.started,
            "owned_by": "vllm",
            "root": self.config.model,
            "parent": None,
            "max_model_len": self.config.max_model_len,
        }
        adapters = [
            card | {"id": name, "root": path, "parent": self.config.model}
            for name, path in self.config.lora_modules.items()
        ]
        return web.json_response({"object": "list", "data": [card, *adapters]}, dumps=_dumps)

    async def kv_event_sources(self, _: web.Request) -> web.Response:
        """``{dp_rank: KVEventsConfig}``, with the endpoints actually bound."""
        return web.json_response(dict(self.config.kv_event_sources), dumps=_dumps)

    async def metrics(self, _: web.Request) -> web.Response:
        """vLLM's Prometheus families the router reads (see :func:`render_metrics`)."""
        text = render_metrics(self.engine, self.config.model)
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    # -- completions ---------------------------------------------------------------------------

    def _handler(self, *, chat: bool) -> Callable[[web.Request], Any]:
        async def handle(request: web.Request) -> web.StreamResponse:
            try:
                return await self._complete(request, chat=chat)
            except ApiError as e:
                return e.response()
            except Exception as e:  # a bug here must still answer in the OpenAI form
                log.exception("request failed")
                return ApiError(500, f"internal error: {type(e).__name__}").response()

        return handle

    async def _parse(self, request: web.Request) -> dict[str, Any]:
        try:
            body = json.loads(await request.read())
        except (ValueError, UnicodeDecodeError) as e:
            raise ApiError(400, f"malformed JSON body: {e}") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise ApiError(400, "model must be a string", "model")
        if model is not None and model != self.config.model and model not in self.config.lora_modules:
            raise ApiError(404, f"The model `{model}` does not exist.", "model")
        return body

    def _lora(self, body: Mapping[str, Any]) -> tuple[str, str] | None:
        """``(name, path)`` of the adapter the (checked) body names, or None for the base model."""
        model = body.get("model")
        if isinstance(model, str) and model != self.config.model and model in self.config.lora_modules:
            return model, self.config.lora_modules[model]
        return None

    def _prompt(self, body: Mapping[str, Any], *, chat: bool) -> list[int]:
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise ApiError(400, "messages must be a non-empty list", "messages")
            cont = _bool_field(body, "continue_final_message")
            gen = True if body.get("add_generation_prompt") is None else _bool_field(body, "add_generation_prompt")
            try:
                text = render_chat(messages, add_generation_prompt=gen, continue_final_message=cont)
            except TypeError as e:
                raise ApiError(400, str(e), "messages") from None
            except ValueError as e:
                raise ApiError(400, str(e), "continue_final_message") from None
            return self.tokenizer.encode_chat(text)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            return self.tokenizer.encode_prompt(prompt)
        if isinstance(prompt, list) and prompt and all(type(t) is int and 0 <= t < 2**32 for t in prompt):
            return list(prompt)
        raise ApiError(400, "prompt must be a string or a non-empty list of token ids (one prompt)", "prompt")

    async def _complete(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        body = await self._parse(request)
        tokens = self._prompt(body, chat=chat)
        limit = _int_field(body, "max_completion_tokens", None, 1) if chat else None
        if limit is None:
            limit = _int_field(body, "max_tokens", None, 1)
        if _int_field(body, "n", 1, 1) != 1:
            raise ApiError(400, "the fake engine supports n=1 only", "n")
        stream = _bool_field(body, "stream")
        options = body.get("stream_options")
        if options is not None and not isinstance(options, dict):
            raise ApiError(400, "stream_options must be an object", "stream_options")
        include_usage = stream and _bool_field(options or {}, "include_usage")
        if len(tokens) + (limit or 0) > self.config.max_model_len or len(tokens) >= self.config.max_model_len:
            raise ApiError(
                400,
                f"This model's maximum context length is {self.config.max_model_len} tokens. However, you "
                f"requested {len(tokens) + (limit or 0)} tokens ({len(tokens)} in the messages, {limit or 0} "
                "in the completion). Please reduce the length of the messages or completion.",
            )
        # vLLM's `ignore_eos` sampling parameter: the output runs to `max_tokens`.
        natural = limit if limit is not None and _bool_field(body, "ignore_eos") else default_output_tokens(tokens)
        output = natural if limit is None else min(limit, natural)
        if limit is not None and limit <= natural:
            output, finish = limit, "length"
        else:
            finish = "stop"
        cache = self.engine.cache
        if -(-(len(tokens) + output) // cache.block_size) > cache.num_blocks:
            raise ApiError(400, f"the request needs more than the engine's {cache.num_blocks} KV blocks")
        params = body.get("kv_transfer_params")
        if params is not None and not isinstance(params, dict):
            raise ApiError(400, "kv_transfer_params must be an object", "kv_transfer_params")
        remote_decode = self.config.prefill is not None and bool(params and params.get("do_remote_decode"))
        if remote_decode and stream:
            raise ApiError(400, "a prefill for remote decode is not streamed (stream=false)", "stream")
        if self.config.decode is not None and params and params.get("do_remote_prefill"):
            try:
                await self.config.decode.pull(params, tokens)
            except KvTransferError as e:
                raise ApiError(400, f"kv_transfer_params refused: {e}", "kv_transfer_params") from None
        lora = self._lora(body)
        r = Request(
            tokens=tokens,
            output_tokens=output,
            hashes=cache.hash_prompt(tokens, lora),
            hold=remote_decode,
            lora_name=None if lora is None else lora[0],
        )
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        try:
            await self.engine.submit(r)
            if stream:
                try:
                    return await self._stream(request, r, rid, created, chat=chat, finish=finish, usage=include_usage)
                except ConnectionResetError:  # the client went away: abort (below), nothing to answer
                    return web.Response(status=499)
            while await r.out.get() is not None:
                pass
        finally:
            self.engine.abort(r)
        if r.aborted or r.generated < r.output_tokens:
            raise ApiError(500, "the engine stopped before the request finished")
        text = "".join(filler(i) for i in range(r.generated))
        usage = self._usage(r)
        if chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
            }
            doc = {"id": rid, "object": "chat.completion", "created": created, "model": self.config.model}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
            doc = {"id": rid, "object": "text_completion", "created": created, "model": self.config.model}
        doc |= {"choices": [choice], "usage": usage}
        if remote_decode and r.alloc is not None:
            assert self.config.prefill is not None
            doc["kv_transfer_params"] = self.config.prefill.hold(rid, r.alloc, tokens)
        return web.json_response(doc, dumps=_dumps)

    def _usage(self, r: Request) -> dict[str, Any]:
        return {
            "prompt_tokens": len(r.tokens),
            "total_tokens": len(r.tokens) + r.generated,
            "completion_tokens": r.generated,
            "prompt_tokens_details": {"cached_tokens": r.cached_tokens},
        }

    async def _stream(
        self, request: web.Request, r: Request, rid: str, created: int, *, chat: bool, finish: str, usage: bool
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        head = f'{{"id":"{rid}","object":"{"chat.completion.chunk" if chat else "text_completion"}",'
        head += f'"created":{created},"model":{json.dumps(self.config.model)},"choices":'
        if chat:
            first = '[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]'
            await resp.write(f"data: {head}{first}}}\n\n".encode())
        sent = 0
        while (count := await r.out.get()) is not None:
            parts = []
            while sent < count:
                text = json.dumps(filler(sent))
                sent += 1
                last = sent == r.output_tokens
                reason = f'"{finish}"' if last else "null"
                if chat:
                    choice = f'[{{"index":0,"delta":{{"content":{text}}},"logprobs":null,"finish_reason":{reason}'
                else:
                    choice = f'[{{"index":0,"text":{text},"logprobs":null,"finish_reason":{reason}'
                choice += ',"stop_reason":null}]' if last else "}]"
                parts.append(f"data: {head}{choice}}}\n\n")
            await resp.write("".join(parts).encode())
        if sent < r.output_tokens:
            return resp  # aborted or shut down: the stream just ends, as vLLM's does
        if usage:
            await resp.write(f"data: {head}[],{_dumps({'usage': self._usage(r)})[1:]}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def render_metrics(engine: Engine, model: str) -> str:
    """vLLM's metric names and label set (``engine``, ``model_name``) for the engine's state."""
    labels = f'{{engine="0",model_name={json.dumps(model)}}}'
    c, cache = engine.counters, engine.cache
    families = [
        ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", len(engine.running)),
        ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", len(engine.waiting)),
        (
            "vllm:kv_cache_usage_perc",
            "gauge",
            "KV-cache usage. 1 means 100 percent usage.",
            cache.used_blocks / cache.num_blocks,
        ),
        (
            "vllm:prefix_cache_queries_total",
            "counter",
            "Prefix cache queries, in terms of number of queried tokens.",
            cache.queries,
        ),
        (
            "vllm:prefix_cache_hits_total",
            "counter",
            "Prefix cache hits, in terms of number of cached tokens.",
            cache.hits,
        ),
        ("vllm:prompt_tokens_cached_total", "counter", "Number of cached prompt tokens (local).", cache.hits),
        ("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.", 0),
        ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", c.prompt_tokens),
        ("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", c.generation_tokens),
    ]
    out = []
    for name, kind, doc, value in families:
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n{name}{labels} {float(value)!r}\n")
    # vLLM's info gauge of its CacheConfig (value 1, the settings as labels; a subset of them).
    kv_tokens = cache.num_blocks * cache.block_size
    offload_gib = cache.host_blocks * cache.block_size * FAKE_KV_BYTES_PER_TOKEN / GIB
    info = {
        "block_size": cache.block_size,
        "cache_dtype": "auto",
        "enable_prefix_caching": "True",
        "kv_cache_memory_bytes": kv_tokens * FAKE_KV_BYTES_PER_TOKEN,
        "kv_cache_size_tokens": kv_tokens,
        "kv_offloading_backend": "native",
        "kv_offloading_size": repr(offload_gib) if cache.host_blocks else "None",
        "num_gpu_blocks": cache.num_blocks,
        "prefix_caching_hash_algo": cache.algo,
    }
    info_labels = ",".join(f'{k}="{v}"' for k, v in info.items())
    out.append(
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        f'# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{{engine="0",{info_labels}}} 1.0\n'
    )
    return "".join(out)
