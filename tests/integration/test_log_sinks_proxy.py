"""Extra log sinks fed by a running proxy: PostgreSQL, a webhook and a watching plugin.

Mail goes through mailsluice (SQLite as the main log, ``log_sinks`` and ``[[plugins]]``
as configured by an operator); afterwards the PostgreSQL log reads back the same
sessions as SQLite (the CLI's reader), the webhook got the reject, and the plugin
saw every session. (The MX refuses every message at end-of-data here.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.integration.proxy_helpers import connect, greet, log_url
from tests.integration.test_log_webhook import serve as webhook_server
from tests.support import postgres as pg_support

from mailsluice.sessionlog.reader import list_sessions, transcript
from mailsluice.settings.filters import PluginSpec
from mailsluice_lab.peers.faults import Action, Fault, Phase
from mailsluice_lab.peers.ledger import make_message, new_token
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = pytest.mark.integration

postgres_server = pg_support.postgres_server
pg_database = pg_support.pg_database

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "plugins"


async def test_sinks_and_plugins_see_what_sqlite_sees(
    proxy_factory: Any, tmp_path: Path, pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    with webhook_server() as hook:
        settings = {
            "log_sinks": (pg_database, "webhook:" + hook.url("?events=reject&min_interval=0")),
            "plugins": (PluginSpec(use="quota_watch:Watcher", options={"report_every": 1}),),
        }
        async with (
            ScriptedMX(
                faults=[Fault(Phase.DOT, Action.REPLY_5XX, b"554 5.7.1 Rejected as spam\r\n")]
            ) as mx,
            proxy_factory(mx.address, settings=settings) as proxy,
        ):
            for rcpt in ("one@mx.test", "two@mx.test"):
                async with await connect(proxy) as client:
                    await greet(client)
                    await client.send_message("s@client.test", [rcpt], make_message(new_token()))
                    await client.quit()
            watcher = proxy.log_writer.writers[-1]._backend.watched[0].plugin  # type: ignore[attr-defined]
        # the proxy is closed: every writer has flushed
        from_sqlite = list_sessions(log_url(tmp_path), 10)
        from_postgres = list_sessions(pg_database, 10)
        assert len(from_sqlite) == 2
        assert from_postgres == from_sqlite
        sid = from_sqlite[0]["id"]
        assert transcript(pg_database, sid) == transcript(log_url(tmp_path), sid)
        assert watcher.sessions_ended == 2
        texts = [p.body.get("text", "") for p in hook.posted]
        assert any("two@mx.test" in text and "554" in text for text in texts), texts
