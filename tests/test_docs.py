"""Every reference to a document resolves.

* every relative link of every Markdown file in the repository (``[text](path#anchor)``) names a
  file or directory that exists, relative to the Markdown file;
* every ``docs/….md`` path mentioned in a source, test, script, manifest or document exists
  (relative to the repository root, or to the mentioning file's directory); a path after ``:``
  or ``@`` is another repository's (``owner/repo@commit:docs/x.md``) and is not checked;
* every bare ``name.md`` mentioned there is a Markdown file of the repository, and every
  hyphenated document name cited by section (``perf-model §6``, ``pd-and-tier.md §A.3``) is
  in ``docs/``.

The files are those git tracks plus the untracked ones it does not ignore, so a new document is
checked before its first commit. Each check has a negative control: the same scan over a
fabricated text reports the dangling reference.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = {".py", ".pyi", ".rs", ".toml", ".sh", ".md", ".yml", ".yaml", ".cfg", ".ini"}
"""Suffixes of the files whose mentions of documents are checked (plus ``Makefile``)."""
IGNORED_BARE = {"x.md"}
"""Bare ``.md`` names that are data, not references (a tool-call argument in a chat fixture)."""

LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
DOC_PATH = re.compile(r"(?<![\w/.:@-])((?:[\w.-]+/)*docs/[\w/.-]+?\.md)\b")
BARE_NAME = re.compile(r"(?<![\w/.:@-])([\w-]+\.md)\b")
CITED_DOC = re.compile(r"(?<![\w/.:@-])([a-z]+(?:-[a-z]+)+)(?:\.md)? §")


def repo_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    return [ROOT / f for f in listed if (ROOT / f).is_file()]


def dangling_links(markdown: Path, text: str) -> list[str]:
    out = []
    for m in LINK.finditer(text):
        target = m.group(1)
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL (http:, mailto:) or an anchor in the same page
        path = target.split("#", 1)[0]
        if path and not (markdown.parent / path).exists():
            out.append(target)
    return out


def dangling_mentions(source: Path, text: str, markdown_names: set[str]) -> list[str]:
    out = [
        ref
        for ref in (m.group(1) for m in DOC_PATH.finditer(text))
        if not (ROOT / ref).exists() and not (source.parent / ref).exists()
    ]
    out += [m.group(1) for m in BARE_NAME.finditer(text) if m.group(1) not in markdown_names | IGNORED_BARE]
    out += [f"{m.group(1)} §" for m in CITED_DOC.finditer(text) if not (ROOT / "docs" / f"{m.group(1)}.md").exists()]
    return out


@pytest.fixture(scope="module")
def files() -> list[Path]:
    return repo_files()


def test_every_relative_markdown_link_resolves(files: list[Path]) -> None:
    markdown = [f for f in files if f.suffix == ".md"]
    assert ROOT / "docs" / "architecture.md" in markdown
    broken = {str(f.relative_to(ROOT)): dangling_links(f, f.read_text()) for f in markdown}
    assert {f: b for f, b in broken.items() if b} == {}


def test_every_document_mentioned_in_the_repository_exists(files: list[Path]) -> None:
    names = {f.name for f in files if f.suffix == ".md"}
    # This file is left out: its negative controls and docstring are fabricated references.
    scanned = [f for f in files if (f.suffix in SCANNED or f.name == "Makefile") and f != Path(__file__).resolve()]
    assert any(f.suffix == ".rs" for f in scanned) and any(f.suffix == ".py" for f in scanned)
    broken = {}
    for f in scanned:
        try:
            text = f.read_text()
        except UnicodeDecodeError:
            continue  # not text
        if found := dangling_mentions(f, text, names):
            broken[str(f.relative_to(ROOT))] = found
    assert broken == {}


def test_the_scans_report_what_dangles() -> None:
    # Negative controls: each pattern finds a reference that does not resolve, and lets pass
    # the ones that do, another repository's path and a URL.
    page = ROOT / "docs" / "architecture.md"
    text = "[ok](serve.md#x) [web](https://example.com/a.md) [top](#a) [gone](nowhere.md) [dir](../rust)"
    assert dangling_links(page, text) == ["nowhere.md"]
    source = ROOT / "python" / "smetric" / "cli.py"
    text = (
        "see docs/serve.md and docs/missing-page.md; vllm@abc:docs/features/x.md is theirs;\n"
        "README.md, gone.md; perf-model §6, pd-and-tier.md §A.1, no-such-doc §2"
    )
    assert dangling_mentions(source, text, {"README.md", "serve.md", "pd-and-tier.md"}) == [
        "docs/missing-page.md",
        "gone.md",
        "no-such-doc §",
    ]


def test_the_three_replica_deployment_is_wired_as_docs_serve_describes() -> None:
    # No Docker engine runs here: the manifest is parsed and its wiring checked (docs/serve.md,
    # "Several proxy replicas").
    import json

    import yaml

    deploy = ROOT / "deploy" / "replicas"
    compose = yaml.safe_load((deploy / "compose.yaml").read_text())
    services = compose["services"]
    replicas = [name for name, s in services.items() if s.get("command", [None])[0] == "serve"]
    assert len(replicas) == 3
    nats_port = services["nats"]["command"][services["nats"]["command"].index("-p") + 1]
    engines = [name for name in services if name.startswith("engine-")]
    for name in replicas:
        s = services[name]
        assert s["environment"]["SMETRIC_REPLICA_BUS"] == f"nats://nats:{nats_port}"
        assert sorted(a.removeprefix("--instance=") for a in s["command"] if a.startswith("--instance=")) == sorted(
            f"http://{e}:8000" for e in engines
        )
        assert any("/health" in part for part in s["healthcheck"]["test"])
        assert (deploy / s["build"]["dockerfile"].removeprefix("deploy/replicas/")).is_file()
    for name in engines:
        (config,) = (a.split("=", 1)[1] for a in services[name]["command"] if a.startswith("--kv-events-config="))
        events = json.loads(config)
        # Bound on every interface, announced at /kv_event_sources: every replica subscribes.
        assert events["enable_kv_cache_events"] and events["endpoint"].startswith("tcp://*:")
        assert events["replay_endpoint"].startswith("tcp://*:")
    haproxy = (deploy / "haproxy.cfg").read_text()
    assert all(re.search(rf"server {name} {name}:8080 check\b", haproxy) for name in replicas)
    assert "option httpchk GET /health" in haproxy and "8080:8080" in services["lb"]["ports"]
    assert any(v.startswith("./haproxy.cfg:") for v in services["lb"]["volumes"])
