"""A :class:`~mailsluice.sessionlog.query.SessionFilter` as SQL, for each database.

:func:`select_sessions` builds the one query ``mailsluice sessions`` runs: the
session columns, the filter's conditions, newest first, the limit. Every value is
a bound parameter, never part of the SQL text. The conditions are built once,
from a few operations every :class:`Dialect` provides (ASCII case folding, a
``LIKE`` with ``!`` as its escape character, unnesting a transaction's
recipients, the time type), so that each option means the same on every backend:

- fold ASCII case: SQLite ``lower(x)`` (folds ASCII only); PostgreSQL
  ``lower(x COLLATE "C")`` (ASCII only too); MariaDB ``REPLACE`` of A-Z one by one
  (its ``LOWER`` folds every Unicode letter).
- a transaction's recipients: ``json_each(rcpt_to)``; ``unnest(rcpt_to)``;
  ``JSON_TABLE(rcpt_to, ...)`` as ``utf8mb4_bin`` text.
- times: epoch seconds (REAL); ``timestamptz``; ``DATETIME(6)`` in UTC.
- newest first: sessions without a start sort last (``NULLS LAST`` in PostgreSQL).

``LIKE`` is exact on folded text everywhere (SQLite's own folding of ASCII then
changes nothing; MariaDB's ``utf8mb4_bin`` keeps trailing spaces significant
in ``LIKE``, unlike in ``=``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from string import ascii_uppercase

from mailsluice.sessionlog.query import CodeRange, Endpoint, Mailbox, SessionFilter

__all__ = ["MYSQL", "POSTGRES", "SQLITE", "Dialect", "like_pattern", "select_sessions"]

_ESCAPE = "!"


def like_pattern(text: str) -> str:
    """``text`` matched literally by ``LIKE ... ESCAPE '!'``."""
    return "".join(_ESCAPE + c if c in "%_!" else c for c in text)


@dataclass(frozen=True, slots=True)
class Dialect:
    """What differs between the databases, for the conditions of :func:`select_sessions`."""

    name: str
    sessions: str  # the tables
    transactions: str
    marker: Callable[[int], str]  # the placeholder of the n-th parameter (from 1)
    time: Callable[[float], object]  # epoch seconds as the start column's type
    fold: Callable[[str], str]  # an SQL text expression with A-Z lowered, nothing else
    recipients: Callable[[str], str]  # FROM item: the RCPT TOs of a transaction alias, as r
    recipient: str  # the column of that item holding one address
    newest_first: str  # ORDER BY, over the sessions table as s


def _pg_time(at: float) -> datetime:
    return datetime.fromtimestamp(at, UTC)


def _mysql_time(at: float) -> datetime:
    return datetime.fromtimestamp(at, UTC).replace(tzinfo=None)


def _mysql_fold(expr: str) -> str:
    for letter in ascii_uppercase:
        expr = f"REPLACE({expr}, '{letter}', '{letter.lower()}')"
    return expr


SQLITE = Dialect(
    name="sqlite",
    sessions="sessions",
    transactions="transactions",
    marker=lambda n: "?",
    time=float,
    fold=lambda expr: f"lower({expr})",
    recipients=lambda t: f"json_each({t}.rcpt_to) AS r",
    recipient="r.value",
    newest_first="s.started_at DESC, s.id DESC",
)
POSTGRES = Dialect(
    name="postgresql",
    sessions="mailsluice_sessions",
    transactions="mailsluice_transactions",
    marker=lambda n: f"${n}",
    time=_pg_time,
    fold=lambda expr: f'lower({expr} COLLATE "C")',
    recipients=lambda t: f"unnest({t}.rcpt_to) AS r(a)",
    recipient="r.a",
    newest_first="s.started_at DESC NULLS LAST, s.id DESC",
)
MYSQL = Dialect(
    name="mysql",
    sessions="mailsluice_sessions",
    transactions="mailsluice_transactions",
    marker=lambda n: "%s",
    time=_mysql_time,
    fold=_mysql_fold,
    recipients=lambda t: (
        f"JSON_TABLE({t}.rcpt_to, '$[*]' COLUMNS "
        "(a TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) AS r"
    ),
    recipient="r.a",
    newest_first="s.started_at DESC, s.id DESC",
)


class _Query:
    """The parameters of one query as it is built (a local accumulator, never shared)."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self.params: list[object] = []

    def bind(self, value: object) -> str:
        self.params.append(value)
        return self.dialect.marker(len(self.params))

    def like(self, expr: str, pattern: str) -> str:
        return f"{self.dialect.fold(expr)} LIKE {self.bind(pattern)} ESCAPE '{_ESCAPE}'"

    def endpoint(self, column: str, where: Endpoint) -> str:
        suffix = "%" if where.port is None else ""  # no port: that host, any port
        return self.like(f"s.{column}", like_pattern(where.text) + suffix)

    def mailbox(self, expr: str, where: Mailbox) -> str:
        prefix = "%" if where.domain else ""  # @domain: any address at that domain
        return self.like(expr, prefix + like_pattern(where.text))

    def codes(self, expr: str, ranges: tuple[CodeRange, ...]) -> str:
        return " OR ".join(
            f"{expr} BETWEEN {self.bind(r.low)} AND {self.bind(r.high)}" for r in ranges
        )

    def in_transactions(self, condition: str, *, recipients: bool = False) -> str:
        source = f"{self.dialect.transactions} t"
        if recipients:
            source += f" CROSS JOIN {self.dialect.recipients('t')}"
        return f"EXISTS (SELECT 1 FROM {source} WHERE t.session_id = s.id AND ({condition}))"


def _conditions(where: SessionFilter, query: _Query) -> list[str]:
    found: list[str] = []
    time = query.dialect.time
    if where.since is not None:
        found.append(f"s.started_at >= {query.bind(time(where.since))}")
    if where.until is not None:
        found.append(f"s.started_at < {query.bind(time(where.until))}")
    if where.client is not None:
        found.append(query.endpoint("client", where.client))
    if where.destination is not None:
        found.append(query.endpoint("destination", where.destination))
    if where.sender is not None:
        found.append(query.in_transactions(query.mailbox("t.mail_from", where.sender)))
    if where.recipient is not None:
        match = query.mailbox(query.dialect.recipient, where.recipient)
        found.append(query.in_transactions(match, recipients=True))
    if where.codes:
        final = query.codes("s.final_code", where.codes)
        replies = query.in_transactions(query.codes("t.reply_code", where.codes))
        found.append(f"({final} OR {replies})")
    if where.tls is True:
        found.append("s.tls_version IS NOT NULL")
    elif where.tls is False:
        found.append("s.tls_version IS NULL AND s.ended_at IS NOT NULL")
    return found


def select_sessions(
    dialect: Dialect, columns: str, where: SessionFilter, limit: int
) -> tuple[str, list[object]]:
    """The query for the ``limit`` newest sessions that pass ``where`` (``limit <= 0``:
    all), and its parameters. ``columns`` are read from the sessions table as ``s``."""
    query = _Query(dialect)
    sql = f"SELECT {columns} FROM {dialect.sessions} s"
    conditions = _conditions(where, query)
    if conditions:
        sql += " WHERE " + " AND ".join(f"({c})" for c in conditions)
    sql += f" ORDER BY {dialect.newest_first}"
    if limit > 0:
        sql += f" LIMIT {query.bind(limit)}"
    return sql, query.params
