"""The fake SMTP peers the tests, the demo and the benchmarks share: one of each.

* The MX: :class:`~.mx.ScriptedMX` (:mod:`.mx`; its sessions in :mod:`.mx_session` and
  :mod:`.mx_body`, what they share in :mod:`.mx_state`). A sink by default; fault plans
  (:mod:`.faults`), tarpit delays, a per-client connection limit, rejected recipients,
  STARTTLS, smuggling-vulnerable end-of-data, all as configuration. Everything it takes
  goes into its :class:`~.ledger.Ledger` (the no-loss oracle: what the MX stored against
  what each client was told), and to its recorders (:mod:`.recorders`: the demo's
  maildir, the benchmarks' delivery CSV). As a process, several at once, in a network
  namespace: :mod:`.run_mx`. A throw-away TLS identity for it: :mod:`.certs`.
* The client: :class:`~.client.RawSMTPClient` (:mod:`.client`): exact bytes, pipelining,
  STARTTLS, on the buffered protocol of :mod:`.stream` (which the MX uses too). Sending
  mail with it the way an MTA does: :mod:`.sender` (:class:`~.sender.SmtpSender` for the
  benchmarks' tenants and simulated MSA, :func:`~.sender.send_message` for the demo); as
  a process: :mod:`.run_send`.

Nothing here imports the product: the peers are the far ends of mailsluice, not part of
it.
"""
