"""The session log's writers, as the configuration names them: ``open_sinks``.

The session log (``log``, or the default place) and every extra sink (``log_sinks``,
watching ``plugins``), composed into one writer. Opened at start, and again by a reload
whose log keys changed (``runtime.reload``): if one sink cannot be opened, those already
opened are closed and the error goes up (the reload is then refused).
"""

from __future__ import annotations

import logging

from mailsluice.plugins.build import build_watchers
from mailsluice.plugins.observer import PluginSink
from mailsluice.sessionlog import LogWriter, open_log
from mailsluice.sessionlog.fanout import LogFanout
from mailsluice.settings.config import Settings
from mailsluice.settings.logplace import default_log

__all__ = ["log_url", "open_sinks"]

log = logging.getLogger("mailsluice.server")


def open_sinks(settings: Settings) -> LogWriter:
    """The session log and every extra sink (``log_sinks``, watching ``plugins``)."""
    limit = settings.log_queue_limit
    watchers = build_watchers(settings)  # a bad plugin: before any sink is opened
    writers: list[LogWriter] = []
    try:
        for url in (log_url(settings), *settings.log_sinks):
            writers.append(open_log(url, limit, process=settings.log_process))
    except BaseException:
        for writer in writers:
            writer.close()
        raise
    if watchers:
        writers.append(LogWriter(PluginSink(watchers), queue_limit=limit, name="plugins"))
    return writers[0] if len(writers) == 1 else LogFanout(writers)


def log_url(settings: Settings) -> str:
    """The session log's URL: ``log``, or the default place (the CLI resolves it first and
    says where; settings built in code get it here, said in the log)."""
    if settings.log is not None:
        return settings.log
    place = default_log(writing=True)
    if place.notice:
        log.warning("%s", place.notice)
    return place.url
