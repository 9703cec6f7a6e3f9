"""Embedding smetric in an existing Python router (README, "Use it from Python").

One agent session of two turns goes through a :class:`smetric.Router` over two instances:
the first turn is placed for load, the follow-up (the whole history plus a tool result) goes
where the first turn's KV$ lives. ``send_to`` stands in for your HTTP client and only records
where each request went. Needs nothing but the ``smetric-router`` wheel (no numpy: token ids
may be a list, or any int32/uint32/int64 buffer such as a numpy array or ``array.array``).

    python examples/embed.py
"""

from __future__ import annotations

from smetric import Decision, Router, RouterConfig

INSTANCES = ["http://gpu-0:8000", "http://gpu-1:8000"]

sent: list[tuple[str, int]] = []
"""(instance, prompt length) of every request ``send_to`` was given."""


def send_to(instance: str, prompt_token_ids: list[int]) -> int:
    """Stand-in for the HTTP call to a vLLM instance: records it, returns the output length."""
    sent.append((instance, len(prompt_token_ids)))
    return 32


def serve(router: Router, prompt_token_ids: list[int], chat_messages: list[dict[str, str]]) -> Decision:
    """Routes one request and reports its lifecycle back to the router."""
    decision = router.route(prompt_token_ids, messages=chat_messages)
    n = send_to(decision.instance, prompt_token_ids)  # your HTTP client
    router.on_prefilled(decision.request_id)  # first token came back
    router.on_finished(decision.request_id, output_tokens=n)
    return decision


def main() -> list[Decision]:
    # index_mode="approximate": the index learns from the router's own decisions; "exact" when
    # smetric.events feeds it every engine's KV-cache events (README, "Wire it to a vLLM fleet").
    # block_size: the engines' --block-size (vLLM's default on GPUs is 16; its CPU backend needs 32).
    router = Router(INSTANCES, policy="smetric", block_size=16, config=RouterConfig(index_mode="approximate"))

    # Token ids as a tokenizer returns them; made up here, long enough for a few KV blocks. A
    # turn adds little to the history it re-sends (here 32 of 160 tokens): smetric's v2 rule
    # takes a home holding no more than half the prompt for evicted.
    system, user = (list(range(start, start + 64)) for start in (1000, 2000))
    assistant, tool = (list(range(start, start + 16)) for start in (3000, 4000))
    chat: list[dict[str, str]] = [{"role": "system", "content": "…"}, {"role": "user", "content": "…"}]
    first = serve(router, system + user, chat)
    chat += [{"role": "assistant", "content": "…"}, {"role": "tool", "content": "…"}]
    follow_up = serve(router, system + user + assistant + tool, chat)

    for name, d in (("first turn", first), ("follow-up", follow_up)):
        print(
            f"{name:<10} -> {d.instance}  first_turn={d.first_turn} ({d.turn_source})  "
            f"local_hit={d.local_hit_tokens} prefill={d.prefill_tokens}  {d.reason}"
        )
    return [first, follow_up]


if __name__ == "__main__":
    first, follow_up = main()
    assert [instance for instance, _ in sent] == [first.instance, follow_up.instance]
    assert first.first_turn and not follow_up.first_turn
    assert follow_up.instance == first.instance, "the follow-up goes where its KV$ is"
    print(f"sent {len(sent)} requests; the session stayed on {first.instance}")
