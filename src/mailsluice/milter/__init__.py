"""Milter client: run the filters mail operators already use (rspamd, OpenDKIM, ...).

* :mod:`~mailsluice.milter.protocol`: the Sendmail milter protocol, sans-I/O: framing
  with a size cap, constants, option negotiation, header value conversions.
* :mod:`~mailsluice.milter.messages`: one class per command and reply, encode/decode.
* :mod:`~mailsluice.milter.client`: one asyncio conversation with a milter, with a
  deadline on every step.
* :mod:`~mailsluice.milter.filter`: :class:`~mailsluice.milter.filter.MilterFilter`, a
  mailsluice message filter that asks a milter and turns its answer into a verdict.
"""
