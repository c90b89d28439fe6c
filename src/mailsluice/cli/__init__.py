"""The command line: `mailsluice serve`, `check-config`, `sessions`, `transcript`,
`destinations`, `tlsrpt`, `ctl`, `top` (``main`` dispatches; a module per command family)."""
