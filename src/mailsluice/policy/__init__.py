"""Pure policy decisions (no I/O): who may connect, where to, with which TLS."""
