"""Short labels of the core's decision reasons: ``reason=`` of ``x-smetric-decision`` and the
``reason`` label of ``smetric_proxy_decisions_total``.

The reasons are read from the core at run time — ``Router.stats()["reasons"]`` lists every value
of its reason enum, in the enum's order — never from a list written here, so a reason added to
the core is labelled the day it appears. A reason's label, first rule that applies:

1. a reason of a load-balancing policy (the part of its name before ``": "``, with ``-`` read as
   ``_``, is one of :data:`smetric.POLICIES` other than ``smetric``): ``load-balanced``;
2. a reason with an established label (:data:`ESTABLISHED`: dashboards already use them);
3. any other: the reason's own name as a slug (lowercase letters, digits, single ``-``), e.g.
   ``"stay home: no instance can meet its TTFT budget"`` → ``stay-home-no-instance-can-meet-its-ttft-budget``.

``tests/serve/test_labels.py`` iterates the core's reasons: every one has a well-formed label,
smetric's own reasons have distinct labels, every :data:`ESTABLISHED` key is still a core reason,
and the table in ``docs/serve.md`` equals :func:`markdown_table` (``python -m smetric.serve.labels``
prints it).

Complexity: the table is built once (one ``Router.stats()`` call); a label is one dict lookup.
May import: ``smetric._core`` only.
"""

from __future__ import annotations

import functools
import re

from smetric._core import POLICIES, Router

__all__ = ["BALANCED", "ESTABLISHED", "core_reasons", "label_of", "markdown_table", "reason_label"]

BALANCED = "load-balanced"
"""The label of every decision of a load-balancing policy (all but ``smetric``)."""

ESTABLISHED: dict[str, str] = {
    "first-turn: least-loaded": "first-turn",
    "follow-up: sticky": "sticky",
    "follow-up: migrate (home overloaded)": "migrated-overload",
    "follow-up: migrate (local KV$ evicted)": "migrated-evicted",
    "follow-up: migrate (cheaper elsewhere)": "migrated-cheaper",
    # The v2 (SLO-feasibility) rule's own outcomes, short like the others.
    "follow-up: migrate (home misses TTFT budget)": "migrated-slo",
    "follow-up: sticky (no instance meets TTFT budget)": "sticky-infeasible",
    # The decode-contract mask's (the authors' shipped co-located configuration).
    "follow-up: migrate (home would break a live decode)": "migrated-unsafe",
    # The displacement guard's (`smetric_retention_s`).
    "follow-up: sticky (every target churning)": "sticky-churning",
    # The KV-bound regime's (`smetric_kv_bound_share`).
    "follow-up: sticky (fleet KV-bound)": "sticky-kv-bound",
    # The decode budget's (`smetric_tpot_budget_s`).
    "follow-up: migrate (home misses TPOT budget)": "migrated-tpot",
}
"""smetric's reasons with a short label chosen by hand (dashboards match on them); a reason missing
here still gets its slug (rule 3), so nothing is ever unlabelled."""

_BALANCING_POLICIES = frozenset(POLICIES) - {"smetric"}


def label_of(reason: str) -> str:
    """The label of ``reason`` by the rules of the module docs (any string: a reason unknown to
    this build of the core is labelled by rule 3)."""
    head = reason.split(": ", 1)[0]
    if head.replace("-", "_") in _BALANCING_POLICIES:
        return BALANCED
    established = ESTABLISHED.get(reason)
    if established is not None:
        return established
    return re.sub(r"[^a-z0-9]+", "-", reason.lower()).strip("-") or "unnamed"


@functools.cache
def core_reasons() -> tuple[str, ...]:
    """Every reason of the core's enum, in its order (read from a one-instance router's stats)."""
    return tuple(Router(["labels"]).stats()["reasons"])


@functools.cache
def _labels() -> dict[str, str]:
    return {reason: label_of(reason) for reason in core_reasons()}


def reason_label(reason: str) -> str:
    """The label of a decision's reason (one dict lookup for the core's reasons)."""
    label = _labels().get(reason)
    return label if label is not None else label_of(reason)


def markdown_table() -> str:
    """The reasons and their labels as the Markdown table ``docs/serve.md`` carries."""
    rows = ["| core reason (`detail`) | label (`reason`) |", "|---|---|"]
    rows += [f"| `{reason}` | `{label}` |" for reason, label in _labels().items()]
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
