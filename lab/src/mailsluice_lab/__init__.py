"""mailsluice's lab: everything around the proxy that is not the proxy.

A distribution of its own (``mailsluice-lab``, ``lab/`` in the repository), never part
of the product's wheel; it may import the product's public modules, the product never
imports it. Its commands reach the product's CLI through the ``mailsluice.commands``
entry points (:mod:`.commands`): ``mailsluice bench ...`` and ``mailsluice demo``.

* :mod:`.peers`: the fake SMTP peers shared by the tests, the demo and the benchmarks:
  one scriptable MX (:mod:`.peers.mx`), one raw SMTP client (:mod:`.peers.client`) and
  the mail sender built on it (:mod:`.peers.sender`), the ledger oracle.
* :mod:`.netns`: throw-away network namespaces with real interception (iptables
  REDIRECT), for the demo, the system tests and the scenario benchmarks.
* :mod:`.demo`: ``mailsluice demo``.
* :mod:`.bench`: ``mailsluice bench``: relay throughput, idle sessions, the study's
  scenarios, micro benchmarks.
* :mod:`.processes` (child processes, free ports, /proc readings) and :mod:`.aio`
  (the event loop of the lab's helper processes), used by all of the above.
"""
