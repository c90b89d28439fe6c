"""TLS in the shell: contexts, the client leg (``client``, ``transport``), the MX leg's
policy (``gate``, ``policies``, ``mx``, ``dns``, ``mtasts``, ``https``), session resumption
(``resume``) and TLS reports (``rpt_store``, ``rpt_count``)."""
