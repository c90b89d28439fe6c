"""``mailsluice bench load`` and ``mailsluice bench knee``: a JMeter-like SMTP load generator.

Modules: :mod:`.sizes` (size and count parsers), :mod:`.schedule` (open-model arrivals),
:mod:`.protocol` and :mod:`.client` (the fast SMTP client), :mod:`.histograms` and
:mod:`.metrics` (HdrHistogram per phase and per second, merged across workers),
:mod:`.errors`, :mod:`.jtl` (JMeter CSV results), :mod:`.worker` and :mod:`.run` (one event
loop or W processes), :mod:`.report`, :mod:`.plots`, :mod:`.command` (``bench load``) and
:mod:`.knee` (``bench knee``, the saturation sweep).
"""
