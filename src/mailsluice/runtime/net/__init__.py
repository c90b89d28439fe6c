"""Sockets: who may connect (``admission``), the accept loop (``listener``), dialling from
a source address (``dialer``), the original destination (``origdst``), this host's addresses."""
