"""The ``smetric`` command line.

``smetric simulate`` (the main job) replays an agent trace on a simulated vLLM cluster with
every policy and compares them; ``smetric sweep`` runs load × policy × seed grids (both in
:mod:`smetric.sim.commands`).

``smetric toy-fleet`` routes a synthetic agent fleet (sessions sharing a system prompt, a toy
service model instead of simulated vLLM engines) through every policy, prints the decisions of
one session, and a table of where first turns landed, how many follow-ups went home and whether
turn inference was right. (``make demo`` is ``smetric simulate``, not this.)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from smetric import Decision, __version__
from smetric.errors import UnknownPolicyError
from smetric.fake_engine import cli as fake_engine_cli
from smetric.serve import cli as serve_cli
from smetric.sim import commands as sim_commands
from smetric.sim.config import policy_router
from smetric.toy_fleet import FleetReport, SessionWorkload, run_fleet


def _toy_fleet(args: argparse.Namespace) -> int:
    workload = SessionWorkload(sessions=args.sessions)
    print(
        f"smetric {__version__} toy fleet: {args.sessions} agent sessions of "
        f"{workload.min_turns}-{workload.max_turns} turns sharing a {workload.system_prompt_tokens}-token "
        f"system prompt, {args.instances} instances\n"
    )
    shown = 0

    def show(session: int, n: int, d: Decision) -> None:
        nonlocal shown
        if session == args.show_session and shown < args.show:
            shown += 1
            print(
                f"  session {session} request {n:>6}: -> {d.instance:<6} first_turn={d.first_turn!s:<5} "
                f"local_hit={d.local_hit_tokens:>6} global_hit={d.global_hit_tokens:>6} "
                f"prefill={d.prefill_tokens:>5}  {d.reason}"
            )

    reports: list[FleetReport] = []
    for policy in args.policies.split(","):
        try:
            name, config = policy_router(policy)
        except UnknownPolicyError as e:
            print(e, file=sys.stderr)
            return 2
        shown = 0
        print(f"[{policy}] decisions of session {args.show_session}:")
        report = run_fleet(
            name, instances=args.instances, workload=workload, seed=args.seed, config=config, on_decision=show
        )
        report.policy = policy
        reports.append(report)
        print()

    header = f"{'policy':<20} {'requests':>8} {'first-turn spread':>17} {'follow-ups home':>15} {'turn acc.':>9}"
    print(header)
    print("-" * len(header))
    for r in reports:
        print(
            f"{r.policy:<20} {r.requests:>8} {r.first_turn_spread:>17.2f} {r.follow_up_return:>15.1%} "
            f"{r.turn_accuracy:>9.1%}"
        )
    print("\nfirst-turn spread = busiest / idlest instance by first turns (inf: some instance got none)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``smetric`` command."""
    parser = argparse.ArgumentParser(prog="smetric", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"smetric {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    toy = sub.add_parser(
        "toy-fleet", help="route a synthetic agent fleet (toy service model) through every policy and compare"
    )
    toy.add_argument("--sessions", type=int, default=300)
    toy.add_argument("--instances", type=int, default=8)
    toy.add_argument("--policies", default="round_robin,least_load,cache_first,cache_first_max_hit,lmetric,smetric")
    toy.add_argument("--seed", type=int, default=0)
    toy.add_argument("--show-session", type=int, default=7, help="print the decisions of this session")
    toy.add_argument("--show", type=int, default=6, help="how many of its decisions to print")
    toy.set_defaults(func=_toy_fleet)
    sim_commands.register(sub)
    fake_engine_cli.register(sub)
    serve_cli.register(sub)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
