"""The index lag, through the public ``Router`` (docs/routing-semantics.md §2.7).

vLLM publishes KV events after the fact, so in ``exact`` mode a follow-up is often routed before
its predecessor's blocks are in the index. The blocks the router sent count on their instance
until the events confirm or evict them, or ``exact_pending_ttl_s`` passes: the follow-up stays
home with its predecessor's whole prompt as its predicted hit.
"""

from __future__ import annotations

import pytest

from smetric import Router, RouterConfig

BLOCK = 16
STAY = "follow-up: sticky"
EVICTED = "follow-up: migrate (local KV$ evicted)"


def _tokens(start: int, count: int) -> list[int]:
    return list(range(start, start + count))


def _router(**config: object) -> Router:
    return Router(
        ["a", "b", "c"], policy="smetric", block_size=BLOCK, config=RouterConfig(index_mode="exact", **config)
    )  # type: ignore[arg-type]


# Turn 1: a 40-block prompt. Its answer plus the next user message: 8 more blocks.
PROMPT = _tokens(1_000, 40 * BLOCK)
FOLLOW_UP = PROMPT + _tokens(90_000, 8 * BLOCK)


def _first_turn(router: Router, now: float) -> str:
    first = router.route(PROMPT, turn=1, now=now)
    assert first.first_turn
    return first.instance


@pytest.mark.parametrize("turn", [2, None], ids=["turn-hint", "turn-from-index"])
def test_follow_up_routed_before_its_predecessors_events_stays_home_with_the_full_hit(turn: int | None) -> None:
    router = _router()
    home = _first_turn(router, now=10.0)
    # 1 ms later, before any KV event: the predecessor's whole prompt is predicted at home.
    follow_up = router.route(FOLLOW_UP, turn=turn, now=10.001)
    assert follow_up.instance == home
    assert not follow_up.first_turn
    assert follow_up.local_hit_tokens == len(PROMPT)
    assert follow_up.reason == STAY
    # The same decision as with the events already in: the lag changes nothing.
    confirmed = _router()
    home_c = _first_turn(confirmed, now=10.0)
    confirmed.store_blocks(home_c, confirmed.hash_tokens(PROMPT), now=10.0005)
    same = confirmed.route(FOLLOW_UP, turn=turn, now=10.001)
    assert (same.local_hit_tokens, same.reason, same.first_turn) == (
        follow_up.local_hit_tokens,
        follow_up.reason,
        follow_up.first_turn,
    )


def test_without_sent_blocks_the_same_follow_up_is_taken_for_evicted() -> None:
    # What the lag did before §2.7 (and does with the bound set to 0): a 0 hit at home.
    router = _router(exact_pending_ttl_s=0.0)
    _first_turn(router, now=10.0)
    follow_up = router.route(FOLLOW_UP, turn=2, now=10.001)
    assert follow_up.local_hit_tokens == 0
    assert follow_up.reason == EVICTED


def test_events_confirm_evict_and_the_bound_expires_sent_blocks() -> None:
    router = _router()
    home = _first_turn(router, now=10.0)
    chain = router.hash_tokens(PROMPT)
    # Confirmed by the engine's events: counted once, the same hit.
    router.store_blocks(home, chain, now=10.01)
    assert dict(router.query(FOLLOW_UP, now=10.02).local)[home] == len(PROMPT)
    # Evicted by the engine (tail first): the hit shrinks at once, the sent record with it.
    router.remove_blocks(home, chain[30:])
    assert dict(router.query(FOLLOW_UP, now=10.03).local)[home] == 30 * BLOCK
    # Never confirmed: counts until exact_pending_ttl_s after the route, not after it.
    other = _router(exact_pending_ttl_s=0.5)
    home_o = _first_turn(other, now=10.0)
    assert dict(other.query(FOLLOW_UP, now=10.499).local)[home_o] == len(PROMPT)
    assert dict(other.query(FOLLOW_UP, now=10.5).local)[home_o] == 0


def test_the_bound_is_documented_once() -> None:
    assert RouterConfig().exact_pending_ttl_s == 2.0
    assert RouterConfig().to_dict()["exact_pending_ttl_s"] == 2.0
    with pytest.raises(Exception, match="exact_pending_ttl_s"):
        RouterConfig(exact_pending_ttl_s=-1.0)


