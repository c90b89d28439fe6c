"""Log URLs: every scheme parses to what its backend needs; bad ones say what to write."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mailsluice.sessionlog.codec import (
    JsonlOptions,
    SessionLogError,
    WebhookOptions,
    parse_log_url,
)
from mailsluice.sessionlog.mysql.url import parse_mysql_url

pytestmark = pytest.mark.unit


def test_file_schemes_keep_their_old_meaning() -> None:
    url = parse_log_url("sqlite:/var/lib/mailsluice/log.db")
    assert (url.scheme, url.path, url.text) == (
        "sqlite",
        Path("/var/lib/mailsluice/log.db"),
        "sqlite:/var/lib/mailsluice/log.db",
    )
    url = parse_log_url("  jsonl:~/x.jsonl ")
    assert url.scheme == "jsonl"
    assert url.path == Path("~/x.jsonl").expanduser()
    assert url.jsonl == JsonlOptions(max_bytes=None, keep=5)
    assert parse_log_url("none:").path is None


def test_jsonl_rotation_parameters() -> None:
    url = parse_log_url("jsonl:/var/log/x.jsonl?max_bytes=100000000&keep=5")
    assert url.path == Path("/var/log/x.jsonl")
    assert url.jsonl == JsonlOptions(max_bytes=100_000_000, keep=5)
    assert parse_log_url("jsonl:/x.jsonl?max_bytes=4096").jsonl == JsonlOptions(4096, 5)
    assert parse_log_url("jsonl:/x.jsonl?max_bytes=4096&keep=0").jsonl.keep == 0
    assert parse_log_url("jsonl:/x.jsonl?").jsonl == JsonlOptions()  # an empty query


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("jsonl:/x?max_bytes=abc", r"max_bytes='abc' must be a whole number from 4096"),
        ("jsonl:/x?max_bytes=100", r"max_bytes='100' must be a whole number"),
        ("jsonl:/x?max_bytes=-5000", r"max_bytes='-5000' must be a whole number"),
        ("jsonl:/x?max_bytes=5000&keep=1000", r"keep='1000' must be a whole number from 0 to 999"),
        ("jsonl:/x?keep=3", r"keep= only matters with max_bytes="),
        ("jsonl:/x?maxbytes=5000", r"unknown parameter maxbytes=; jsonl: takes max_bytes="),
        ("jsonl:/x?max_bytes=5000&max_bytes=6000", r"max_bytes= is given twice"),
        ("jsonl:/x?max_bytes", r"'max_bytes' is not KEY=VALUE"),
        ("jsonl:?max_bytes=5000", r"names no file"),
    ],
)
def test_bad_jsonl_parameters_are_named(url: str, message: str) -> None:
    with pytest.raises(SessionLogError, match=message):
        parse_log_url(url)


def test_postgres_urls() -> None:
    url = parse_log_url("postgresql://mailsluice:s3cret@db.example:5433/maillog")
    assert url.scheme == "postgresql"
    assert url.path is None
    assert url.target == "postgresql://mailsluice:s3cret@db.example:5433/maillog"
    assert url.text == "postgresql://mailsluice:***@db.example:5433/maillog"
    assert "s3cret" not in repr(url)
    assert "s3cret" not in str(url)
    short = parse_log_url("postgres://u@h/db")
    assert (short.scheme, short.text, short.target) == (
        "postgresql",
        "postgres://u@h/db",
        "postgres://u@h/db",
    )
    # the password as a query parameter is masked too; other parameters are shown
    url = parse_log_url("postgresql://u@h/db?password=pw&sslmode=require")
    assert url.text == "postgresql://u@h/db?password=***&sslmode=require"
    # the local socket, IPv6 literals and host lists are all PostgreSQL's own forms
    assert parse_log_url("postgresql:///maillog?host=/run/postgresql").text == (
        "postgresql:///maillog?host=/run/postgresql"
    )
    assert parse_log_url("postgresql://u@[::1]:5432/db").target == "postgresql://u@[::1]:5432/db"
    assert parse_log_url("postgresql://u@h1:5432,h2:5433/db").scheme == "postgresql"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("postgresql://u:pw@h:99999/db", r"port '99999' of 'h:99999' is not a port number"),
        ("postgresql://u:pw@h:port/db", r"port 'port' of 'h:port' is not a port number"),
        ("postgresql://u:pw@h1:5432,h2:0/db", r"port '0' of 'h2:0'"),
        ("postgresql://u:pw@h/db/extra", r"'db/extra' is not a database name"),
        ("postgresql://u:pw@h/db#frag", r"remove the #fragment"),
        ("postgresql://u:pw@h/db?sslmode", r"'sslmode' is not KEY=VALUE"),
    ],
)
def test_bad_postgres_urls_never_show_the_password(url: str, message: str) -> None:
    with pytest.raises(SessionLogError, match=message) as info:
        parse_log_url(url)
    assert "pw" not in str(info.value).replace("postgresql://u:***", "")


def test_mysql_urls() -> None:
    url = parse_log_url("mysql://mailsluice:s3cr%40t@db.example:3307/maillog")
    assert (url.scheme, url.path) == ("mysql", None)
    assert url.target == "mysql://mailsluice:s3cr%40t@db.example:3307/maillog"
    assert url.text == "mysql://mailsluice:***@db.example:3307/maillog"
    assert "s3cr" not in repr(url)
    target = parse_mysql_url(url.target)
    assert (target.host, target.port, target.user, target.database) == (
        "db.example", 3307, "mailsluice", "maillog",
    )  # fmt: skip
    assert target.password == "s3cr@t"  # percent-decoded
    assert "s3cr" not in repr(target)
    sock = "/run/mysqld/mysqld.sock"
    maria = parse_log_url(f"mariadb://u@[::1]/db?unix_socket={sock}")
    assert (maria.scheme, maria.text) == (
        "mysql",
        "mariadb://u@[::1]/db?unix_socket=/run/mysqld/mysqld.sock",
    )
    target = parse_mysql_url(maria.target or "")
    assert (target.host, target.port, target.unix_socket) == (
        "::1",
        3306,
        "/run/mysqld/mysqld.sock",
    )
    socket_only = parse_mysql_url("mysql://u@/db?unix_socket=/s&ssl_ca=/etc/ca.pem")
    assert (socket_only.unix_socket, socket_only.ssl_ca) == ("/s", "/etc/ca.pem")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://u:pw@h:99999/db", r"port '99999' is not a port number"),
        ("mysql://u:pw@h:0/db", r"port '0' is not a port number"),
        ("mysql://u:pw@h:port/db", r"port 'port' is not a port number"),
        ("mysql://u:pw@h/", r"names no database"),
        ("mysql://u:pw@h/db/extra", r"'db/extra' is not a database name"),
        ("mysql://u:pw@h/db#frag", r"remove the #fragment"),
        ("mysql://:pw@h/db", r"names no user"),
        ("mysql://u:pw@/db", r"names no host; .*unix_socket=PATH"),
        ("mysql://u:pw@h/db?charset=latin1", r"unknown option charset=; .*unix_socket=PATH"),
        ("mysql://u:pw@h/db?ssl_ca", r"'ssl_ca' is not KEY=VALUE"),
        ("mariadb://u:pw@h/db?ssl_ca=a&ssl_ca=b", r"ssl_ca= is given twice"),
    ],
)
def test_bad_mysql_urls_never_show_the_password(url: str, message: str) -> None:
    with pytest.raises(SessionLogError, match=message) as info:
        parse_log_url(url)
    assert "pw" not in str(info.value)
    assert "mysql://" in str(info.value) or "mariadb://" in str(info.value)


def test_webhook_urls() -> None:
    url = parse_log_url(
        "webhook:https://hooks.example/T000/B000/XXXX?events=reject,deferred&timeout=5&retries=3"
    )
    assert url.scheme == "webhook"
    assert url.target == "https://hooks.example/T000/B000/XXXX"
    assert url.webhook == WebhookOptions(
        events=frozenset({"reject", "deferred"}), timeout=5.0, retries=3
    )
    # the secret path is masked; our own parameters are shown
    assert (
        url.text == "webhook:https://hooks.example/***?events=reject,deferred&timeout=5&retries=3"
    )
    assert "XXXX" not in repr(url)
    # parameters that are not ours stay on the target URL, as written
    url = parse_log_url("webhook:http://127.0.0.1:8080/hook?token=a%20b&max_posts=7&blocks=no")
    assert url.target == "http://127.0.0.1:8080/hook?token=a%20b"
    assert url.webhook == WebhookOptions(max_posts=7, blocks=False)
    assert parse_log_url("webhook:https://hooks.example").target == "https://hooks.example/"
    defaults = parse_log_url("webhook:https://h/x").webhook
    assert defaults == WebhookOptions(frozenset({"reject"}), 5.0, 2, 3, 1.0, True)
    every = parse_log_url("webhook:https://h/x?events=reject,rejected,deferred,delivered,session")
    assert every.webhook is not None
    assert len(every.webhook.events) == 5


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("webhook:ftp://h/x", r"needs an http:// or https:// URL with a host"),
        ("webhook:https:///x", r"needs an http:// or https:// URL with a host"),
        ("webhook:hooks.example/x", r"needs an http:// or https:// URL"),
        ("webhook:https://h/x?events=rejects", r"unknown event 'rejects'; choose from reject,"),
        ("webhook:https://h/x?events=,", r"no event named"),
        ("webhook:https://h/x?timeout=0", r"timeout='0' must be a number of seconds from 0.05"),
        ("webhook:https://h/x?timeout=inf", r"timeout='inf' must be a number"),
        ("webhook:https://h/x?timeout=soon", r"timeout='soon' must be a number"),
        ("webhook:https://h/x?retries=11", r"retries='11' must be a whole number from 0 to 10"),
        ("webhook:https://h/x?max_posts=0", r"max_posts='0' must be a whole number from 1"),
        ("webhook:https://h/x?min_interval=-1", r"min_interval='-1' must be a number"),
        ("webhook:https://h/x?blocks=maybe", r"blocks='maybe': write true or false"),
        ("webhook:https://h:70000/x", r"port '70000'"),
        ("webhook:https://h/x#frag", r"remove the #fragment"),
    ],
)
def test_bad_webhook_urls_are_named_without_the_secret(url: str, message: str) -> None:
    with pytest.raises(SessionLogError, match=message) as info:
        parse_log_url(url)
    assert "/x" not in str(info.value)  # the path (Slack's secret) is masked


@pytest.mark.parametrize("url", ["", "mailsluice.db", "sqlite:", "ftp:x", "none:x", "mssql://h/db"])
def test_bad_urls_list_every_scheme(url: str) -> None:
    with pytest.raises(SessionLogError, match=r"sqlite:PATH, jsonl:PATH or none:") as info:
        parse_log_url(url)
    assert "postgresql://USER@HOST/DB" in str(info.value)
    assert "mysql://USER@HOST/DB" in str(info.value)
    assert "webhook:https://" in str(info.value)


def test_a_webhook_url_without_its_scheme_is_explained() -> None:
    with pytest.raises(SessionLogError, match=r"write webhook:https://\.\.\.") as info:
        parse_log_url("https://hooks.example/T000/B000/SECRET")
    assert "SECRET" not in str(info.value)
    assert "https://hooks.example/***" in str(info.value)


@given(
    user=st.text(min_size=1, max_size=12),
    password=st.text(min_size=4, max_size=12).filter(lambda p: p.strip() == p),
    host=st.from_regex(r"[a-z][a-z0-9-]{0,10}(\.[a-z]{2,5})?", fullmatch=True),
    port=st.none() | st.integers(1, 65535),
    database=st.text(min_size=1, max_size=12).filter(lambda d: "/" not in d),
)
def test_any_mysql_url_round_trips_and_hides_its_password(
    user: str, password: str, host: str, port: int | None, database: str
) -> None:
    def enc(text: str) -> str:
        return quote(text, safe="")

    netloc = f"{enc(user)}:{enc(password)}@{host}" + (f":{port}" if port else "")
    url = f"mysql://{netloc}/{enc(database)}"
    target = parse_mysql_url(url)
    assert (target.user, target.password, target.host, target.database) == (
        user, password, host, database,
    )  # fmt: skip
    assert target.port == (port or 3306)
    parsed = parse_log_url(url)
    assert parsed.scheme == "mysql"
    assert parsed.text == target.shown
    assert f":{enc(password)}@" not in parsed.text
    assert parsed.text.startswith(f"mysql://{enc(user)}:***@{host}")
