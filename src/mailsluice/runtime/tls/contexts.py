"""TLS toward the destination: the client context and certificate-chain verification.

Opportunistic TLS must not fail on an untrusted certificate, so the handshake itself does
not verify. Afterwards the chain the MX presented is checked against the trust store
(``cryptography``'s X.509 verifier) and the result is recorded. The host name is not
checked: in transparent mode only the destination IP is known (MTA-STS/DANE, which
supply the name, come later).

``cryptography`` (about 10 MiB resident) is imported at the first verification, and the
trust store read then: a worker that never starts TLS with an MX never loads either.
"""

from __future__ import annotations

import datetime as dt
import ssl
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.x509 import verification as xv

SYSTEM_CA_FILE = "/etc/ssl/certs/ca-certificates.crt"
_ENCODING_DER = 2  # _ssl.ENCODING_DER: the Certificate.public_bytes() format (1 is PEM)


def client_context(ca_file: str | None = None) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca_file:
        context.load_verify_locations(ca_file)
    return context


def load_roots(ca_file: str | None) -> list[x509.Certificate]:
    """The PEM certificates of ``ca_file`` (none: no file, unreadable, or no certificate)."""
    if not ca_file:
        return []
    from cryptography import x509

    try:
        with open(ca_file, "rb") as handle, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # old roots with odd serial numbers
            return x509.load_pem_x509_certificates(handle.read())
    except (OSError, ValueError):
        return []


class ChainVerifier:
    """Verify a presented chain against trusted roots (no host name check)."""

    def __init__(self, ca_file: str | None = SYSTEM_CA_FILE) -> None:
        self._ca_file = ca_file
        self._loaded = False  # the roots are read at the first verification
        self._store: xv.Store | None = None

    def _trusted(self) -> xv.Store | None:
        if not self._loaded:
            from cryptography.x509 import verification as xv

            roots = load_roots(self._ca_file)
            self._store = xv.Store(roots) if roots else None
            self._loaded = True
        return self._store

    def verify(self, ssl_object: Any) -> bool:
        """True when the peer's chain leads to a trusted root and is valid now."""
        if ssl_object is None:
            return False
        return self.verify_chain(peer_chain(ssl_object))

    def verify_chain(self, ders: tuple[bytes, ...]) -> bool:
        """``verify`` for a chain already read (DER, leaf first): a resumed session's."""
        store = self._trusted()
        if store is None:
            return False
        from cryptography import x509
        from cryptography.x509 import verification as xv

        try:
            chain = [x509.load_der_x509_certificate(der) for der in ders]
        except Exception:  # a chain we cannot read is simply not verified
            return False
        if not chain:
            return False
        leaf, intermediates = chain[0], chain[1:]
        subject = _subject_of(leaf)
        if subject is None:
            return False
        builder = xv.PolicyBuilder().store(store).time(dt.datetime.now(dt.UTC))
        try:
            builder.build_server_verifier(subject).verify(leaf, intermediates)
        except (xv.VerificationError, ValueError):
            return False
        return True


def peer_chain(ssl_object: Any) -> tuple[bytes, ...]:
    """The chain the peer presented in this handshake (DER, leaf first; empty when the
    session was resumed: no certificate is sent then)."""
    return tuple(_unverified_chain(ssl_object))


def _unverified_chain(ssl_object: Any) -> list[bytes]:
    getter = getattr(ssl_object, "get_unverified_chain", None)  # Python >= 3.13
    if getter is None:
        getter = getattr(getattr(ssl_object, "_sslobj", None), "get_unverified_chain", None)
    if getter is None:
        der = ssl_object.getpeercert(binary_form=True)
        return [der] if der else []
    items = getter() or []
    return [item if isinstance(item, bytes) else item.public_bytes(_ENCODING_DER) for item in items]


def _subject_of(leaf: x509.Certificate) -> x509.DNSName | None:
    from cryptography import x509

    try:
        san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None
    names = san.get_values_for_type(x509.DNSName)
    return x509.DNSName(names[0].replace("*", "mailsluice-check", 1)) if names else None
