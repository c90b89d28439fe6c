"""Command parsing: verbs, MAIL/RCPT paths, ESMTP parameters, tolerated violations, HTTP."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mailsluice.smtp import commands
from mailsluice.smtp.commands import (
    HTTP_VERBS,
    KNOWN_VERBS,
    Command,
    CommandError,
    looks_like_http,
    parse_command,
)

pytestmark = pytest.mark.unit


def ok(line: bytes) -> Command:
    parsed = parse_command(line)
    assert isinstance(parsed, Command), parsed
    return parsed


def error(line: bytes) -> CommandError:
    parsed = parse_command(line)
    assert isinstance(parsed, CommandError), parsed
    return parsed


# ----------------------------------------------------------------- verbs
@pytest.mark.parametrize("verb", [b"ehlo", b"EHLO", b"eHlO"])
def test_verbs_are_case_insensitive_and_the_line_is_kept(verb: bytes) -> None:
    cmd = ok(verb + b" client.example")
    assert cmd.verb == "EHLO"
    assert cmd.argument == b"client.example"
    assert cmd.line == verb + b" client.example"
    assert cmd.wire == verb + b" client.example\r\n"
    assert cmd.violations == ()


@pytest.mark.parametrize("line", [b"DATA", b"RSET", b"QUIT", b"NOOP", b"STARTTLS", b"HELP"])
def test_argumentless_commands(line: bytes) -> None:
    assert ok(line).verb == line.decode()


@pytest.mark.parametrize("line", [b"NOOP hello", b"HELP mail", b"VRFY x", b"XFOO bar", b"BDAT 10"])
def test_other_commands_keep_their_argument(line: bytes) -> None:
    cmd = ok(line)
    assert cmd.verb == line.split()[0].decode()
    assert cmd.argument == line.split(b" ", 1)[1]


@pytest.mark.parametrize("verb", [b"DATA", b"RSET", b"QUIT", b"STARTTLS"])
def test_no_argument_allowed(verb: bytes) -> None:
    err = error(verb + b" x")
    assert (err.reply.code, err.reply.enhanced_status, err.verb) == (501, "5.5.4", verb.decode())


@pytest.mark.parametrize("verb", [b"HELO", b"EHLO", b"ehlo"])
def test_helo_needs_a_name(verb: bytes) -> None:
    err = error(verb)
    assert err.reply.code == 501
    assert err.verb == verb.decode().upper()
    assert b"hostname" in err.reply.lines[0]


@pytest.mark.parametrize("line", [b"", b" ", b"\t", b" EHLO x"])
def test_empty_verb(line: bytes) -> None:
    err = error(line)
    assert (err.reply.code, err.reply.enhanced_status, err.verb) == (500, "5.5.2", None)


@pytest.mark.parametrize(
    "line",
    [
        b"RCPT TO:<a@b>\rDATA",  # CR injection (CWE-93)
        b"RCPT TO:<a@b>\nDATA",
        b"MAIL FROM:<a\x00@b>",
        b"NOOP \x1b[31m",
        b"NOOP \x7f",
        b"HELO \x08",
    ],
)
def test_control_characters_are_refused(line: bytes) -> None:
    err = error(line)
    assert (err.reply.code, err.reply.enhanced_status) == (500, "5.5.2")
    assert b"control character" in err.reply.lines[0]


def test_tab_is_not_a_control_character() -> None:
    assert ok(b"NOOP a\tb").argument == b"a\tb"


def test_trailing_whitespace_is_tolerated_and_named() -> None:
    cmd = ok(b"QUIT \t ")
    assert cmd.verb == "QUIT"
    assert cmd.violations == ("trailing-whitespace",)
    assert cmd.wire == b"QUIT \t \r\n"  # forwarded as received


def test_unknown_verbs_parse_for_the_relay_to_refuse() -> None:
    cmd = ok(b"xfoo")
    assert cmd.verb == "XFOO"
    assert cmd.verb not in KNOWN_VERBS


def test_non_ascii_verb() -> None:
    cmd = ok(b"M\xc3\x84IL FROM:<a@b>")
    assert cmd.verb not in KNOWN_VERBS


# ----------------------------------------------------------------- MAIL / RCPT
def test_mail_with_parameters() -> None:
    cmd = ok(b"MAIL FROM:<sender@example.org> SIZE=1000 body=8BITMIME SMTPUTF8 RET=HDRS")
    assert cmd.verb == "MAIL"
    assert cmd.address == b"sender@example.org"
    assert cmd.params == (
        ("SIZE", b"1000"),
        ("BODY", b"8BITMIME"),
        ("SMTPUTF8", None),
        ("RET", b"HDRS"),
    )
    assert cmd.param("SIZE") == b"1000"
    assert cmd.param("SMTPUTF8") == b""
    assert cmd.param("ENVID") is None
    assert cmd.violations == ()


def test_null_reverse_path() -> None:
    cmd = ok(b"MAIL FROM:<>")
    assert cmd.address == b""
    assert cmd.params == ()


def test_null_path_is_not_a_recipient() -> None:
    err = error(b"RCPT TO:<>")
    assert (err.reply.code, err.verb) == (501, "RCPT")


@pytest.mark.parametrize("line", [b"RCPT TO:<postmaster>", b"RCPT TO:<PostMaster>"])
def test_bare_postmaster(line: bytes) -> None:
    assert ok(line).address == line[9:-1]


def test_lower_case_prefix() -> None:
    cmd = ok(b"rcpt to:<rcpt@example.net> NOTIFY=SUCCESS,FAILURE ORCPT=rfc822;x@y")
    assert (cmd.verb, cmd.address) == ("RCPT", b"rcpt@example.net")
    assert cmd.params == (("NOTIFY", b"SUCCESS,FAILURE"), ("ORCPT", b"rfc822;x@y"))


def test_space_after_colon_is_tolerated_and_named() -> None:
    cmd = ok(b"MAIL FROM: <a@b>")
    assert cmd.address == b"a@b"
    assert cmd.violations == ("space-after-colon",)
    assert cmd.wire == b"MAIL FROM: <a@b>\r\n"


def test_missing_brackets_are_tolerated_and_named() -> None:
    cmd = ok(b"RCPT TO:a@b SIZE=1")
    assert (cmd.address, cmd.params) == (b"a@b", (("SIZE", b"1"),))
    assert cmd.violations == ("no-angle-brackets",)


def test_all_violations_together() -> None:
    cmd = ok(b"MAIL FROM:\ta@b ")
    assert cmd.address == b"a@b"
    assert cmd.violations == ("trailing-whitespace", "space-after-colon", "no-angle-brackets")


def test_source_route_is_dropped_from_the_address_but_not_the_wire() -> None:
    cmd = ok(b"RCPT TO:<@relay1,@relay2:user@example.com>")
    assert cmd.address == b"user@example.com"
    assert cmd.wire == b"RCPT TO:<@relay1,@relay2:user@example.com>\r\n"


@pytest.mark.parametrize(
    "line", [b"RCPT TO:<@re:@b@xb>", b"RCPT TO:<@b@xb>", b"MAIL FROM:<@a:@b@c.example>"]
)
def test_a_mailbox_starting_with_at_is_refused(line: bytes) -> None:
    # found by fuzzing: "<@re:@b@xb>" parsed, but its canonical form "<@b@xb>" did not
    assert isinstance(parse_command(line), CommandError)


def test_smtputf8_address_kept_as_bytes() -> None:
    address = "jörg@bücher.example".encode()
    assert ok(b"MAIL FROM:<" + address + b"> SMTPUTF8").address == address


def test_quoted_local_part() -> None:
    assert ok(b'RCPT TO:<"john smith"@example.com>').address == b'"john smith"@example.com'


def test_quoted_local_part_with_escaped_quote() -> None:
    address = b'"say \\"hi\\""@example.com'
    assert ok(b"RCPT TO:<" + address + b">").address == address


@pytest.mark.parametrize(
    "line",
    [
        b"MAIL FROM<a@b>",
        b"MAIL TO:<a@b>",
        b"RCPT FROM:<a@b>",
        b"MAIL",
        b"MAIL FROM:",
        b"MAIL FROM:<a@b",
        b"MAIL FROM:<a@b>x",
        b"MAIL FROM:<ab>",
        b"MAIL FROM:<@b>",
        b"MAIL FROM:<a@>",
        b"MAIL FROM:<a@b c>",
        b"MAIL FROM:<<a@b>>",
        b"MAIL FROM:<a@b<c>",
        b"MAIL FROM:<@relay>",
        b"RCPT TO:ab",
        b"RCPT TO:<a b@c>",
    ],
)
def test_bad_paths(line: bytes) -> None:
    err = error(line)
    assert (err.reply.code, err.reply.enhanced_status) == (501, "5.5.4")
    assert err.verb == line[:4].decode()


def test_overlong_address() -> None:
    assert error(b"MAIL FROM:<" + b"a" * 510 + b"@b.c>").reply.code == 501


@pytest.mark.parametrize(
    "params", [b"SIZE=", b"-X=1", b"SIZE=a=b", b"K_Y=1", b"=1", b"BODY=8BIT\xff=x"]
)
def test_bad_parameters(params: bytes) -> None:
    err = error(b"MAIL FROM:<a@b> " + params)
    assert (err.reply.code, err.reply.enhanced_status) == (555, "5.5.4")


def test_eight_bit_parameter_value() -> None:
    assert ok(b"MAIL FROM:<a@b> ENVID=\xc3\xa9").param("ENVID") == b"\xc3\xa9"


# ----------------------------------------------------------------- HTTP
@pytest.mark.parametrize(
    "line",
    [
        b"GET / HTTP/1.1",
        b"post /x http/1.0",
        b"CONNECT mx.example:25 HTTP/1.1",
        b"Host: mx.example",
        b"user-agent : curl",
        b"Content-Length: 5",
    ],
)
def test_http_is_recognised(line: bytes) -> None:
    assert looks_like_http(line)


@pytest.mark.parametrize(
    "line", [b"GET /", b"EHLO HTTP/1.1", b"MAIL FROM:<host@x>", b"HELO host:", b"Hostname: x"]
)
def test_smtp_is_not_http(line: bytes) -> None:
    assert not looks_like_http(line)


# ----------------------------------------------------------------- properties
atext = st.sampled_from(list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"))
atom = st.text(st.one_of(atext, st.sampled_from(list("!#$%&'*+-/=?^_`{|}~."))), min_size=1)
utf8_atom = st.text(
    st.characters(min_codepoint=0xA0, max_codepoint=0x2FFF, exclude_categories=["Cs", "Zs"]),
    min_size=1,
    max_size=5,
)
label = st.text(atext, min_size=1, max_size=10)
local_part = st.one_of(atom, utf8_atom, st.builds(lambda a, b: f"{a}.{b}", atom, utf8_atom))
domain = st.lists(label, min_size=1, max_size=4).map(".".join)
addresses = st.builds(lambda lp, d: f"{lp}@{d}".encode(), local_part, domain).filter(
    lambda a: len(a) <= 512
)
keyword = st.from_regex(re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,15}", re.ASCII), fullmatch=True)
value = (
    st.binary(min_size=1, max_size=20)
    .map(lambda b: bytes(c for c in b if 0x21 <= c != 0x3D and c != 0x7F))
    .filter(bool)
)
params = st.lists(st.tuples(keyword, st.one_of(st.none(), value)), max_size=5)


def random_case(text: bytes, flips: list[bool]) -> bytes:
    return bytes(
        c ^ 0x20 if chr(c).isalpha() and flips[i % len(flips)] else c for i, c in enumerate(text)
    )


@given(
    verb=st.sampled_from([b"MAIL FROM:", b"RCPT TO:"]),
    address=addresses,
    items=params,
    flips=st.lists(st.booleans(), min_size=1, max_size=8),
    space=st.booleans(),
)
def test_path_commands_round_trip(
    verb: bytes,
    address: bytes,
    items: list[tuple[str, bytes | None]],
    flips: list[bool],
    space: bool,
) -> None:
    head = random_case(verb, flips)
    tail = b"".join(b" " + k.encode() + (b"=" + v if v is not None else b"") for k, v in items)
    line = head + (b" " if space else b"") + b"<" + address + b">" + tail
    cmd = ok(line)
    assert cmd.verb == verb[:4].decode()
    assert cmd.address == address
    assert cmd.params == tuple((k.upper(), v) for k, v in items)
    assert cmd.wire == line + b"\r\n"
    assert cmd.violations == (("space-after-colon",) if space else ())


@given(address=addresses, items=params)
def test_unbracketed_paths_round_trip(
    address: bytes, items: list[tuple[str, bytes | None]]
) -> None:
    tail = b"".join(b" " + k.encode() + (b"=" + v if v is not None else b"") for k, v in items)
    cmd = ok(b"MAIL FROM:" + address + tail)
    assert (cmd.address, len(cmd.params)) == (address, len(items))
    assert cmd.violations == ("no-angle-brackets",)


@given(st.binary(max_size=300))
def test_garbage_gives_a_command_or_a_refusal(line: bytes) -> None:
    parsed = parse_command(line)
    if isinstance(parsed, CommandError):
        assert 500 <= parsed.reply.code < 600
        assert parsed.reply.enhanced_status is not None
        return
    # whatever is accepted is forwarded as exactly one canonical line
    assert parsed.wire == line + b"\r\n"
    assert b"\r" not in parsed.line
    assert b"\n" not in parsed.line
    assert b"\x00" not in parsed.line
    assert parsed.verb == parsed.verb.upper()
    assert parsed.verb
    if parsed.verb in ("MAIL", "RCPT"):
        assert parsed.address is not None


@given(st.binary(max_size=100))
def test_garbage_in_path_commands(tail: bytes) -> None:
    for head in (b"MAIL FROM:", b"RCPT TO:<", b"MAIL FROM:<a@b> "):
        parsed = parse_command(head + tail)
        if isinstance(parsed, Command):
            assert parsed.address is not None
            if head.endswith(b"<"):  # a bracketed path never includes a bracket
                assert b">" not in parsed.address
                assert b"<" not in parsed.address
            assert all(k == k.upper() for k, _ in parsed.params)


@given(st.binary(max_size=200))
def test_http_detector_never_raises(line: bytes) -> None:
    assert looks_like_http(line) in (True, False)


@pytest.mark.parametrize(
    "line", [b"RCPT TO:x@y<evil@z>", b'MAIL FROM:a"b@c', b"MAIL FROM:|a@b> SIZE=1"]
)
def test_unbracketed_path_gets_the_checks_of_a_bracketed_one(line: bytes) -> None:
    """Found by fuzzing: a path without <> was checked less than one with them."""
    assert isinstance(parse_command(line), CommandError)


@pytest.mark.parametrize("value", [b"+=", b"-=", b"=="])
def test_xverp_takes_an_equals_sign_in_its_value_as_postfix_does(value: bytes) -> None:
    parsed = parse_command(b"MAIL FROM:<a@b.example> XVERP=" + value)
    assert isinstance(parsed, Command)
    assert parsed.param("XVERP") == value


def test_other_parameters_still_refuse_an_equals_sign_in_their_value() -> None:
    parsed = parse_command(b"MAIL FROM:<a@b.example> ENVID=a=b")
    assert isinstance(parsed, CommandError)
    assert parsed.reply.code == 555


def test_a_source_route_with_a_quote_is_refused() -> None:
    """Found by fuzzing: the mailbox left after such a route had an unbalanced quote, so
    its canonical form no longer parsed."""
    line = b'RCPT TO:<@"r@rle:\\TO@:"ex\\mpl.ex\\mple> NOTIFRe'
    parsed = parse_command(line)
    assert isinstance(parsed, CommandError)
    assert parsed.reply.code == 501
    ok = parse_command(b"RCPT TO:<@relay.example,@other.example:user@example.org>")
    assert isinstance(ok, Command)
    assert ok.address == b"user@example.org"


_HTTP_PIECES = [b"GET", b"Host", b"HTTP/1.1", b" ", b"\t", b":", b"MAIL", b"data", b"/",
                b"helo", b"Accept", b"x", b"\x00", b"EHLO"]  # fmt: skip
http_ish = st.lists(st.sampled_from(_HTTP_PIECES), max_size=8).map(b"".join)


def _joined(*parts: bytes) -> bytes:
    return b"".join(parts)


smtp_verbs = st.sampled_from(sorted(KNOWN_VERBS)).map(str.encode)
first_words = st.one_of(
    smtp_verbs,
    st.sampled_from(sorted(HTTP_VERBS | {"Host", "User-Agent", "Accept"})).map(str.encode),
)


@given(
    st.one_of(
        st.builds(_joined, first_words, st.sampled_from([b" ", b"\t", b":", b""]), http_ish),
        st.binary(max_size=60),
    ),
    st.lists(st.booleans(), min_size=1, max_size=8),
)
def test_a_line_that_parses_to_an_smtp_verb_is_never_http(line: bytes, flips: list[bool]) -> None:
    """The relay looks for HTTP only when the verb is not an SMTP one (issue 25): exact."""
    line = random_case(line, flips)
    parsed = parse_command(line)
    if parsed.verb in KNOWN_VERBS:
        assert not looks_like_http(line)


@given(smtp_verbs, http_ish, st.lists(st.booleans(), min_size=1, max_size=8))
def test_no_smtp_verb_starts_an_http_line(verb: bytes, tail: bytes, flips: list[bool]) -> None:
    line = random_case(verb + b" " + tail, flips)
    assert parse_command(line).verb != verb.decode() or not looks_like_http(line)


@given(st.lists(st.sampled_from([b"a", b"@", b">", b'"', b"\\", b" ", b"<"]), max_size=12))
def test_closing_bracket_shortcut_agrees_with_the_scan(parts: list[bytes]) -> None:
    from mailsluice.smtp.commands import _closing_bracket, _closing_bracket_scan

    rest = b"<" + b"".join(parts)
    assert _closing_bracket(rest) == _closing_bracket_scan(rest)


# the bytes a path's checks turn on, and a few plain ones
_PATH_BYTES = st.lists(st.sampled_from(list(b'<>" \t@:\\ab.')), max_size=40).map(bytes)


@given(_PATH_BYTES)
def test_a_plain_path_is_split_as_the_long_way_splits_it(path: bytes) -> None:
    """A bracketed path without a quote, a bracket or a space is split the short way
    (issue 25: one translation where each search was a generic call): the same outcome as
    the long way, which follows quotes and escapes, for any path."""
    rest = b"<" + path
    assert commands._split_path(rest) == commands._bracketed_path(rest)


@given(st.lists(st.sampled_from([b"MAIL", b"rcpt", b"DATA", b"X", b" ", b"\t", b"a"]),
                max_size=12).map(b"".join))  # fmt: skip
def test_the_verb_and_argument_are_cut_as_stripping_would(line: bytes) -> None:
    """Spaces and tabs stripped only where there are some (issue 25): the verb, the
    argument and the trailing-whitespace violation as stripping every line gave them."""
    parsed = parse_command(line)
    text = line.rstrip(b" \t")
    verb, _, argument = text.partition(b" ")
    if isinstance(parsed, Command):
        assert parsed.verb == verb.decode().upper()
        assert parsed.argument == argument.strip(b" \t")
        assert ("trailing-whitespace" in parsed.violations) == (text != line)
    else:
        assert not verb or verb.upper() in (b"DATA", b"MAIL", b"RCPT")
