"""Measures ``answer_rerender_share``: the share of a model answer's tokens that the next turn's
prompt re-renders token for token, so that vLLM's prefix cache (which keeps the answer's blocks)
can hit them on the next turn.

For each turn k of a conversation: ``ids1`` is the engine's rendering of turn k's prompt (the
messages so far, ``add_generation_prompt``), ``answer`` the answer as the model emits it (the
tokenizer's encoding of the emitted text plus the end-of-turn id), ``ids2`` the engine's rendering
of turn k+1's prompt (the same history, the assistant message as the client sends it back, the
next user or tool message). Then

    share = clip((common_prefix(ids2, ids1 + answer) - len(ids1)) / len(answer), 0, 1)

Every rendering and encoding is the real CPU vLLM engine's own (``POST /tokenize``), for the chat
template the engine carries (the repository's test template, ``tests/data/serve/chatml_tools.jinja``)
and for any ``--template FILE`` given (sent per request; the engine runs with
``--trust-request-chat-template``). The emitted text follows the template's own assistant format
(:func:`emitted_text`); the message the client sends back is what vLLM's non-streaming chat
endpoint returns for that text: vLLM's own tool parser for the template (``hermes`` or
``qwen3_coder``) and, where the mode has one, its ``qwen3`` reasoning parser, run in the vLLM venv
by ``rerender_parse.py``.

Thinking modes: ``plain`` (the model emits no think block), ``nothink_flag``
(``chat_template_kwargs.enable_thinking=false``: the generation prompt ends with an empty think
block, the model emits the answer only), ``think_dropped`` (the model thinks, the server splits the
reasoning off and the client does not send it back: the OpenAI-compatible default),
``think_field`` (the client sends the reasoning back in the assistant message's ``reasoning``
field) and ``think_inline`` (no reasoning parser: the think block stays in the content).

Conversations are seeded agent sessions built from this repository's own text (docs paragraphs as
prose and thinking, Python sources as tool results and code answers): ``chat`` (user questions and
prose or code answers) and ``agent`` (tool definitions; each answer a short sentence and one tool
call, a tool result next, a new user message every fourth turn).

The check on the engine: for the first sessions of each (template, mode), the engine is sent
``ids1 + answer`` as a completion (the blocks it would hold after generating that answer), then the
next turn as a chat request; the ``cached_tokens`` it reports must equal the block-aligned hit the
common prefix predicts, ``min(common, len(ids2) - 1) // block * block``.

Run from the repository root (stdlib only; the engine comes from ``venv.sh``'s venv):

    nice -n 10 .venv/bin/python scripts/vllm_cpu/rerender_share.py \\
        --template qwen3=QWEN3.jinja --template qwen3_coder=QWEN3_CODER.jinja

(``--template NAME=FILE``: a model's chat template, e.g. from its ``tokenizer_config.json``; NAME
is its dialect, ``qwen3`` or ``qwen3_coder``. Model templates are inputs, not shipped here.)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fleet

ROOT = fleet.ROOT
ENGINE_TEMPLATE = ROOT / "tests" / "data" / "serve" / "chatml_tools.jinja"
MODES = ("plain", "nothink_flag", "think_dropped", "think_field", "think_inline")
KINDS = ("chat", "agent")
END_OF_TURN = "<|im_end|>"
MAX_MODEL_LEN = 8192

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "run_shell",
            "description": "Run a shell command in the repository and return its output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}, "timeout_s": {"type": "integer"}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "edit_file",
            "description": "Replace one exact snippet of a file with another.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}},
                "required": ["path", "old", "new"],
            },
        },
    },
]


# --- conversations -------------------------------------------------------------------------------


@dataclass
class Answer:
    """What the model says in one turn: its thinking, its visible text, its tool calls."""

    reasoning: str
    content: str
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


@dataclass
class Session:
    kind: str
    seed: int
    head: list[dict[str, Any]]
    """The messages before the first answer (system, first user message)."""
    turns: list[tuple[Answer, dict[str, Any]]]
    """Each answer with the message that follows it (user or tool)."""


class Corpus:
    """Prose paragraphs (``docs/*.md``) and code chunks (``python/smetric``) of this repository."""

    def __init__(self) -> None:
        self.prose: list[str] = []
        for path in sorted((ROOT / "docs").glob("*.md")):
            for para in re.split(r"\n\s*\n", path.read_text(encoding="utf-8")):
                para = para.strip()
                if 120 <= len(para) <= 900 and not para.startswith(("|", "#", "```", "    ")):
                    self.prose.append(para)
        self.code: list[tuple[str, str]] = []
        for path in sorted((ROOT / "python" / "smetric").rglob("*.py")):
            lines = path.read_text(encoding="utf-8").splitlines()
            rel = str(path.relative_to(ROOT))
            for start in range(0, max(1, len(lines) - 12), 40):
                chunk = "\n".join(lines[start : start + 14]).strip("\n")
                if len(chunk) > 200:
                    self.code.append((rel, chunk))

    def paragraph(self, rng: random.Random, cap: int = 700) -> str:
        return rng.choice(self.prose)[:cap].rstrip()

    def snippet(self, rng: random.Random) -> tuple[str, str]:
        return rng.choice(self.code)


def _agent_answer(rng: random.Random, corpus: Corpus) -> Answer:
    path, code = corpus.snippet(rng)
    content = rng.choice(["", "", corpus.paragraph(rng, 160).split(". ")[0] + "."])
    if rng.random() < 0.6:
        word = rng.choice(re.findall(r"[A-Za-z_]{5,}", code) or ["route"])
        cmd = rng.choice([f"grep -rn '{word}' python/ | head -20", f"sed -n 1,40p {path}", "pytest -q tests/ -k route"])
        call = ("run_shell", {"command": cmd, "timeout_s": 60})
    else:
        lines = code.splitlines()
        old = "\n".join(lines[:3])
        call = ("edit_file", {"path": path, "old": old, "new": old.replace("    ", "\t", 1) + "  # checked ✓"})
    return Answer(reasoning=corpus.paragraph(rng, 500), content=content, calls=[call])


def _chat_answer(rng: random.Random, corpus: Corpus) -> Answer:
    if rng.random() < 0.3:
        _, code = corpus.snippet(rng)
        content = f"{corpus.paragraph(rng, 240)}\n\n```python\n{code}\n```"
    else:
        content = "\n\n".join(corpus.paragraph(rng) for _ in range(rng.randint(1, 2)))
    return Answer(reasoning=corpus.paragraph(rng, 500), content=content)


def make_session(kind: str, seed: int, corpus: Corpus, turns: int) -> Session:
    rng = random.Random(f"{kind}-{seed}")
    head: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent working in the smetric repository."},
        {"role": "user", "content": corpus.paragraph(rng, 400) + "\nWhat should change here?"},
    ]
    out: list[tuple[Answer, dict[str, Any]]] = []
    for k in range(turns):
        if kind == "chat":
            out.append((_chat_answer(rng, corpus), {"role": "user", "content": corpus.paragraph(rng, 300)}))
        elif (k + 1) % 4 == 0:
            answer = Answer(reasoning=corpus.paragraph(rng, 500), content=corpus.paragraph(rng, 400))
            out.append((answer, {"role": "user", "content": "Good. Next: " + corpus.paragraph(rng, 200)}))
        else:
            _, result = corpus.snippet(rng)
            out.append((_agent_answer(rng, corpus), {"role": "tool", "tool_call_id": "", "content": result}))
    return Session(kind, seed, head, out)


# --- what the model emits and what the client sends back -----------------------------------------


def emitted_text(answer: Answer, mode: str, dialect: str) -> str:
    """The text the model generates after the generation prompt (without the end-of-turn token), in
    the format the template renders an assistant turn in: Hermes JSON tool calls after a newline
    when there is content (``qwen3``) or always (``chatml_tools``, the test template), or Qwen3-Coder's
    XML calls after a blank line when there is content (``qwen3_coder``)."""
    think = f"<think>\n{answer.reasoning}\n</think>\n\n" if mode.startswith("think") else ""
    text = think + answer.content
    for i, (name, args) in enumerate(answer.calls):
        if dialect == "qwen3_coder":
            text += "\n" if i else ("\n\n" if answer.content else "")
            params = "".join(
                f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n"
                for k, v in args.items()
            )
            text += f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"
        else:
            text += "\n" if dialect == "chatml_tools" or i or answer.content else ""
            text += (
                f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(args, ensure_ascii=False)}}}\n</tool_call>'
            )
    return text


class Parser:
    """``rerender_parse.py`` in the vLLM venv: vLLM's own tool and reasoning parsers."""

    def __init__(self, model: Path) -> None:
        script = Path(__file__).with_name("rerender_parse.py")
        self.proc = subprocess.Popen(
            [str(fleet.venv_python()), str(script), str(model)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"},
        )
        self._read()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("rerender_parse.py exited")
        out: dict[str, Any] = json.loads(line)
        return out

    def parse(self, text: str, **query: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"text": text, **query}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(30)


def returned_message(parsed: dict[str, Any], mode: str, call_ids: list[str]) -> dict[str, Any]:
    """The assistant message a client sends back, from vLLM's parse of the answer: the content and
    tool calls, and the reasoning in ``think_field`` mode only."""
    msg: dict[str, Any] = {"role": "assistant", "content": parsed["content"]}
    if parsed["tool_calls"]:
        msg["tool_calls"] = [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
            for cid, (name, args) in zip(call_ids, parsed["tool_calls"], strict=True)
        ]
    if mode == "think_field" and parsed["reasoning"] is not None:
        msg["reasoning"] = parsed["reasoning"]
    return msg


# --- the engine ----------------------------------------------------------------------------------


class RerenderEngine(fleet.Engine):
    """``fleet.Engine`` with request chat templates allowed and a longer context."""

    def argv(self) -> list[str]:
        argv = super().argv()
        argv[argv.index("--max-model-len") + 1] = str(MAX_MODEL_LEN)
        return [*argv, "--trust-request-chat-template"]


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            out: dict[str, Any] = json.loads(r.read())
            return out
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"{url}: {e.code} {e.read()[:500]!r}") from e


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


DIALECTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "chatml_tools": ("hermes", MODES),
    "qwen3": ("hermes", MODES),
    "qwen3_coder": ("qwen3_coder", ("plain",)),
}
"""Template dialect → vLLM's tool parser for it, and the thinking modes it has (Qwen3-Coder has none)."""
REASONING_MODES = ("nothink_flag", "think_dropped", "think_field")
"""Modes served with ``--reasoning-parser qwen3``."""


@dataclass
class Template:
    name: str
    """Its dialect too (a key of :data:`DIALECTS`)."""
    text: str | None
    """None: the engine's own (its tokenizer_config's chat_template)."""


class Renderer:
    def __init__(self, url: str, template: Template, mode: str, parser: Parser) -> None:
        self.url = url
        self.template = template
        self.mode = mode
        self.parser = parser
        self.eot: int = post(url + "/tokenize", {"model": fleet.MODEL_NAME, "prompt": END_OF_TURN})["tokens"][-1]

    def chat_fields(self, tools: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"model": fleet.MODEL_NAME}
        if tools:
            out["tools"] = TOOLS
        if self.template.text is not None:
            out["chat_template"] = self.template.text
        if self.mode == "nothink_flag":
            out["chat_template_kwargs"] = {"enable_thinking": False}
        return out

    def prompt(self, messages: list[dict[str, Any]], tools: bool) -> list[int]:
        body = {**self.chat_fields(tools), "messages": messages, "add_generation_prompt": True}
        ids: list[int] = post(self.url + "/tokenize", body)["tokens"]
        return ids

    def encode(self, text: str) -> list[int]:
        body = {"model": fleet.MODEL_NAME, "prompt": text, "add_special_tokens": False}
        ids: list[int] = post(self.url + "/tokenize", body)["tokens"]
        return ids


def measure_session(r: Renderer, s: Session, check: bool) -> list[dict[str, Any]]:
    tools = s.kind == "agent"
    messages = [dict(m) for m in s.head]
    # A tag of its own per (template, mode): the engine check must not hit another run's blocks.
    messages[0]["content"] += f" Run {r.template.name}/{r.mode}/{s.kind}/{s.seed}."
    ids1 = r.prompt(messages, tools)
    rows = []
    for k, (answer, nxt) in enumerate(s.turns):
        call_ids = [f"call_{s.seed}_{k}_{i}" for i in range(len(answer.calls))]
        text = emitted_text(answer, r.mode, r.template.name)
        answer_ids = [*r.encode(text), r.eot]
        parsed = r.parser.parse(
            text,
            tool_parser=DIALECTS[r.template.name][0],
            reasoning_parser="qwen3" if r.mode in REASONING_MODES else None,
            tools=TOOLS if tools else None,
            chat_template_kwargs=r.chat_fields(tools).get("chat_template_kwargs"),
        )
        nxt = {**nxt, "tool_call_id": call_ids[0]} if nxt["role"] == "tool" else nxt
        messages += [returned_message(parsed, r.mode, call_ids), nxt]
        ids2 = r.prompt(messages, tools)
        common = common_prefix(ids2, ids1 + answer_ids)
        kept = common - len(ids1)
        row: dict[str, Any] = {
            "kind": s.kind,
            "seed": s.seed,
            "turn": k + 1,
            "next": nxt["role"],
            "calls": len(answer.calls),
            "text": bool(answer.content),
            "prompt_tokens": len(ids1),
            "answer_tokens": len(answer_ids),
            "common_prefix": common,
            "share": min(1.0, max(0.0, kept / len(answer_ids))),
            "prompt_tokens_lost": max(0, -kept),
        }
        if check:
            row["predicted_cached"] = min(common, len(ids2) - 1) // fleet.BLOCK_SIZE * fleet.BLOCK_SIZE
            row["engine_cached"] = engine_hit(r, ids1 + answer_ids, messages, tools)
        rows.append(row)
        ids1 = ids2
    return rows


def engine_hit(r: Renderer, held: list[int], messages: list[dict[str, Any]], tools: bool) -> int:
    """Has the engine hold ``held`` (a completion of it), then sends ``messages``; its cached tokens."""
    post(r.url + "/v1/completions", {"model": fleet.MODEL_NAME, "prompt": held, "max_tokens": 1})
    body = {**r.chat_fields(tools), "messages": messages, "max_tokens": 1}
    usage = post(r.url + "/v1/chat/completions", body)["usage"]
    return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


# --- summary -------------------------------------------------------------------------------------


def quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    shares = [r["share"] for r in rows]
    answer = sum(r["answer_tokens"] for r in rows)
    kept = sum(r["share"] * r["answer_tokens"] for r in rows)
    return {
        "turns": len(rows),
        "mean": round(statistics.fmean(shares), 4),
        "token_weighted": round(kept / answer, 4),
        "p10": round(quantile(shares, 0.1), 4),
        "p50": round(quantile(shares, 0.5), 4),
        "p90": round(quantile(shares, 0.9), 4),
        "turns_losing_prompt_tokens": sum(1 for r in rows if r["prompt_tokens_lost"] > 0),
        "mean_prompt_tokens_lost": round(statistics.fmean(r["prompt_tokens_lost"] for r in rows), 1),
    }


def summary_by(rows: list[dict[str, Any]]) -> dict[str, Any]:
    groups = {
        "chat answers": lambda r: r["kind"] == "chat",
        "agent tool calls, no text before": lambda r: r["calls"] and not r["text"],
        "agent tool calls after text": lambda r: r["calls"] and r["text"],
        "agent answers, next a user message": lambda r: r["kind"] == "agent" and r["next"] == "user",
    }
    out: dict[str, Any] = {"all": summarize(rows)}
    for name, pick in groups.items():
        sel = [r for r in rows if pick(r)]
        if sel:
            out[name] = summarize(sel)
    return out


def vllm_version(venv: Path) -> str:
    out = subprocess.run(
        [str(fleet.venv_python(venv)), "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--template", action="append", default=[], help="NAME=FILE, a chat template to measure too")
    ap.add_argument("--sessions", type=int, default=12, help="sessions per kind")
    ap.add_argument("--turns", type=int, default=8, help="answers per session")
    ap.add_argument("--check-sessions", type=int, default=2, help="sessions per kind checked on the engine")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "results-data" / "answer_rerender_share.json")
    args = ap.parse_args()
    why = fleet.why_not_ready()
    if why:
        sys.exit(why)
    templates = [Template("chatml_tools", None)]
    for spec in args.template:
        name, _, path = spec.partition("=")
        if name not in DIALECTS:
            sys.exit(f"--template {spec}: NAME must be one of {', '.join(DIALECTS)}")
        templates.append(Template(name, Path(path).read_text(encoding="utf-8")))
    corpus = Corpus()
    sessions = [make_session(kind, seed, corpus, args.turns) for kind in KINDS for seed in range(args.sessions)]
    model = fleet.make_model(fleet.VENV / "models" / fleet.MODEL_NAME)
    results: dict[str, Any] = {}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rerender-") as work:
        engine = RerenderEngine(model, Path(work), core=0)
        engine.start()
        parser = Parser(model)
        try:
            engine.wait_ready()
            for t in templates:
                for mode in DIALECTS[t.name][1]:
                    r = Renderer(engine.url, t, mode, parser)
                    rows = []
                    for s in sessions:
                        rows += measure_session(r, s, check=s.seed < args.check_sessions)
                    checked = [x for x in rows if "engine_cached" in x]
                    agree = sum(1 for x in checked if x["engine_cached"] == x["predicted_cached"])
                    results.setdefault(t.name, {})[mode] = {
                        "summary": summary_by(rows),
                        "engine_check": {"turns": len(checked), "agree": agree, "rows": checked},
                        "shares": [round(x["share"], 3) for x in rows],
                    }
                    s = results[t.name][mode]["summary"]["all"]
                    print(
                        f"{t.name:14} {mode:14} mean {s['mean']:.3f} p10 {s['p10']:.3f} p50 {s['p50']:.3f} "
                        f"p90 {s['p90']:.3f} weighted {s['token_weighted']:.3f}  engine check {agree}/{len(checked)}",
                        flush=True,
                    )
        finally:
            parser.close()
            engine.stop()
    provenance = {
        "script": "scripts/vllm_cpu/rerender_share.py",
        "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip(),
        "date": time.strftime("%Y-%m-%d"),
        "vllm": f"vllm-cpu {vllm_version(fleet.VENV)}",
        "tokenizer": "tests/data/serve/tokenizer.json (byte-level BPE, 2,000 ids, ChatML and tool/think tokens)",
        "templates": {
            t.name: {
                "source": "the engine's own (tests/data/serve/chatml_tools.jinja)" if t.text is None else "--template",
                "sha256": hashlib.sha256((t.text or ENGINE_TEMPLATE.read_text(encoding="utf-8")).encode()).hexdigest(),
            }
            for t in templates
        },
        "conversations": f"{args.sessions} chat + {args.sessions} agent sessions of {args.turns} answers, seeded "
        "from this repository's docs/*.md paragraphs and python/smetric sources (make_session)",
        "block_size": fleet.BLOCK_SIZE,
        "seconds": round(time.monotonic() - t0, 1),
    }
    doc = {
        "definition": "share = clip((common_prefix(ids2, ids1 + answer_ids) - len(ids1)) / len(answer_ids), 0, 1)",
        "provenance": provenance,
        "results": results,
    }
    args.out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
