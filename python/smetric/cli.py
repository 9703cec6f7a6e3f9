"""The ``smetric`` command line.

``smetric simulate`` (the main job) replays an agent trace on a simulated vLLM cluster with
every policy and compares them; ``smetric sweep`` runs load × policy × seed grids (both in
:mod:`smetric.sim.commands`).

``smetric toy-fleet`` routes a synthetic agent fleet (sessions sharing a system prompt, a toy
service model instead of simulated vLLM engines) through every policy, prints the decisions of
one session, and a table of where first turns landed, how many follow-ups went home and whether
turn inference was right. (``make demo`` is ``smetric simulate``, not this.)

``smetric serve`` and ``smetric fake-engine`` are in :mod:`smetric.serve.cli` and
:mod:`smetric.fake_engine.cli`.

Each command needs only its own extra (``sim``, ``serve``, ``fake-engine``): building the parser
imports no optional package, and a command's modules are imported only when that command is the
one chosen — ``simulate``'s and ``sweep``'s arguments are added only then, since they are built
from the simulator's defaults. A command whose extra is missing prints the
:class:`~smetric.errors.MissingExtraError` (which names the extra) and exits with status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from smetric import Decision, __version__
from smetric.errors import MissingExtraError, UnknownPolicyError
from smetric.fake_engine import cli as fake_engine_cli
from smetric.serve import cli as serve_cli

if TYPE_CHECKING:
    from smetric.toy_fleet import FleetReport

SIM_COMMANDS = {
    "simulate": "replay a trace on a simulated vLLM cluster and compare policies",
    "sweep": "load x policy x seed grid in parallel: peak TPS under SLO per policy",
}
"""The simulator's commands (:mod:`smetric.sim.commands` adds their arguments), with their help."""


def _missing_extra(command: str, error: MissingExtraError) -> int:
    print(f"smetric {command}: {error}", file=sys.stderr)
    return 2


def _toy_fleet(args: argparse.Namespace) -> int:
    try:
        from smetric.sim.config import policy_router
        from smetric.toy_fleet import SessionWorkload, run_fleet
    except MissingExtraError as e:
        return _missing_extra("toy-fleet", e)
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
    argv = list(sys.argv[1:] if argv is None else argv)
    # The top-level parser has no option that takes a value, so the first bare word is the command.
    chosen = next((a for a in argv if not a.startswith("-")), None)
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
    for name, help_text in SIM_COMMANDS.items():
        command = sub.add_parser(name, help=help_text)
        if name == chosen:
            try:
                from smetric.sim import commands as sim_commands
            except MissingExtraError as e:
                return _missing_extra(name, e)
            sim_commands.configure(name, command)
    fake_engine_cli.register(sub)
    serve_cli.register(sub)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
