"""vLLM's own output parsers as a line-oriented service, for ``rerender_share.py``.

Splits a model's full answer text into (reasoning, content, tool calls) the way vLLM's non-streaming
chat endpoint does (``Parser.parse``, the tool and reasoning parsers ``vllm serve`` composes from
``--tool-call-parser`` and ``--reasoning-parser``), so the assistant message a client sends back is
the one a real server would have returned. Runs in the vLLM venv; one JSON request per stdin line
(``text``, ``tool_parser``, ``reasoning_parser``, ``tools``, ``chat_template_kwargs``), one JSON
answer per stdout line (``reasoning``, ``content``, ``tool_calls`` as ``[name, arguments]``):

    .venv-vllm/bin/python scripts/vllm_cpu/rerender_parse.py MODEL_DIR
"""

from __future__ import annotations

import json
import sys
from typing import Any


def main(model: str) -> None:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser import ParserManager
    from vllm.tokenizers import get_tokenizer

    tokenizer = get_tokenizer(model)
    classes: dict[tuple[str | None, str | None], Any] = {}
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        q = json.loads(line)
        key = (q.get("tool_parser"), q.get("reasoning_parser"))
        if key not in classes:
            classes[key] = ParserManager.get_parser(
                tool_parser_name=key[0], reasoning_parser_name=key[1], enable_auto_tools=True, tokenizer=tokenizer
            )
        kwargs = q.get("chat_template_kwargs") or {}
        request = ChatCompletionRequest(
            model="tiny",
            messages=[{"role": "user", "content": "-"}],
            tools=q.get("tools"),
            tool_choice="auto" if q.get("tools") else None,
            chat_template_kwargs=kwargs,
        )
        parser = classes[key](tokenizer, request.tools, chat_template_kwargs=kwargs, model_config=None)
        reasoning, content, calls = parser.parse(q["text"], request, enable_auto_tools=True)
        out = {"reasoning": reasoning, "content": content, "tool_calls": [[c.name, c.arguments] for c in calls or []]}
        print(json.dumps(out, ensure_ascii=False), flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: rerender_parse.py MODEL_DIR")
    main(sys.argv[1])
