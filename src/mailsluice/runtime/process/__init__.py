"""Processes: the supervisor of ``--workers N`` (``workers``) and systemd's readiness
(``sdnotify``)."""
