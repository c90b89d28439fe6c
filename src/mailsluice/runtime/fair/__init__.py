"""Fair sharing in a worker: a session's place in its destination's line (``borrowing``),
the worker's destinations and their idle connections (``destinations``), the broker that runs
the scheduler for ``--workers N`` (``broker``), the state file, host names, dial latencies."""
