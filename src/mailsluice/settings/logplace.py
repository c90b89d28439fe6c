"""Where the session log goes when no ``log`` is set: ``/var/lib/mailsluice/sessions.db``.

The default is absolute, so that ``serve``, ``sessions`` and ``transcript`` find the same
log whatever directory they are started in. ``serve`` creates the directory if it can;
when it cannot write there (an ordinary user, a directory not created for it), it logs
instead to the first of these it can use, and says so once on standard error:

1. ``$XDG_STATE_HOME/mailsluice/sessions.db`` (``~/.local/state/mailsluice/sessions.db``
   when ``XDG_STATE_HOME`` is unset), the XDG place for a program's state;
2. ``TMPDIR/mailsluice-UID/sessions.db``, a directory of its own (made with mode 0700).

A fallback directory is used only if it is ours and no one else can write to it (not a
symbolic link either), so that a directory prepared by someone else in /tmp is not.

``sessions`` and ``transcript`` read the first of these places where a log exists.
An explicit ``log`` (``--log``) is never replaced: it works or ``serve`` stops.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mailsluice.sessionlog.codec import parse_log_url

DEFAULT_LOG_DIR = Path("/var/lib/mailsluice")
LOG_NAME = "sessions.db"
DEFAULT_LOG = f"sqlite:{DEFAULT_LOG_DIR / LOG_NAME}"


class NoLogPlace(OSError):
    """No place for the default session log could be used; the message names the fix."""


@dataclass(frozen=True, slots=True)
class LogPlace:
    """The log URL to use, and what to tell the operator about it (once), if anything."""

    url: str
    notice: str | None = None


def fallback_dirs(env: Mapping[str, str] | None = None, temp: Path | None = None) -> list[Path]:
    """The places tried after ``/var/lib/mailsluice``, in order."""
    env = os.environ if env is None else env
    dirs: list[Path] = []
    state = env.get("XDG_STATE_HOME", "")
    if state and Path(state).is_absolute():
        dirs.append(Path(state) / "mailsluice")
    else:
        try:
            dirs.append(Path.home() / ".local" / "state" / "mailsluice")
        except (RuntimeError, KeyError):  # no HOME and no passwd entry
            pass
    base = temp if temp is not None else Path(tempfile.gettempdir())
    dirs.append(base / f"mailsluice-{os.geteuid()}")
    return dirs


def _problem(directory: Path, *, private: bool) -> str | None:
    """Why the log cannot be written in ``directory`` (made if missing), or None."""
    try:
        directory.mkdir(mode=0o700 if private else 0o750, parents=True, exist_ok=True)
        info = directory.lstat()
    except OSError as exc:
        return exc.strerror or str(exc)
    if not stat.S_ISDIR(info.st_mode):
        return "not a directory"
    if private and (info.st_uid != os.geteuid() or info.st_mode & 0o022):
        return "not a directory of this user's that only it can write to"
    if not os.access(directory, os.W_OK | os.X_OK):
        return "not writable by this user"
    log = directory / LOG_NAME
    if log.exists() and not os.access(log, os.R_OK | os.W_OK):
        return f"{log} is not writable by this user"
    return None


def default_log(
    *,
    writing: bool,
    primary: Path = DEFAULT_LOG_DIR,
    fallbacks: list[Path] | None = None,
) -> LogPlace:
    """The default log's place: for ``serve`` (``writing``) or for reading it."""
    candidates = fallback_dirs() if fallbacks is None else fallbacks
    wanted = primary / LOG_NAME
    if not writing:
        for directory in (primary, *candidates):
            if (directory / LOG_NAME).exists():
                found = directory / LOG_NAME
                notice = None if directory == primary else (
                    f"mailsluice: reading the session log {found} (there is none at {wanted})"
                )  # fmt: skip
                return LogPlace(f"sqlite:{found}", notice)
        return LogPlace(f"sqlite:{wanted}")
    problem = _problem(primary, private=False)
    if problem is None:
        return LogPlace(f"sqlite:{wanted}")
    tried = [f"{wanted} ({problem})"]
    for directory in candidates:
        other = _problem(directory, private=True)
        if other is None:
            return LogPlace(
                f"sqlite:{directory / LOG_NAME}",
                f"mailsluice: cannot write the session log to {wanted} ({problem}); logging "
                f"to {directory / LOG_NAME} instead. Choose the place with --log or "
                f'log = "sqlite:PATH" (or make {primary} writable for this user)',
            )
        tried.append(f"{directory / LOG_NAME} ({other})")
    raise NoLogPlace(
        f"no place for the session log: {'; '.join(tried)}. Choose one with --log "
        'sqlite:PATH (or log = "none:" for no log)'
    )


#: the scheduler's state (learned limits), beside a file log unless ``state_file`` says
STATE_NAME = "destinations.json"


def state_path(explicit: str | None, log_url: str | None) -> Path | None:
    """Where the state goes: ``state_file``, else beside a file log, else nowhere."""
    if explicit:
        return Path(explicit)
    if not log_url:
        return None
    try:
        parsed = parse_log_url(log_url)
    except ValueError:
        return None
    if parsed.path is None:
        return None
    return Path(parsed.path).parent / STATE_NAME
