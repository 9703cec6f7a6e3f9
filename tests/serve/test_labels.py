"""Decision labels come from the core's reason enum: every reason gets a well-formed label, none
of smetric's is reported as ``load-balanced``, no two share one, and ``docs/serve.md`` carries
the table the code derives (``smetric.serve.labels``)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path

from smetric import POLICIES, Router
from smetric.serve.labels import BALANCED, ESTABLISHED, core_reasons, label_of, markdown_table, reason_label

ROOT = Path(__file__).resolve().parents[2]
WELL_FORMED = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
"""A Prometheus label value and a header token: no quoting needed anywhere."""


def of_balancing_policy(reason: str) -> bool:
    """A reason named after a policy other than smetric (``cache-first: argmax`` → ``cache_first``)."""
    return reason.split(": ", 1)[0].replace("-", "_") in set(POLICIES) - {"smetric"}


def label_problems(reasons: Iterable[str], label: Callable[[str], str]) -> list[str]:
    """What is wrong with ``label`` over ``reasons``: malformed labels, reasons left unlabelled
    (reported as ``load-balanced`` without being a balancing policy's), shared labels, and
    established labels of reasons the core no longer has."""
    reasons = list(reasons)
    problems = []
    owner: dict[str, str] = {}
    for reason in reasons:
        value = label(reason)
        if not WELL_FORMED.fullmatch(value):
            problems.append(f"{reason!r}: malformed label {value!r}")
        if value == BALANCED:
            if not of_balancing_policy(reason):
                problems.append(f"{reason!r} is unlabelled: reported as {BALANCED}")
            continue
        if value in owner:
            problems.append(f"{reason!r} and {owner[value]!r} share the label {value!r}")
        owner[value] = reason
    problems += [f"stale established label for {r!r}" for r in sorted(set(ESTABLISHED) - set(reasons))]
    return problems


def test_every_core_reason_has_its_own_label() -> None:
    reasons = core_reasons()
    assert len(reasons) >= 13 and "follow-up: migrate (cheaper elsewhere)" in reasons
    assert label_problems(reasons, reason_label) == []
    assert reason_label("follow-up: migrate (cheaper elsewhere)") == "migrated-cheaper"  # was load-balanced


def test_the_check_sees_an_unlabelled_reason() -> None:
    # Negative control: the hand-written map the proxy had (smetric's four labels, everything else
    # load-balanced) fails on today's default migration reason and on a reason added later.
    old_map = {k: v for k, v in ESTABLISHED.items() if k != "follow-up: migrate (cheaper elsewhere)"}
    added = "stay home: no instance can meet its TTFT budget"
    problems = label_problems([*core_reasons(), added], lambda r: old_map.get(r, BALANCED))
    smetric_reasons = [r for r in core_reasons() if not of_balancing_policy(r)]
    missed = [r for r in smetric_reasons if r not in old_map]
    assert "follow-up: migrate (cheaper elsewhere)" in missed
    assert problems == [f"{r!r} is unlabelled: reported as load-balanced" for r in [*missed, added]]
    assert label_problems(["follow-up: a", "follow-up: b"], lambda _: "follow-up") == [
        "'follow-up: b' and 'follow-up: a' share the label 'follow-up'",
        *[f"stale established label for {r!r}" for r in sorted(ESTABLISHED)],
    ]
    # A reason the core gains is labelled by its name, not folded into another label.
    assert label_of(added) == "stay-home-no-instance-can-meet-its-ttft-budget"
    assert label_problems([*core_reasons(), added], reason_label) == []


def test_decisions_carry_the_label_of_their_reason() -> None:
    # The reasons a live router reports are the enum's: a first turn and a sticky follow-up.
    router = Router(["a", "b"], policy="smetric", block_size=4)
    first = router.route(list(range(64)), turn=1)
    router.on_finished(first.request_id, 1)
    follow = router.route(list(range(80)), turn=2)
    assert (reason_label(first.reason), reason_label(follow.reason)) == ("first-turn", "sticky")
    balanced = Router(["a", "b"], policy="round_robin", block_size=4).route(list(range(8)))
    assert reason_label(balanced.reason) == BALANCED


def test_the_docs_table_is_the_derived_one() -> None:
    text = (ROOT / "docs" / "serve.md").read_text()
    match = re.search(r"<!-- reason-labels:begin[^>]*-->\n(.*?)<!-- reason-labels:end -->", text, re.S)
    assert match is not None, "docs/serve.md lost its reason-labels table"
    assert match.group(1) == markdown_table(), "regenerate it: python -m smetric.serve.labels"
