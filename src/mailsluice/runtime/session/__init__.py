"""One client connection's shell: the handler that drives its ``Relay`` (``handler``), the
MX leg (``mxleg``), the transports' callbacks (``sides``), jobs, filter mode's spool, the
lingering close, the reuse pool of dedicated connections, verbose logging."""
