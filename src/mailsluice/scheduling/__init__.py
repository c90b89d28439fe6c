"""The host's scheduler of destination connections, pure (no I/O, no clock of its own):
fair shares, learned limits, pacing and counts for every destination (``scheduler``), the
orders it gives and the facts it hears (``orders``), what it counts (``meters``)."""
