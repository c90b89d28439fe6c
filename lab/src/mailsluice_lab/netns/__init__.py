"""Throw-away network namespaces with real interception, for the demo, the system tests and
the scenario benchmarks.

:mod:`.plumbing` creates namespaces and wires them (veths, addresses, routes, iptables
REDIRECT); :mod:`.topologies` builds the two interception set-ups (a gateway, the same
host); :mod:`.processes` runs programs inside them (the MX, ``mailsluice serve``, a
sender) and waits for their ports inside the namespace. Everything needs root and is
removed on exit.
"""
