"""The layering of ``docs/architecture.md``, checked from the crates' manifests and the Python
sources (parsed, never imported): dependencies point down only.

* Rust: every crate under ``rust/`` has a layer; a crate may depend only on crates of lower
  layers (so no cycles, nothing upward); ``smetric-core`` depends on no smetric crate and not
  on pyo3; ``smetric-py`` is the only crate that depends on pyo3. A crate cannot ``use`` what
  its manifest does not list, so the manifests are enough. Inside ``smetric-vllm``, the msgpack
  reader imports nothing of ``events``. Inside every crate, the top-level modules form no cycle
  (read from ``crate::`` paths), and the simulator keeps its PD shapes apart: settings in
  ``config``, report in ``metrics``, model in ``cluster``, placers in ``placers``.
* Python: ``smetric.reference`` (the differential test's oracle) imports nothing of
  ``smetric``; the package never imports the reference; only the CLI imports ``smetric.sim``
  and ``smetric.cli``; no two modules import each other, directly or around a loop. Inside
  ``smetric.serve`` the modules are layered along a request's path (:data:`SERVE_LAYERS`) and
  only the app picks a concrete backend or API adapter.

Each checker also gets a negative control on a made-up violation, so a checker that silently
stopped seeing dependencies would fail too.
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYTHON = ROOT / "python"
PACKAGE = PYTHON / "smetric"

LAYERS = {"smetric-core": 1, "smetric-vllm": 2, "smetric-sim": 3, "smetric-gateway": 3, "smetric-py": 4}
"""Lower layers may be depended on by higher ones, never the reverse."""
PYO3_CRATES = {"smetric-py"}
DEPENDENCY_TABLES = ("dependencies", "dev-dependencies", "build-dependencies")


def dependencies(manifest: dict[str, Any]) -> set[str]:
    """Names of every crate a manifest depends on, in any table (target-specific ones too),
    under their real names (``package = ...`` renames included)."""
    tables: list[dict[str, Any]] = [manifest.get(t, {}) for t in DEPENDENCY_TABLES]
    for target in manifest.get("target", {}).values():
        tables.extend(target.get(t, {}) for t in DEPENDENCY_TABLES)
    names = set()
    for table in tables:
        for key, spec in table.items():
            names.add(spec.get("package", key) if isinstance(spec, dict) else key)
    return names


def crates() -> dict[str, set[str]]:
    """Crate name → its dependencies, for every ``rust/*/Cargo.toml``."""
    out = {}
    for path in sorted((ROOT / "rust").glob("*/Cargo.toml")):
        manifest = tomllib.loads(path.read_text())
        out[manifest["package"]["name"]] = dependencies(manifest)
    return out


def layering_violations(graph: dict[str, set[str]]) -> list[str]:
    problems = []
    for crate, deps in sorted(graph.items()):
        if crate not in LAYERS:
            problems.append(f"{crate} has no layer in LAYERS (and docs/architecture.md)")
            continue
        for dep in sorted(deps & LAYERS.keys()):
            if LAYERS[dep] >= LAYERS[crate]:
                problems.append(f"{crate} (layer {LAYERS[crate]}) depends on {dep} (layer {LAYERS[dep]})")
    return problems


def pyo3_users(graph: dict[str, set[str]]) -> set[str]:
    return {crate for crate, deps in graph.items() if any(d == "pyo3" or d.startswith("pyo3-") for d in deps)}


def test_every_crate_has_a_layer_and_depends_only_downwards() -> None:
    graph = crates()
    assert set(graph) == set(LAYERS), "a crate was added or removed: place it in LAYERS and docs/architecture.md"
    assert layering_violations(graph) == []


def test_the_core_imports_neither_the_vllm_crate_nor_the_simulator_nor_pyo3() -> None:
    graph = crates()
    assert not graph["smetric-core"] & {"smetric-vllm", "smetric-sim", "smetric-py"}, graph["smetric-core"]
    assert "smetric-core" not in pyo3_users(graph)


