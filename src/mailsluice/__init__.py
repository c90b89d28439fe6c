"""mailsluice: a transparent outbound SMTP proxy.

Routing hands each tenant MSA's outbound SMTP connection to mailsluice; it finds
the original destination, connects there and relays the session end to end.
It never answers for the destination: the client gets 2xx for end-of-data only
when the MX sent 2xx for it.
"""

__version__ = "0.1.0"
