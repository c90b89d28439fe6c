"""The default session log (issue 12, defect 7): an absolute place, a fallback said once.

``default_log`` is exercised on directories under the test's own temporary directory
(never /var/lib). The command-line test runs ``mailsluice serve`` without ``--log`` as
an ordinary user (``nobody`` when the tests run as root), for whom /var/lib/mailsluice is
not writable: it must log to ``$XDG_STATE_HOME/mailsluice/sessions.db`` and say so, and
``mailsluice sessions`` must find that log, whatever the working directory.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mailsluice.settings.logplace import (
    DEFAULT_LOG,
    DEFAULT_LOG_DIR,
    NoLogPlace,
    default_log,
    fallback_dirs,
)
from mailsluice_lab.netns.processes import python_for_user
from mailsluice_lab.processes import free_port

pytestmark = pytest.mark.integration


def blocked(tmp_path: Path, name: str) -> Path:
    """A directory path that cannot be created, even by root: a file is in the way."""
    (tmp_path / name).write_text("a file, not a directory")
    return tmp_path / name / "mailsluice"


def test_the_default_is_absolute_and_under_var_lib() -> None:
    assert DEFAULT_LOG == "sqlite:/var/lib/mailsluice/sessions.db"


def test_a_writable_default_place_is_created_and_used_silently(tmp_path: Path) -> None:
    primary = tmp_path / "var" / "lib" / "mailsluice"
    place = default_log(writing=True, primary=primary, fallbacks=[tmp_path / "state"])
    assert place.url == f"sqlite:{primary / 'sessions.db'}"
    assert place.notice is None
    assert primary.is_dir()


def test_an_unwritable_default_falls_back_and_says_where_and_how_to_choose(
    tmp_path: Path,
) -> None:
    primary = blocked(tmp_path, "var-lib")
    state = tmp_path / "state" / "mailsluice"
    place = default_log(writing=True, primary=primary, fallbacks=[state])
    assert place.url == f"sqlite:{state / 'sessions.db'}"
    assert place.notice == (
        f"mailsluice: cannot write the session log to {primary / 'sessions.db'} (Not a "
        f"directory); logging to {state / 'sessions.db'} instead. Choose the place with "
        f'--log or log = "sqlite:PATH" (or make {primary} writable for this user)'
    )


def test_a_fallback_others_can_write_to_is_passed_over(tmp_path: Path) -> None:
    shared = tmp_path / "tmp" / f"mailsluice-{os.geteuid()}"
    shared.mkdir(parents=True)
    shared.chmod(0o777)  # as if prepared by someone else in /tmp
    private = tmp_path / "private"
    place = default_log(writing=True, primary=blocked(tmp_path, "x"), fallbacks=[shared, private])
    assert place.url == f"sqlite:{private / 'sessions.db'}"
    assert (private.stat().st_mode & 0o777) == 0o700


def test_no_usable_place_at_all_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(NoLogPlace, match=r"Choose one with --log sqlite:PATH"):
        default_log(
            writing=True, primary=blocked(tmp_path, "a"), fallbacks=[blocked(tmp_path, "b")]
        )


def test_readers_find_the_log_where_serve_put_it(tmp_path: Path) -> None:
    primary, state = tmp_path / "var-lib", tmp_path / "state"
    assert default_log(writing=False, primary=primary, fallbacks=[state]).url == (
        f"sqlite:{primary / 'sessions.db'}"  # nothing anywhere: the default, as before
    )
    state.mkdir()
    (state / "sessions.db").touch()
    place = default_log(writing=False, primary=primary, fallbacks=[state])
    assert place.url == f"sqlite:{state / 'sessions.db'}"
    assert place.notice is not None
    assert str(state / "sessions.db") in place.notice
    assert not primary.exists()  # reading creates nothing


def test_fallback_dirs_follow_xdg_state_home_then_the_temp_dir(tmp_path: Path) -> None:
    dirs = fallback_dirs({"XDG_STATE_HOME": str(tmp_path / "xdg")}, temp=tmp_path / "tmp")
    assert dirs == [
        tmp_path / "xdg" / "mailsluice",
        tmp_path / "tmp" / f"mailsluice-{os.geteuid()}",
    ]
    relative = fallback_dirs({"XDG_STATE_HOME": "relative/ignored"}, temp=tmp_path)
    assert relative[0] == Path.home() / ".local" / "state" / "mailsluice"


# ------------------------------------------------------------ the command line, for real


@pytest.fixture
def ordinary_user() -> tuple[int, int] | None:
    """The user to run as: ``nobody`` when we are root, else ourselves (None)."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody' to run mailsluice as")
    return entry.pw_uid, entry.pw_gid


@pytest.fixture
def workdir(ordinary_user: tuple[int, int] | None) -> Iterator[Path]:
    # not pytest's tmp_path: its parents are closed to other users
    path = Path(tempfile.mkdtemp(prefix="mailsluice-default-log-"))
    path.chmod(0o755)
    for sub in ("cwd", "state"):
        (path / sub).mkdir()
        if ordinary_user is not None:
            os.chown(path / sub, *ordinary_user)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _command(user: tuple[int, int] | None, *args: str) -> tuple[list[str], dict[str, str]]:
    if user is None:
        return [sys.executable, "-m", "mailsluice", *args], {}
    python, env = python_for_user(*user)
    setpriv = ["setpriv", f"--reuid={user[0]}", f"--regid={user[1]}", "--clear-groups", "--"]
    return [*setpriv, *python, "-m", "mailsluice", *args], env


def test_serve_without_log_as_an_ordinary_user(
    workdir: Path, ordinary_user: tuple[int, int] | None
) -> None:
    if ordinary_user is not None and shutil.which("setpriv") is None:
        pytest.skip("setpriv is needed to run mailsluice as nobody (apt-get install util-linux)")
    probe = ["test", "-w", str(DEFAULT_LOG_DIR)]
    if ordinary_user is not None:
        probe = ["setpriv", f"--reuid={ordinary_user[0]}", f"--regid={ordinary_user[1]}",
                 "--clear-groups", "--", *probe]  # fmt: skip
    if subprocess.run(probe, check=False).returncode == 0:
        pytest.skip(f"{DEFAULT_LOG_DIR} is writable for this user: no fallback to see")
    port = free_port()
    argv, env = _command(ordinary_user, "serve", "--listen", f"127.0.0.1:{port}",
                         "--upstream", "127.0.0.1:9")  # fmt: skip
    env = {**os.environ, **env, "XDG_STATE_HOME": str(workdir / "state")}
    out = workdir / "serve.out"
    with out.open("wb") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, env=env,
                                cwd=workdir / "cwd")  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while "mailsluice listening on" not in out.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, out.read_text()
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    output = out.read_text()
    expected = workdir / "state" / "mailsluice" / "sessions.db"
    assert output.count("mailsluice: cannot write the session log to") == 1, output
    assert f"logging to {expected} instead. Choose the place with --log" in output
    assert expected.exists()
    assert list((workdir / "cwd").iterdir()) == []  # nothing written where it was started

    argv, env = _command(ordinary_user, "sessions")
    listing = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False,
                             env={**os.environ, **env, "XDG_STATE_HOME": str(workdir / "state")},
                             cwd="/")  # fmt: skip
    assert listing.returncode == 0, listing.stderr
    assert f"reading the session log {expected}" in listing.stderr
