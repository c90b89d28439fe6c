"""``mailsluice bench``: the benchmarks (:mod:`.command` dispatches by name).

* ``relay`` (:mod:`.relay`): messages/s from smtp-source to smtp-sink through
  mailsluice, against no forwarder, nginx, a minimal Python forwarder (:mod:`.pyforward`)
  and a Postfix relay, all on loopback (:mod:`.forwarders` starts them,
  :mod:`.smtptools` runs Postfix's test tools, :mod:`.report` summarises).
* ``idle`` (:mod:`.idle`): memory per held session, greeting latency.
* ``congestion``, ``resources``, ``fairness``, ``suite`` (:mod:`.scenarios`): the study's
  experiments in network namespaces.
* Micro benchmarks: ``relay-core`` (:mod:`.relay_core`: the pure relay's CPU per
  session), ``log-writer`` (:mod:`.log_writer`: the session log's writer),
  ``filter-memory`` (:mod:`.filter_memory`: the proxy's memory with large messages
  through a filter).
"""
