"""The sans-I/O SMTP core: bytes in, values out. No sockets, no asyncio, no clock.

- ``lines``: line framing with length limits (commands and replies).
- ``commands``: command parsing (MAIL/RCPT paths, ESMTP parameters, tolerated violations).
- ``replies``: reply values, multi-line assembly, the proxy's own replies.
- ``data``: DATA body scanning: exact end-of-data, smuggling defence, size.
- ``ehlo``: capability lists: what the MX offers, what the client may see.
"""