def test_only_the_bindings_depend_on_pyo3() -> None:
    assert pyo3_users(crates()) == PYO3_CRATES


def test_the_crate_checks_see_violations() -> None:
    manifest = tomllib.loads(
        """
        [package]
        name = "smetric-core"
        [dependencies]
        renamed = { package = "smetric-sim", path = "../smetric-sim" }
        [target.'cfg(unix)'.dev-dependencies]
        pyo3 = "0.30"
        """
    )
    graph = {"smetric-core": dependencies(manifest), "smetric-new": set()}
    assert layering_violations(graph) == [
        "smetric-core (layer 1) depends on smetric-sim (layer 3)",
        "smetric-new has no layer in LAYERS (and docs/architecture.md)",
    ]
    assert pyo3_users(graph) == {"smetric-core"}


def test_the_msgpack_reader_knows_no_event_types() -> None:
    # Inside smetric-vllm the reader sits below `events`: events build on it, never the reverse.
    source = (ROOT / "rust" / "smetric-vllm" / "src" / "msgpack.rs").read_text()
    code = [line for line in source.splitlines() if not line.lstrip().startswith("//")]
    assert not [line for line in code if re.search(r"\bevents\s*::|\{[^}]*\bevents\b", line)]


def module_name(path: Path) -> str:
    parts = path.relative_to(PYTHON).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(source: str, module: str, is_package: bool) -> set[str]:
    """Every module a source file imports, absolute; relative imports resolved against
    ``module`` (``from . import x`` yields both the package and ``package.x``)."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module or ""
            else:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - (node.level - 1)])
                if node.module:
                    base = f"{base}.{node.module}" if base else node.module
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def package_imports() -> dict[str, set[str]]:
    """Module name → what it imports, for every module of ``python/smetric``."""
    return {
        module_name(path): imports(path.read_text(), module_name(path), path.name == "__init__.py")
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def importers(graph: dict[str, set[str]], target: str) -> set[str]:
    return {m for m, found in graph.items() if not within(m, target) and any(within(i, target) for i in found)}


def reference_leaks(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """What modules of ``smetric.reference`` import from ``smetric`` outside the reference."""
    leaks = {}
    for m, found in graph.items():
        if within(m, "smetric.reference"):
            bad = {i for i in found if within(i, "smetric") and not within(i, "smetric.reference")}
            if bad:
                leaks[m] = bad
    return leaks


def test_the_reference_imports_nothing_of_smetric() -> None:
    graph = package_imports()
    assert any(within(m, "smetric.reference") for m in graph), "the reference moved: update this test"
    assert reference_leaks(graph) == {}


def test_the_package_never_imports_the_reference() -> None:
    assert importers(package_imports(), "smetric.reference") == set()


@pytest.mark.parametrize(
    ("target", "allowed"),
    [("smetric.sim", {"smetric.cli"}), ("smetric.cli", {"smetric.__main__"})],
)
def test_only_the_cli_imports_the_simulator_layer(target: str, allowed: Iterable[str]) -> None:
    assert importers(package_imports(), target) <= set(allowed)


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("smetric.serve", {"smetric.sim", "smetric.fake_engine"}),
        ("smetric.fake_engine", {"smetric.sim", "smetric.serve"}),
    ],
)
def test_the_proxy_and_the_fake_engine_stay_apart_and_off_the_simulator(package: str, forbidden: set[str]) -> None:
    graph = package_imports()
    bad = {
        module: {t for t in targets if any(within(t, f) for f in forbidden)}
        for module, targets in graph.items()
        if within(module, package)
    }
    assert not {m: t for m, t in bad.items() if t}, bad


def test_nothing_outside_the_integrations_imports_them() -> None:
    # The router library never loads a serving framework; the frameworks load smetric.
    graph = package_imports()
    assert any(within(m, "smetric.integrations") for m in graph), "the integrations moved: update this test"
    assert importers(graph, "smetric.integrations") == set()


def test_the_import_checks_see_violations() -> None:
    # A relative import climbing out of the reference is still an import of smetric._core.
    graph = {
        "smetric.reference.router": imports(
            "from .. import _core\nfrom .index import KvIndex", "smetric.reference.router", False
        ),
        "smetric.reference": imports("import smetric.errors", "smetric.reference", True),
        "smetric.events": imports("from smetric.sim.config import SLO", "smetric.events", False),
    }
    assert reference_leaks(graph) == {
        "smetric.reference.router": {"smetric", "smetric._core"},
        "smetric.reference": {"smetric.errors"},
    }
    assert importers(graph, "smetric.sim") == {"smetric.events"}
    assert "smetric.reference.index" in graph["smetric.reference.router"]


# -- cycles ---------------------------------------------------------------------------------------

RUST_PATH = re.compile(r"\b(crate|super)::(?:\{([^}]*)\}|([a-z_][a-z0-9_]*))")


def rust_module_uses(source: str, top_level: bool) -> set[str]:
    """The crate-level modules a Rust file names, by ``crate::m`` (or ``super::m`` in a file at
    the crate's top, where ``super`` is the crate root), in ``use`` groups too. Comments and the
    test module (from ``#[cfg(test)]`` on) are left out: a doc link or a test's helper is not a
    dependency of the module's code."""
    code = "\n".join(
        line for line in source.split("#[cfg(test)]", 1)[0].splitlines() if not line.lstrip().startswith("//")
    )
    out: set[str] = set()
    for m in RUST_PATH.finditer(code):
        if m.group(1) == "super" and not top_level:
            continue  # a sibling inside the same top-level module
        names = [m.group(3)] if m.group(3) else re.findall(r"(?:^|,)\s*([a-z_][a-z0-9_]*)", m.group(2))
        out.update(names)
    return out


def rust_module_graph(src: Path) -> dict[str, set[str]]:
    """Top-level module → the other top-level modules its files use (the crate root, which only
    declares and re-exports, is not a node)."""
    modules = {p.stem for p in src.glob("*.rs")} | {p.name for p in src.iterdir() if p.is_dir()}
    modules -= {"lib", "main"}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for path in src.rglob("*.rs"):
        rel = path.relative_to(src)
        top = rel.parts[0].removesuffix(".rs")
        if top not in graph:
            continue
        uses = rust_module_uses(path.read_text(), top_level=len(rel.parts) == 1)
        graph[top] |= (uses & modules) - {top}
    return graph


# -- inside smetric.serve: the rooms along a request's path (docs/architecture.md) ----------------

SERVE_LAYERS: dict[str, int] = {
    # the package's docstring, and what needs nothing of the proxy
    "": 0,
    "errors": 0,
    "session": 0,
    "attempt": 0,
    "pinning": 0,
    "labels": 0,
    "chat_template": 0,
    "piecewise": 0,
    "telemetry": 0,
    "http_guard": 0,
    "replica_bus": 0,
    "request": 1,
    "admission": 1,
    "decision_log": 1,
    "tokens": 2,
    "upstream": 2,
    "config": 3,
    # one adapter per API
    "apis.base": 4,
    "apis.openai": 5,
    "apis.chat": 6,
    "apis.completions": 6,
    "apis.messages": 6,
    "apis.responses": 5,
    "apis.passthrough": 5,
    "apis": 7,
    # the relay, the fleet, then the backends behind one interface
    "relay": 8,
    "fleet": 8,
    "auth": 8,
    "backends.base": 9,
    "backends.colocated": 10,
    "backends.pd": 10,
    "backends": 11,
    # the attempt loop, the compiled data plane's link, the app, the command
    "failover": 12,
    "compiled": 12,
    "proxy": 13,
    "cli": 14,
}
"""Module of ``smetric.serve`` (relative name) → its layer: a module imports only lower layers."""

CHOSEN_ONLY_BY = {
    "smetric.serve.backends.colocated": {"smetric.serve.backends"},
    "smetric.serve.backends.pd": {"smetric.serve.backends"},
    "smetric.serve.backends": {"smetric.serve.proxy"},
    "smetric.serve.apis.chat": {"smetric.serve.apis"},
    "smetric.serve.apis.completions": {"smetric.serve.apis"},
    "smetric.serve.apis.messages": {"smetric.serve.apis"},
    "smetric.serve.apis.responses": {"smetric.serve.apis"},
    "smetric.serve.apis.passthrough": {"smetric.serve.apis"},
    "smetric.serve.apis": {"smetric.serve.proxy"},
}
"""Concrete backends and adapters are picked in one place (the app); everything else sees only
their interfaces (``backends.base``, ``apis.base``), so the data plane never branches on a mode or
an API."""


def within_graph(graph: dict[str, set[str]], package: str) -> dict[str, set[str]]:
    """The import graph restricted to ``package``'s modules (edges between them only)."""
    nodes = {m for m in graph if within(m, package)}
    return {m: {t for t in graph[m] if t in nodes and t != m} for m in nodes}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph``: its strongly connected components of more than one module
    (Tarjan's algorithm, iterative; O(modules + imports)), each sorted, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def serve_layer_violations(graph: dict[str, set[str]], layers: dict[str, int]) -> list[str]:
    def rel(m: str) -> str:
        return m.removeprefix("smetric.serve").removeprefix(".")

    problems = []
    for module, targets in sorted(graph.items()):
        if rel(module) not in layers:
            problems.append(f"{module} has no layer in SERVE_LAYERS (and docs/architecture.md)")
            continue
        for target in sorted(targets):
            if rel(target) in layers and layers[rel(target)] >= layers[rel(module)]:
                problems.append(
                    f"{module} (layer {layers[rel(module)]}) imports {target} (layer {layers[rel(target)]})"
                )
    return problems


def test_serve_has_no_import_cycle() -> None:
    serve = within_graph(package_imports(), "smetric.serve")
    assert "smetric.serve.failover" in serve, "the proxy moved: update this test"
    assert cycles(serve) == []


def test_serve_modules_import_only_lower_rooms() -> None:
    serve = within_graph(package_imports(), "smetric.serve")
    assert serve_layer_violations(serve, SERVE_LAYERS) == []
    assert {f"smetric.serve.{m}".rstrip(".") for m in SERVE_LAYERS} == set(serve), "a module was removed"


@pytest.mark.parametrize(("target", "allowed"), sorted(CHOSEN_ONLY_BY.items()))
def test_concrete_backends_and_apis_are_chosen_only_by_the_app(target: str, allowed: set[str]) -> None:
    graph = within_graph(package_imports(), "smetric.serve")
    assert target in graph
    assert {m for m, found in graph.items() if target in found} <= allowed


def test_the_serve_checks_see_cycles_and_upward_imports() -> None:
    # The proxy <-> disagg cycle this split removed, and a longer one through a relay.
    old = {
        "smetric.serve.proxy": {"smetric.serve.disagg", "smetric.serve.config"},
        "smetric.serve.disagg": {"smetric.serve.proxy"},
        "smetric.serve.config": set(),
        "smetric.serve.a": {"smetric.serve.b"},
        "smetric.serve.b": {"smetric.serve.c"},
        "smetric.serve.c": {"smetric.serve.a"},
    }
    assert cycles(old) == [
        ["smetric.serve.a", "smetric.serve.b", "smetric.serve.c"],
        ["smetric.serve.disagg", "smetric.serve.proxy"],
    ]
    graph = within_graph(
        {
            "smetric.serve.relay": imports("from .backends.pd import PdBackend", "smetric.serve.relay", False),
            "smetric.serve.backends.pd": set(),
            "smetric.serve.new": set(),
        },
        "smetric.serve",
    )
    assert cycles(graph) == []
    assert serve_layer_violations(graph, SERVE_LAYERS) == [
        "smetric.serve.new has no layer in SERVE_LAYERS (and docs/architecture.md)",
        "smetric.serve.relay (layer 8) imports smetric.serve.backends.pd (layer 10)",
    ]


@pytest.mark.parametrize("crate", sorted(LAYERS))
def test_no_crate_has_a_module_cycle(crate: str) -> None:
    graph = rust_module_graph(ROOT / "rust" / crate / "src")
    assert sum(len(v) for v in graph.values()) > 0, "the scan sees no module use: the checker is broken"
    assert cycles(graph) == []


def test_the_simulator_is_layered_config_then_metrics_then_the_cluster() -> None:
    # The PD shapes: its settings in `config`, its report in `metrics`, its model in `cluster`;
    # the placers in their own folder, above the seam and below nothing of the event loop.
    graph = rust_module_graph(ROOT / "rust" / "smetric-sim" / "src")
    assert "pd" not in graph and "core_placer" not in graph and "pd_placer" not in graph
    assert "metrics" not in graph["config"] and "cluster" not in graph["metrics"]
    assert "placement" in graph["placers"] and "cluster" not in graph["placers"]


def test_no_python_import_cycle() -> None:
    graph = package_imports()
    # A package's `__init__` importing its own submodules, and those importing names from the
    # package, is how Python packages re-export: it is not counted as a cycle; an import
    # between two modules that are not parent and child is.
    edges = {m: {d for d in deps if d in graph and not within(m, d) and not within(d, m)} for m, deps in graph.items()}
    assert cycles(edges) == []


def test_the_cycle_checks_see_cycles() -> None:
    # Negative controls: the simulator's old config → pd → metrics → config cycle, parsed from
    # source text as the real files are, and a Python pair importing each other.
    sources = {
        "config": "use crate::error::Result;\npub pd: Option<crate::pd::PdSimConfig>,",
        "pd": "use crate::config::DEFAULT_PCIE_BYTES_PER_S;\nuse crate::{error::SimError, metrics::Percentiles};",
        "metrics": "use crate::config::{SimConfig, SloConfig};\n/// [`crate::cluster`] is a doc link\n",
        "cluster": "use super::{Kind, Sim};\n#[cfg(test)]\nmod tests { use crate::cluster::x; use crate::pd::y; }",
        "error": "",
    }
    graph = {m: (rust_module_uses(s, top_level=True) & set(sources)) - {m} for m, s in sources.items()}
    assert graph["cluster"] == set() and graph["metrics"] == {"config"}
    assert cycles(graph) == [["config", "metrics", "pd"]]
    python = {"smetric.a": {"smetric.b"}, "smetric.b": {"smetric.a"}, "smetric.c": {"smetric.a"}}
    assert cycles(python) == [["smetric.a", "smetric.b"]]


# -- the facts docs/architecture.md states (its "Facts this page states, checked" table) ---------


def _stated_facts(text: str) -> dict[str, str]:
    """``fact -> stated`` from the table under "Facts this page states, checked"."""
    section = text.split("### Facts this page states, checked", 1)[1].split("\n## ", 1)[0]
    facts = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] not in ("fact", "---"):
            facts[cells[0]] = cells[1]
    return facts


def _names(stated: str) -> list[str]:
    return re.findall(r"`([^`]+)`", stated)


def _fact_problems(text: str, root: Path) -> list[str]:
    """Every stated fact that the code contradicts (or that no check knows)."""
    policy = (root / "rust/smetric-core/src/policy/mod.rs").read_text()
    router = (root / "rust/smetric-core/src/router/mod.rs").read_text()
    request = (root / "rust/smetric-core/src/router/request.rs").read_text()
    serve_config = (root / "python/smetric/serve/config.py").read_text()

    def count(kind: str) -> str:
        found = re.search(rf"pub const ALL: \[{kind}; (\d+)\]", policy)
        return found.group(1) if found else "?"

    def field(name: str) -> str:
        found = re.search(rf"^\s*{name}: (.+),$", router, re.MULTILINE)
        return found.group(1) if found else "?"

    unsafe_sites = sorted(
        str(path.relative_to(root))
        for path in (root / "rust").glob("*/src/**/*.rs")
        if "allow(unsafe_code)" in path.read_text()
    )
    tiers = re.search(r"pub enum Tier \{(.*?)\n\}", request, re.DOTALL)
    removed = re.search(r"^REMOVED_SETTINGS = \{(.*?)\n\}", serve_config, re.MULTILINE | re.DOTALL)
    actual = {
        "policies": count("PolicyKind"),
        "decision reasons": count("Reason"),
        "the index's lock": f"`{field('index')}`",
        "the decision lock": "none" if field("decisions") == "?" else f"`{field('decisions')}`",
        "the in-flight table": f"`{field('requests')}`",
        "the fleet": f"`{field('fleet')}`",
        "index tiers": ", ".join(
            f"`{v}`" for v in re.findall(r"^    (\w+),$", tiers.group(1) if tiers else "", re.MULTILINE)
        ),
        "files allowed `unsafe` (the workspace denies it)": ", ".join(f"`{p}`" for p in unsafe_sites),
        "settings of `smetric serve` removed": ", ".join(
            f"`{v}`" for v in re.findall(r'^    "(\w+)":', removed.group(1) if removed else "", re.MULTILINE)
        ),
    }
    problems = []
    stated = _stated_facts(text)
    for fact, value in stated.items():
        if fact not in actual:
            problems.append(f"no check for the stated fact {fact!r}")
        elif value != actual[fact]:
            problems.append(f"{fact}: the page says {value}, the code {actual[fact]}")
    problems += [f"the page no longer states {fact!r}" for fact in actual if fact not in stated]
    return problems


def test_the_facts_architecture_states_hold() -> None:
    text = (ROOT / "docs/architecture.md").read_text()
    assert _fact_problems(text, ROOT) == []


def test_the_fact_check_sees_drift() -> None:
    """Negative control: a page that states 7 policies, an index mutex and one unsafe file fails the check."""
    text = (ROOT / "docs/architecture.md").read_text()
    drifted = (
        text.replace("| policies | 17 |", "| policies | 7 |")
        .replace("| `RwLock<KvIndex>` |", "| `Mutex<KvIndex>` |")
        .replace("`rust/smetric-core/src/prefetch.rs`, `rust/smetric-py", "`rust/smetric-py")
    )
    problems = _fact_problems(drifted, ROOT)
    assert any(p.startswith("policies: the page says 7") for p in problems), problems
    assert any(p.startswith("the index's lock: the page says `Mutex<KvIndex>`") for p in problems), problems
    assert any(p.startswith("files allowed `unsafe`") for p in problems), problems


# -- the constants both planes share are defined once, in the gateway (issue 32 item 3) ----------


def _shared_values() -> tuple[set[object], list[set[object]]]:
    import smetric._core as core

    scalars: set[object] = set()
    tuples: list[set[object]] = []
    for name in dir(core):
        if name.startswith("SHARED_"):
            value = getattr(core, name)
            if isinstance(value, (str, bytes)):
                scalars.add(value)
            elif isinstance(value, tuple):
                tuples.append(set(value))
    return scalars, tuples


def _redefinitions(source: str, where: str) -> list[str]:
    """Module-level assignments in ``source`` of a shared string or bytes value, or of a tuple
    holding exactly a shared tuple's values: a copy of ``rust/smetric-gateway/src/shared.rs``."""
    scalars, tuples = _shared_values()
    out = []
    for node in ast.parse(source).body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if isinstance(value, ast.Constant) and value.value in scalars:
            out.append(f"{where}:{node.lineno} redefines {value.value!r}")
        # A literal tuple, list or set, or one wrapped in frozenset()/set()/tuple(): a copy when
        # it holds every value of a shared tuple (a superset: a copy with an addition of its own).
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and len(value.args) == 1:
            value = value.args[0] if value.func.id in ("frozenset", "set", "tuple") else None
        if isinstance(value, (ast.Tuple, ast.List, ast.Set)) and all(isinstance(e, ast.Constant) for e in value.elts):
            items = {e.value for e in value.elts if isinstance(e, ast.Constant)}
            if items and any(items >= shared for shared in tuples):
                out.append(f"{where}:{node.lineno} redefines a shared tuple")
    return out


def test_no_python_module_copies_a_shared_constant() -> None:
    scalars, tuples = _shared_values()
    assert len(scalars) >= 3 and len(tuples) >= 4, "the bindings export the gateway's shared constants"
    problems = [
        problem
        for path in sorted((ROOT / "python" / "smetric").rglob("*.py"))
        for problem in _redefinitions(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert problems == []


def test_the_shared_constant_check_sees_copies() -> None:
    """Negative control: the copies the gateway's constants replaced are caught."""
    copied = (
        'CUT_MESSAGE = "the stream was cut and could not be continued"\n'
        '_HINTS = ("x-session-id", "x-claude-code-session-id", "thread-id", "session-id",\n'
        '  "x-dynamo-session-id")\n'
        "WAIT = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)\n"
        # The app's own hop-by-hop set before it read the gateway's (one field more).
        'HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",\n'
        '  "proxy-connection", "te", "trailer", "trailers", "transfer-encoding", "upgrade"})\n'
    )
    assert len(_redefinitions(copied, "copied.py")) == 4


def rust_code(source: str) -> str:
    """A Rust file's code without comments and without its `#[cfg(test)] mod tests { … }`."""
    source = re.split(r"#\[cfg\(test\)\]\s*mod tests\s*\{", source, maxsplit=1)[0]
    return "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("//"))


def rust_submodule_graph(directory: Path) -> dict[str, set[str]]:
    """The files of one module directory (``mod`` for its ``mod.rs``) → the siblings each uses:
    a child's ``super::x`` names sibling ``x`` when a file ``x.rs`` exists, else an item of
    ``mod.rs``; ``mod.rs``'s ``x::`` names child ``x``."""
    files = {p.stem: p for p in directory.glob("*.rs")}
    children = set(files) - {"mod"}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        code = rust_code(path.read_text())
        if name == "mod":
            graph[name] = {child for child in children if re.search(rf"\b{child}::", code)}
            continue
        for m in re.finditer(r"\bsuper::(?:\{([^}]*)\}|([A-Za-z_][A-Za-z0-9_]*))", code):
            used = [m.group(2)] if m.group(2) else re.findall(r"(?:^|,)\s*([A-Za-z_][A-Za-z0-9_]*)", m.group(1))
            for item in used:
                if item in children:
                    if item != name:
                        graph[name].add(item)
                elif item != "self":
                    graph[name].add("mod")
    return graph


def test_the_gateways_native_path_has_no_two_way_module_tie() -> None:
    """Issue 32 item 3: `native/mod.rs` declares and re-exports; the state is `state.rs`, the
    engines' client `engines.rs`, the secret comparison `secret.rs`, so no child uses its parent;
    each API is one `impl Protocol` (`protocol.rs`: `openai.rs`, `messages.rs`, `responses.rs`),
    registered in `apis.rs`, which the forwarder alone uses.
    (router/, index/ and policy/ keep their type in `mod.rs` and its parts in the children: ties
    by design there, not checked.)"""
    graph = rust_submodule_graph(ROOT / "rust" / "smetric-gateway" / "src" / "native")
    assert graph["mod"] >= {"forward", "state"}, "the scan sees mod.rs's uses"
    assert graph["forward"] >= {"state", "apis", "protocol"}, "the scan sees a child's uses"
    assert graph["apis"] >= {"openai", "messages", "responses", "protocol"}
    assert cycles(graph) == []


def test_the_module_tie_check_sees_a_child_using_its_parent(tmp_path: Path) -> None:
    (tmp_path / "mod.rs").write_text("mod a;\nmod b;\npub use a::run;\npub struct State;\n")
    (tmp_path / "a.rs").write_text("use super::b::helper;\nuse super::{State, b};\n")
    (tmp_path / "b.rs").write_text("pub fn helper() {}\n#[cfg(test)]\nmod tests {\n    use super::super::State;\n}\n")
    graph = rust_submodule_graph(tmp_path)
    assert graph == {"mod": {"a"}, "a": {"b", "mod"}, "b": set()}
    assert cycles(graph) == [["a", "mod"]]
