"""XVERP's pure parts: the parameter and the return path, as Postfix's smtpd makes them."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from mailsluice.smtp.commands import Command, parse_command
from mailsluice.smtp.replies import Reply
from mailsluice.smtp.verp import VerpRequest, verp_delimiters, verp_request, verp_sender

pytestmark = pytest.mark.unit

LIST = VerpRequest(b"list-bounces@lists.example", b"+=")


@pytest.mark.parametrize(
    ("recipient", "expected"),
    [
        (b"user@example.org", b"list-bounces+user=example.org@lists.example"),
        (b"a.b@sub.example.org", b"list-bounces+a.b=sub.example.org@lists.example"),
        (b"postmaster", b"list-bounces+postmaster@lists.example"),  # no domain: no "="
        (b"UPPER@Example.ORG", b"list-bounces+UPPER=Example.ORG@lists.example"),  # as given
        ("jörg@exämple.de".encode(), "list-bounces+jörg=exämple.de@lists.example".encode()),
    ],
)
def test_the_return_path_names_the_recipient(recipient: bytes, expected: bytes) -> None:
    assert verp_sender(LIST, recipient) == expected


def test_other_delimiters_are_used_as_given() -> None:
    assert verp_sender(VerpRequest(b"owner@l.example", b"-="), b"u@d.example") == (
        b"owner-u=d.example@l.example"
    )


def test_quoted_local_parts_are_unquoted_then_quoted_again_when_needed() -> None:
    spaced = VerpRequest(b'"list bounces"@l.example', b"+=")
    assert verp_sender(spaced, b"u@d.example") == b'"list bounces+u=d.example"@l.example'
    # a quoted local part that is a plain dot-string once unquoted needs no quotes
    plain = b"list-bounces+user=example.org@lists.example"
    assert verp_sender(LIST, b'"user"@example.org') == plain
    quoted = b'"list-bounces+a\\"b=x.example"@lists.example'
    assert verp_sender(LIST, b'"a\\"b"@x.example') == quoted


@pytest.mark.parametrize(
    ("value", "expected"),
    [(b"", b"+="), (b"-=", b"-="), (b"+-", b"+-"), (b"==", b"==")],
)
def test_delimiters(value: bytes, expected: bytes) -> None:
    assert verp_delimiters(value) == expected


@pytest.mark.parametrize("value", [b"+", b"+=-", b"ab", b"+a", b"%="])
def test_bad_delimiters_get_postfixs_reply(value: bytes) -> None:
    refusal = verp_delimiters(value)
    assert isinstance(refusal, Reply)
    assert (refusal.code, refusal.text) == (501, "5.5.4 Error: XVERP needs two characters from -=+")


def test_a_null_sender_gets_postfixs_reply() -> None:
    refusal = verp_request(b"", b"")
    assert isinstance(refusal, Reply)
    assert (refusal.code, refusal.text) == (503, "5.5.4 Error: XVERP requires non-null sender")
    assert verp_request(b"a@b.example", b"-=") == VerpRequest(b"a@b.example", b"-=")


_LOCAL = st.one_of(
    st.from_regex(rb"\A[A-Za-z0-9!#$%&'*/?^_`{|}~.+=-]{1,20}\Z"),
    st.builds(lambda t: b'"' + t + b'"', st.from_regex(rb"\A[ A-Za-z0-9@.,;:()<>\[\]]{0,12}\Z")),
)
_DOMAIN = st.from_regex(rb"\A[a-z0-9]{1,10}(\.[a-z0-9]{1,10}){0,3}\Z")


@given(
    sender=st.builds(lambda lo, d: lo + b"@" + d, _LOCAL, _DOMAIN),
    recipient=st.builds(lambda lo, d: lo + b"@" + d, _LOCAL, _DOMAIN),
    delimiters=st.sampled_from([b"+=", b"-=", b"+-", b"=+"]),
)
def test_every_return_path_is_one_well_formed_mail_from(
    sender: bytes, recipient: bytes, delimiters: bytes
) -> None:
    """Whatever the addresses, the MAIL line built from the return path parses back to
    that very address: nothing can be smuggled into the command (no ``>``, no CRLF)."""
    assume(isinstance(parse_command(b"MAIL FROM:<" + sender + b">"), Command))
    assume(isinstance(parse_command(b"RCPT TO:<" + recipient + b">"), Command))
    path = verp_sender(VerpRequest(sender, delimiters), recipient)
    parsed = parse_command(b"MAIL FROM:<" + path + b"> BODY=8BITMIME")
    assert isinstance(parsed, Command)
    assert parsed.address == path
    assert parsed.params == (("BODY", b"8BITMIME"),)
    assert path.endswith(b"@" + sender.rpartition(b"@")[2])
    assert b"\r" not in path
    assert b"\n" not in path
