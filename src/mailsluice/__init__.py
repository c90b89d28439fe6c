"""mailsluice: a transparent outbound SMTP proxy.

Routing hands each tenant MSA's outbound SMTP connection to mailsluice; it finds
the original destination, connects there and relays the session end to end.
It never answers for the destination: the client gets 2xx for end-of-data only
when the MX sent 2xx for it.
"""

__version__ = "0.1.0"

# The pure core's build: mypyc's extension modules when there are (fresh) ones, else the
# sources; MAILSLUICE_PURE=1 forces the sources (mailsluice.native).
from mailsluice import native as _native

_native.choose()
