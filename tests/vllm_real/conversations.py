"""The conversation shapes the real-engine tests send, built from seeded random words so that
sessions differ from their first block (no accidental shared prefix between sessions).

Shapes: ``plain`` (user/assistant turns), ``system`` (a system prompt first), ``tools`` (tool
definitions, assistant tool calls with arguments, tool results), ``parts`` (content as a list of
text parts). A follow-up appends the engine's own answer as the assistant message, then the next
user (or tool) message, as an agent does.
"""

from __future__ import annotations

import json
import random
from typing import Any

SHAPES = ("plain", "system", "tools", "parts")

WORDS = [
    "router",
    "cache",
    "block",
    "engine",
    "prefix",
    "session",
    "token",
    "agent",
    "replay",
    "index",
    "event",
    "scrape",
    "load",
    "migrate",
    "sticky",
    "follow",
    "turn",
    "prompt",
    "stream",
    "tool",
    "result",
    "shell",
    "grep",
    "edit",
    "patch",
    "test",
    "build",
    "commit",
    "branch",
    "file",
    "line",
    "error",
]

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
    }
]


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)) + f" #{rng.randrange(1 << 30):x}"


class Conversation:
    """One session: its messages so far and what each request needs besides them."""

    def __init__(self, shape: str, seed: int, *, first_words: int = 120, turn_words: int = 40) -> None:
        if shape not in SHAPES:
            raise ValueError(f"unknown shape {shape!r}")
        self.shape = shape
        self.rng = random.Random(seed)
        self.turn_words = turn_words
        self.key = f"{shape}-{seed}"
        self.messages: list[dict[str, Any]] = []
        if shape == "system":
            self.messages.append({"role": "system", "content": "You are a coding agent. " + text(self.rng, 60)})
        self._user(first_words)

    def _user(self, words: int) -> None:
        body = text(self.rng, words)
        if self.shape == "parts":
            half = len(body) // 2
            self.messages.append(
                {
                    "role": "user",
                    "content": [{"type": "text", "text": body[:half]}, {"type": "text", "text": body[half:]}],
                }
            )
        else:
            self.messages.append({"role": "user", "content": body})

    def extra(self) -> dict[str, Any]:
        """Request fields besides ``messages`` (the tools, for the tools shape)."""
        return {"tools": TOOLS, "tool_choice": "auto"} if self.shape == "tools" else {}

    def answer(self, content: str) -> None:
        """Appends the engine's answer and the next message (a tool call and its result for ``tools``)."""
        if self.shape == "tools":
            call_id = f"call_{self.rng.randrange(1 << 40):x}"
            args = json.dumps({"command": "grep -rn " + self.rng.choice(WORDS), "timeout_s": 30})
            self.messages.append(
                {
                    "role": "assistant",
                    "content": content,
                    "tool_calls": [
                        {"id": call_id, "type": "function", "function": {"name": "run_shell", "arguments": args}}
                    ],
                }
            )
            self.messages.append({"role": "tool", "tool_call_id": call_id, "content": text(self.rng, self.turn_words)})
        else:
            self.messages.append({"role": "assistant", "content": content})
            self._user(self.turn_words)
