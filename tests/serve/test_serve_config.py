"""``smetric serve`` configuration (files, flags, typed errors) and session hints."""

from __future__ import annotations

from pathlib import Path

import pytest

from smetric._core import SessionTable
from smetric.errors import InvalidConfigError
from smetric.serve.config import InstanceConfig, load_config
from smetric.serve.session import session_hint

TOML = """
port = 9000
policy = "lmetric"
[router]
overload_factor = 2.0
[tokens]
mode = "approximate"
[[instances]]
url = "http://10.0.0.1:8000/"
kv_events = "off"
[[instances]]
url = "http://10.0.0.2:8000"
kv_events = "tcp://10.0.0.2:5557"
kv_replay = "tcp://10.0.0.2:5558"
"""

YAML = """
port: 9001
instances:
  - http://10.0.0.1:8000
  - url: http://10.0.0.2:8000
    metrics_url: http://10.0.0.2:9090/metrics
"""


def test_a_toml_file_with_flags_on_top(tmp_path: Path) -> None:
    path = tmp_path / "serve.toml"
    path.write_text(TOML)
    c = load_config(path, port=9100, host=None)
    assert (c.port, c.policy, c.tokens.mode) == (9100, "lmetric", "approximate")
    assert c.instances[0] == InstanceConfig(url="http://10.0.0.1:8000", kv_events="off")
    assert c.instances[1].kv_replay == "tcp://10.0.0.2:5558"
    assert c.router_config(exact_index=False).overload_factor == 2.0
    assert c.router_config(exact_index=True).index_mode == "exact"
    flagged = load_config(path, instances=["http://10.0.0.9:8000"])
    assert [i.url for i in flagged.instances] == ["http://10.0.0.9:8000"], "--instance replaces the file's list"


def test_a_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text(YAML)
    c = load_config(path)
    assert c.port == 9001 and [i.url for i in c.instances] == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    assert c.instances[1].metrics_url == "http://10.0.0.2:9090/metrics"


def test_flags_alone_need_no_file() -> None:
    c = load_config(instances=["http://127.0.0.1:8001", "http://127.0.0.1:8002"], port=0)
    assert c.policy == "smetric" and c.tokens.mode == "auto" and c.max_attempts == 3


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({}, "instances"),
        ({"instances": ["ftp://x"]}, "url"),
        ({"instances": ["http://a:1", "http://a:1"]}, "instances"),
        ({"instances": ["http://a:1"], "policy": "best"}, "policy"),
        ({"instances": ["http://a:1"], "max_attempts": 0}, "max_attempts"),
        ({"instances": ["http://a:1"], "colour": "red"}, "file"),
        ({"instances": ["http://a:1"], "tokens": {"mode": "tokenizer"}}, "tokens.tokenizer"),
        ({"instances": [{"url": "http://a:1", "kv_events": "maybe"}]}, "kv_events"),
    ],
)
def test_bad_settings_are_typed_errors(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidConfigError) as e:
        load_config(**overrides)
    assert e.value.field == field


def test_router_fields_are_checked_by_the_core() -> None:
    with pytest.raises(InvalidConfigError):
        load_config(instances=["http://a:1"], router={"overload_factor": -1.0})
    with pytest.raises(InvalidConfigError) as e:
        load_config(instances=["http://a:1"], router={"no_such_field": 1})
    assert e.value.field == "router"


def test_session_hints_in_their_order() -> None:
    assert session_hint({}) is None
    assert session_hint({"x-claude-code-session-id": "s1"}) == session_hint({"x-claude-code-session-id": "s1"})
    sub = session_hint({"x-claude-code-session-id": "s1", "x-claude-code-agent-id": "a7"})
    assert sub is not None and sub.key == "s1/a7", "a sub-agent is a session of its own"
    h = session_hint({"session-id": "codex-1", "x-session-id": "explicit"}, prompt_cache_key="k")
    assert h is not None and (h.key, h.source) == ("explicit", "x-session-id")
    h = session_hint({}, prompt_cache_key="k", user="u")
    assert h is not None and h.source == "prompt_cache_key"


def test_session_table_counts_turns_and_forgets() -> None:
    t = SessionTable(capacity=2, ttl_s=10)
    assert [t.next_turn("a", now=0), t.next_turn("a", now=1), t.next_turn("b", now=2)] == [1, 2, 1]
    assert t.next_turn("a", now=20) == 1, "idle longer than the ttl: starts over"
    t.next_turn("c", now=21)
    assert len(t) == 2 and t.next_turn("b", now=22) == 1, "the least recently used key was dropped"


def test_a_removed_setting_is_refused_with_its_reason(tmp_path: Path) -> None:
    """``data_plane`` went with the Python data path: a file (or a caller) still setting it is
    told why, not lumped with misspellings, and nothing starts on a plane that no longer exists."""
    cfg = tmp_path / "serve.toml"
    cfg.write_text('data_plane = "python"\n[[instances]]\nurl = "http://127.0.0.1:8001"\n')
    with pytest.raises(InvalidConfigError) as from_file:
        load_config(cfg)
    assert from_file.value.field == "data_plane"
    assert "only data plane" in str(from_file.value)
    with pytest.raises(InvalidConfigError) as from_caller:
        load_config(instances=["http://127.0.0.1:8001"], data_plane="compiled")
    assert from_caller.value.field == "data_plane"
    with pytest.raises(InvalidConfigError) as misspelt:
        load_config(instances=["http://127.0.0.1:8001"], data_plain="python")
    assert misspelt.value.field == "file" and "unknown settings" in str(misspelt.value)
