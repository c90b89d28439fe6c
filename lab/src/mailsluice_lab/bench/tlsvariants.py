"""The relay benchmark's TLS variants: mailsluice toward an MX that offers STARTTLS.

The MX is smtp-sink behind ``starttls_front`` (STARTTLS answered and the handshake made
there, with a throw-away self-signed certificate, then bytes copied to the sink, which
counts the messages as in every variant). smtp-source only says HELO, and STARTTLS needs
EHLO: ``pyforward --ehlo`` between it and mailsluice turns its HELO into EHLO. mailsluice
runs with fair sharing off, so every message is a connection of its own toward the MX,
and a handshake; only mailsluice's processes are measured:

- ``mailsluice-tls-off``: the same front, STARTTLS not offered (the baseline: the same
  path, no TLS);
- ``mailsluice-tls`` / ``mailsluice-tls-resume``: TLS 1.3, session resumption off / on;
- ``mailsluice-tls12`` / ``mailsluice-tls12-resume``: the same with TLS 1.2.

The proxy's CPU per message minus the baseline's is what TLS costs it per message (the
handshake, and the few records of one small message); ``tlsreport`` compares them.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from functools import partial

from mailsluice_lab.bench.forwarders import (
    NO_FAIR_CONFIG,
    Context,
    Endpoint,
    Variant,
    mailsluice_missing,
    start_mailsluice,
)
from mailsluice_lab.peers.certs import self_signed_context
from mailsluice_lab.processes import child, exit_reporter, free_port, wait_smtp_ready

NO_RESUMPTION = "[tls_policy]\nresumption = false\n"
MX_NAME = "mx.bench.mailsluice.test"


@contextlib.asynccontextmanager
async def starttls_front(ctx: Context, tls: str) -> AsyncIterator[int]:
    """The front (``tls``: "off", "1.2" or "1.3") before the run's sink; yields its port."""
    port = free_port()
    home = ctx.workdir / f"front-{ctx.run_tag}"
    self_signed_context(home, MX_NAME)  # writes mx-cert.pem and mx-key.pem
    argv = [
        sys.executable, "-m", "mailsluice_lab.bench.starttls_front", str(port),
        str(ctx.sink_port), "--tls", tls,
        "--cert", str(home / "mx-cert.pem"), "--key", str(home / "mx-key.pem"),
    ]  # fmt: skip
    log = home / "front.log"
    async with child(argv, log=log, grace=5.0) as proc:
        await wait_smtp_ready(
            port, timeout=ctx.startup_timeout, died=exit_reporter(proc, "starttls front", log)
        )
        yield port


@contextlib.asynccontextmanager
async def ehlo_shim(ctx: Context, upstream: int) -> AsyncIterator[int]:
    """``pyforward --ehlo`` before ``upstream``: smtp-source's HELO goes on as EHLO."""
    port = free_port()
    argv = [sys.executable, "-m", "mailsluice_lab.bench.pyforward", str(port), str(upstream),
            "--ehlo"]  # fmt: skip
    log = ctx.workdir / f"ehlo-shim-{ctx.run_tag}.log"
    async with child(argv, log=log, grace=5.0) as proc:
        await wait_smtp_ready(
            port, timeout=ctx.startup_timeout, died=exit_reporter(proc, "ehlo shim", log)
        )
        yield port


@contextlib.asynccontextmanager
async def _mailsluice_tls(ctx: Context, *, tls: str, resume: bool) -> AsyncIterator[Endpoint]:
    config = NO_FAIR_CONFIG + ("" if resume else NO_RESUMPTION)
    async with (
        starttls_front(ctx, tls) as front,
        start_mailsluice(replace(ctx, sink_port=front), config=config) as endpoint,
        ehlo_shim(ctx, endpoint.port) as shim,
    ):
        info = {**endpoint.info, "mx_tls": tls, "resumption": resume}
        yield replace(endpoint, port=shim, info=info)


def _variant(name: str, describe: str, tls: str, resume: bool) -> Variant:
    return Variant(
        name, describe, mailsluice_missing, partial(_mailsluice_tls, tls=tls, resume=resume)
    )


TLS_VARIANTS = (
    _variant("mailsluice-tls-off", "mailsluice, MX not offering STARTTLS (baseline)", "off", True),
    _variant("mailsluice-tls", "mailsluice, STARTTLS TLS 1.3, no resumption", "1.3", False),
    _variant("mailsluice-tls-resume", "mailsluice, STARTTLS TLS 1.3, resumption", "1.3", True),
    _variant("mailsluice-tls12", "mailsluice, STARTTLS TLS 1.2, no resumption", "1.2", False),
    _variant("mailsluice-tls12-resume", "mailsluice, STARTTLS TLS 1.2, resumption", "1.2", True),
)
