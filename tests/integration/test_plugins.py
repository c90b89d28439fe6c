"""The plugin loader, the plugin settings and the watching-plugin sink (no sockets)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from mailsluice.plugins.build import BuildError, build_filter_chain, build_watchers
from mailsluice.plugins.loader import PluginLoadError, hooks_of, load_plugin
from mailsluice.plugins.observer import PluginSink
from mailsluice.relay.records import (
    SessionClosed,
    SessionOpened,
    TransactionEnded,
    TranscriptChunk,
)
from mailsluice.settings.config import ConfigError, settings_from_mapping

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "plugins"


@pytest.fixture
def examples_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))


def opened(sid: str = "s1") -> SessionOpened:
    return SessionOpened(
        session_id=sid, at=1.0, client="192.0.2.1:4000", destination="198.51.100.7:25",
        source_ip=None,
    )  # fmt: skip


def txn(sid: str = "s1", outcome: str = "delivered") -> TransactionEnded:
    return TransactionEnded(
        session_id=sid, seq=1, started_at=1.0, ended_at=2.0, mail_from="a@b", rcpt_to=("c@d",),
        accepted_rcpt_to=("c@d",), size=10, reply_code=250, reply_text="ok", outcome=outcome,
    )  # fmt: skip


def closed(sid: str = "s1") -> SessionClosed:
    return SessionClosed(
        session_id=sid, at=3.0, helo="h", tls_version=None, tls_cipher=None, tls_verified=None,
        messages=1, bytes=10, final_code=221, connect_to_354_ms=1.0, reason="quit",
    )  # fmt: skip


def test_module_attribute_factory_gets_its_options(examples_on_path: None) -> None:
    plugin = load_plugin("quota_watch:Watcher", {"report_every": 7})
    assert plugin.report_every == 7  # type: ignore[attr-defined]
    assert set(hooks_of(plugin)) == {"session_started", "transaction_ended", "session_ended"}


def test_entry_point_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dist = tmp_path / "demo_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: demo-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[mailsluice.plugins]\ndemo = demo_mod:make\n")
    (tmp_path / "demo_mod.py").write_text(
        "class P:\n    name = 'demo'\n    def session_ended(self, record):\n        pass\n"
        "def make(options):\n    return P()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    plugin = load_plugin("demo")
    assert hooks_of(plugin) == ("session_ended",)


@pytest.mark.parametrize(
    ("use", "message"),
    [
        ("no_such_module_xyz:thing", "cannot import module"),
        ("json:no_such_attribute", "has no attribute"),
        ("nonexistent-entry-point", "no entry point of that name"),
        ("json:dumps", "factory returned str"),
        ("json:loads", "factory failed"),
        ("json:__doc__", "neither a plugin"),
    ],
)
def test_load_errors_name_the_fix(use: str, message: str) -> None:
    with pytest.raises(PluginLoadError, match=message):
        load_plugin(use)


def test_sink_calls_hooks_in_order_and_isolates_failures() -> None:
    calls: list[str] = []

    class Good:
        name = "good"

        def session_started(self, record: Any) -> None:
            calls.append("opened")

        async def line(self, record: Any) -> None:
            calls.append(f"line {record.seq}")

        def session_ended(self, record: Any) -> None:
            calls.append("closed")

    class Bad:
        name = "bad"

        def session_started(self, record: Any) -> None:
            raise RuntimeError("boom")

        async def session_ended(self, record: Any) -> None:
            await asyncio.sleep(10)

    sink = PluginSink([(Good(), 1.0), (Bad(), 0.05)])
    chunk = TranscriptChunk(
        session_id="s1", lines=((1, 1.0, "c>s", "EHLO x"), (2, 1.1, "s>c", "250"))
    )
    sink.write_batch([opened(), chunk, txn(), closed()])
    sink.close()
    assert calls == ["opened", "line 1", "line 2", "closed"]
    good, bad = sink.watched
    assert (good.failures, bad.failures, bad.timeouts) == (0, 2, 1)


def test_example_watcher_counts_by_destination(examples_on_path: None) -> None:
    plugin = load_plugin("quota_watch:Watcher", {"report_every": 1})
    sink = PluginSink([(plugin, 1.0)])
    sink.write_batch([opened(), txn(), txn(outcome="rejected"), closed()])
    sink.close()
    assert dict(plugin.outcomes) == {  # type: ignore[attr-defined]
        ("198.51.100.7:25", "delivered"): 1,
        ("198.51.100.7:25", "rejected"): 1,
    }
    assert plugin.sessions_ended == 1  # type: ignore[attr-defined]


def test_config_builds_chain_and_watchers(examples_on_path: None) -> None:
    settings = settings_from_mapping(
        {
            "filters": [
                {"type": "trace-header"},
                {"type": "plugin", "use": "quota_watch:SubjectFilter", "banned": ["x"]},
                {"type": "trace-header", "header": "X-Second"},
            ],
            "plugins": [{"use": "quota_watch:Watcher", "report_every": 5}],
            "filtering": {"timeout": 10, "keepalive": 20},
        }
    )
    assert settings.relay.filtering
    assert settings.relay.filter_keepalive == 20
    chain = build_filter_chain(settings)
    assert chain is not None
    assert len(chain.names) == 3
    assert len(set(chain.names)) == 3  # two of a kind got distinct names
    [(_watcher, timeout)] = build_watchers(settings)
    assert timeout == 5.0


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"filters": [{"type": "virus"}]}, "is not a filter type"),
        ({"filters": [{"type": "milter"}]}, "needs its address"),
        ({"filters": [{"type": "plugin"}]}, "needs use"),
        ({"filters": {"type": "x"}}, "array of tables"),
        ({"plugins": [{"timeout": 1}]}, "name the plugin"),
        ({"filtering": {"timeout": -1}}, "at least"),
        ({"filtering": {"timeout": 900}}, "at most 300"),
        ({"filtering": {"on_failure": "accept"}}, "is not one of"),
        ({"filtering": {"bogus": 1}}, "unknown setting"),
        ({"filters": [{"type": "trace-header"}], "message_size_limit": 0}, "cannot be used"),
        ({"log_sinks": ["ftp://x"]}, "log_sinks"),
    ],
)
def test_config_errors(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        settings_from_mapping(data)


def test_build_errors_name_the_entry(examples_on_path: None) -> None:
    settings = settings_from_mapping(
        {"filters": [{"type": "plugin", "use": "quota_watch:Watcher"}]}
    )
    with pytest.raises(BuildError, match=r"filters\[0\].*no filter"):
        build_filter_chain(settings)
    settings = settings_from_mapping({"plugins": [{"use": "quota_watch:SubjectFilter"}]})
    with pytest.raises(BuildError, match="no watching hook"):
        build_watchers(settings)


def test_no_filters_no_chain() -> None:
    assert build_filter_chain(settings_from_mapping({})) is None
