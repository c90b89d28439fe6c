"""The settings: the TOML file and flags to one frozen ``Settings`` (``config``), each
table's keys (``fair``, ``tls``, ``sources``), where the log goes (``logplace``), hints for
mistyped keys, and what a reload applies (``reloadplan``)."""