# §2.7 "The answer": a short prompt with a long answer, the case the prompt alone cannot save.
# Turn 1: 10 blocks + 5 tokens; it generates 20 blocks' worth of tokens. vLLM caches the KV of
# prompt + answer but the last sampled token: (165 + 320 - 1) // 16 = 30 full blocks (480
# tokens). The follow-up repeats prompt and answer token for token and adds 4 blocks.
SHORT_PROMPT = _tokens(1_000, 10 * BLOCK + 5)
ANSWER = _tokens(50_000, 20 * BLOCK)
ANSWERED = SHORT_PROMPT + ANSWER + _tokens(90_000, 4 * BLOCK)
CACHED_BY_THE_ENGINE = (len(SHORT_PROMPT) + len(ANSWER) - 1) // BLOCK * BLOCK


@pytest.mark.parametrize("turn", [2, None], ids=["turn-hint", "turn-from-index"])
def test_follow_up_after_its_predecessor_finished_is_credited_prompt_plus_answer(turn: int | None) -> None:
    router = _router(exact_answer_credit=True)
    first = router.route(SHORT_PROMPT, turn=1, now=10.0)
    assert router.on_finished(first.request_id, len(ANSWER), now=10.5)
    # 1 ms after the answer, before any KV event of prompt or answer.
    follow_up = router.route(ANSWERED, turn=turn, now=10.501)
    assert follow_up.instance == first.instance
    assert not follow_up.first_turn
    assert follow_up.local_hit_tokens == CACHED_BY_THE_ENGINE == 480
    assert follow_up.reason == STAY
    # A sibling follow-up (the same answer, another message; the first one's own prompt is now
    # sent there too) gets the same hit once the events are in: prompt, then the answer under it.
    sibling = SHORT_PROMPT + ANSWER + _tokens(70_000, 4 * BLOCK)
    chain = router.hash_tokens(ANSWERED)
    assert dict(router.query(sibling, now=10.502).local)[first.instance] == CACHED_BY_THE_ENGINE
    router.store_blocks(first.instance, chain[:10], now=10.502)
    router.store_blocks(first.instance, chain[10:30], parent=chain[9], now=10.503)
    assert dict(router.query(sibling, now=10.504).local)[first.instance] == CACHED_BY_THE_ENGINE


def test_without_the_answer_credit_the_same_follow_up_is_taken_for_evicted() -> None:
    router = _router()  # the default: off (docs §2.7 "The answer")
    assert not RouterConfig().exact_answer_credit
    first = router.route(SHORT_PROMPT, turn=1, now=10.0)
    router.on_finished(first.request_id, len(ANSWER), now=10.5)
    # Only the prompt's 10 blocks at home: under half of 30 + 4, so the home looks evicted (where
    # the follow-up then goes is the policy's least-loaded pick, on an idle fleet any instance).
    assert dict(router.query(ANSWERED, now=10.501).local)[first.instance] == 10 * BLOCK
    follow_up = router.route(ANSWERED, turn=2, now=10.501)
    assert follow_up.reason == EVICTED


def test_the_answer_credit_ends_after_the_ttl_and_at_an_eviction() -> None:
    router = _router(exact_pending_ttl_s=1.0, exact_answer_credit=True)
    first = router.route(SHORT_PROMPT, turn=1, now=10.0)
    router.on_finished(first.request_id, len(ANSWER), now=10.5)
    home = first.instance
    chain = router.hash_tokens(ANSWERED)
    router.store_blocks(home, chain[:10], now=10.5)

    def hit(now: float) -> int:
        return dict(router.query(ANSWERED, now=now).local)[home]

    assert hit(11.499) == CACHED_BY_THE_ENGINE
    assert hit(11.5) == 10 * BLOCK  # 1 s after the finish: only what the events confirmed
    again = router.route(SHORT_PROMPT, turn=2, now=12.0)  # the same turn, retried: home again
    assert again.instance == home
    router.on_finished(again.request_id, len(ANSWER), now=12.1)
    assert hit(12.2) == CACHED_BY_THE_ENGINE
    router.remove_blocks(home, chain[9:10])  # the engine evicted the prompt's tail (the anchor)
    router.store_blocks(home, chain[9:10], parent=chain[8], now=12.3)
    assert hit(12.3) == 10 * BLOCK
