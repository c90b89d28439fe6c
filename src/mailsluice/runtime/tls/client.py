"""The client leg's TLS (the tenants' STARTTLS): the server context and its certificate.

``server_context(settings)`` builds the ``ssl.SSLContext`` the shell upgrades a client
with (``ConnectionHandler``, on the relay's ``StartClientTls``), or None when
``client_tls = false``:

* TLS 1.2 at least (``client_tls_min_version = "1.3"``: 1.3 only); TLS 1.0 and 1.1 are
  refused whatever OpenSSL's own defaults;
* for TLS 1.2 only the suites of ``client_tls_ciphers`` (forward-secret ECDHE suites by
  default; TLS 1.3 suites are all forward-secret); the server's order of preference;
* no compression (CRIME), no renegotiation, a fresh ECDHE key per handshake.

The certificate: ``client_tls_cert`` and ``client_tls_key`` (PEM; the chain in the cert
file); without them a self-signed pair named after the proxy (``relay.hostname``) is made
at the first start and reused later, stored beside the state (the directory of a file
session log, or of ``state_file``: ``client-tls.crt``, ``client-tls.key``). The key file
is created with mode 0600 (never readable by others, not even for a moment), both files
are written under a lock and renamed into place, so concurrent starts agree on one pair.
With no such directory (the log is not a file and ``state_file`` is unset) a throw-away
pair is made for this process and said so. A pair that cannot be read stops the start
with an error that names the key and the fix (``ConfigError``). The pair is made by a
short-lived child process (``python -c``, :func:`make_pair_child`): ``cryptography``
would stay in the worker for good (about 10 MiB resident) for a few milliseconds of use.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import logging
import os
import ssl
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from mailsluice.settings.config import ConfigError, Settings
from mailsluice.settings.logplace import state_path

__all__ = [
    "CERT_NAME",
    "HANDSHAKE_TIMEOUT",
    "KEY_NAME",
    "build_context",
    "check",
    "pair_directory",
    "make_pair_child",
    "self_signed_pair",
    "server_context",
]

log = logging.getLogger("mailsluice.clienttls")

HANDSHAKE_TIMEOUT = 30.0  # seconds a client has to complete its TLS handshake
CERT_NAME = "client-tls.crt"
KEY_NAME = "client-tls.key"
_LOCK_NAME = ".client-tls.lock"
_VALID_DAYS = 3650
_FIX = (
    "give a PEM certificate (with its chain) and its PEM private key, readable by this "
    "user, or remove both keys for a self-signed pair"
)


def server_context(settings: Settings) -> ssl.SSLContext | None:
    """The client leg's context (None: ``client_tls = false``); ``ConfigError`` when the
    certificate, the key or the suites cannot be used."""
    tls = settings.tls
    if not tls.client_tls:
        return None
    if tls.client_tls_cert and tls.client_tls_key:
        return build_context(settings, Path(tls.client_tls_cert), Path(tls.client_tls_key))
    hostname = settings.relay.hostname
    directory = pair_directory(settings)
    if directory is not None:
        cert, key = self_signed_pair(directory, hostname)
        return build_context(settings, cert, key, made=True)
    log.info(  # (at the level of "listening on": a warning would come before it)
        "client_tls: no place to keep a self-signed certificate (the session log is not a "
        "file and state_file is unset): using a throw-away one for this process; set "
        "client_tls_cert and client_tls_key, or state_file, to keep one"
    )
    with tempfile.TemporaryDirectory(prefix="mailsluice-tls-") as scratch:
        cert, key = self_signed_pair(Path(scratch), hostname)
        return build_context(settings, cert, key, made=True)


def check(settings: Settings) -> str:
    """For ``check-config``: load the operator's pair and the suites (``ConfigError`` when
    they cannot be used), without making any file; what the client leg will offer."""
    tls = settings.tls
    if not tls.client_tls:
        return "client TLS off"
    if tls.client_tls_cert and tls.client_tls_key:
        build_context(settings, Path(tls.client_tls_cert), Path(tls.client_tls_key))
        return f"client TLS with {tls.client_tls_cert}"
    with tempfile.TemporaryDirectory(prefix="mailsluice-tls-") as scratch:
        cert, key = self_signed_pair(Path(scratch), settings.relay.hostname)
        build_context(settings, cert, key, made=True)  # (the suites)
    return "client TLS self-signed"


def build_context(
    settings: Settings, cert: Path, key: Path, *, made: bool = False
) -> ssl.SSLContext:
    """The server context with the client leg's policy and this certificate and key."""
    tls = settings.tls
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = (
        ssl.TLSVersion.TLSv1_3 if tls.client_tls_min_version == "1.3" else ssl.TLSVersion.TLSv1_2
    )
    context.options |= (
        ssl.OP_NO_COMPRESSION
        | ssl.OP_NO_RENEGOTIATION
        | ssl.OP_CIPHER_SERVER_PREFERENCE
        | ssl.OP_SINGLE_ECDH_USE
    )
    try:
        context.set_ciphers(tls.client_tls_ciphers)
    except ssl.SSLError:
        raise ConfigError(
            f"client_tls_ciphers: OpenSSL accepts none of {tls.client_tls_ciphers!r}; give "
            'an OpenSSL cipher list, e.g. "ECDHE+AESGCM:ECDHE+CHACHA20"'
        ) from None
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        if made:
            raise ConfigError(
                f"client_tls_cert and client_tls_key are unset, and the self-signed pair "
                f"{cert} / {key} cannot be used ({reason}): delete both files to have a new "
                "pair made, or set client_tls_cert and client_tls_key"
            ) from None
        raise ConfigError(
            f"client_tls_cert = {str(cert)!r}, client_tls_key = {str(key)!r}: cannot load "
            f"them ({reason}); {_FIX}"
        ) from None
    return context


def pair_directory(settings: Settings) -> Path | None:
    """Where the self-signed pair is kept: beside the state (a file log's directory, or
    ``state_file``'s); None when there is no such place."""
    path = state_path(settings.state_file, settings.log)
    return path.parent if path is not None else None


def self_signed_pair(directory: Path, hostname: str) -> tuple[Path, Path]:
    """The self-signed certificate and key in ``directory``: made now if missing (or
    half made by an interrupted start), else those of an earlier start."""
    cert, key = directory / CERT_NAME, directory / KEY_NAME
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        with _locked(directory / _LOCK_NAME):
            if cert.exists() and key.exists():
                return cert, key
            key_pem, cert_pem = _make_pair(hostname)
            _write(key, key_pem, 0o600)  # first: a cert is never there without its key
            _write(cert, cert_pem, 0o644)
    except OSError as exc:
        raise ConfigError(
            f"client_tls_cert and client_tls_key are unset, and no self-signed pair can be "
            f"kept in {directory} ({exc.strerror or exc}): make it writable for this user, "
            "or set client_tls_cert and client_tls_key"
        ) from None
    log.info("client_tls: made a self-signed certificate for %s in %s", hostname, cert)
    return cert, key


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # (releases the lock)


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write ``path`` atomically, its mode set from the first byte (never wider)."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


_PAIR_TIMEOUT = 60.0  # seconds the child making a pair may take
_CHILD = "from mailsluice.runtime.tls.client import make_pair_child; make_pair_child()"


def _make_pair(hostname: str) -> tuple[bytes, bytes]:
    """``_pair_pem(hostname)``, made by a child process (the worker never imports
    ``cryptography`` for it); ``ConfigError`` when the child fails."""
    package_root = str(Path(__file__).resolve().parents[3])  # (the child finds this mailsluice)
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (package_root, path)))}
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, hostname],
            capture_output=True, env=env, timeout=_PAIR_TIMEOUT, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        failure = str(exc)
    else:
        key_pem, _, cert_pem = done.stdout.partition(b"\0")
        if done.returncode == 0 and key_pem and cert_pem:
            return key_pem, cert_pem
        said = done.stderr.decode(errors="replace").strip().splitlines()
        failure = said[-1] if said else f"it exited with status {done.returncode}"
    raise ConfigError(
        f"client_tls_cert and client_tls_key are unset, and the process making a self-signed "
        f"pair failed ({failure}): set client_tls_cert and client_tls_key, or check that "
        f"{sys.executable} can import mailsluice and cryptography"
    )


def make_pair_child() -> None:
    """The child of ``_make_pair``: the pair for ``sys.argv[1]`` on stdout (key NUL cert)."""
    key_pem, cert_pem = _pair_pem(sys.argv[1])
    sys.stdout.buffer.write(key_pem + b"\0" + cert_pem)
    sys.stdout.buffer.flush()


def _pair_pem(hostname: str) -> tuple[bytes, bytes]:
    """A P-256 key and a self-signed server certificate for ``hostname`` (PEM)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostname[:64] or "mailsluice")])
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=_VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    )
    with contextlib.suppress(ValueError):  # a name that is no DNS name gets no SAN
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(hostname)]), critical=False
        )
    certificate = builder.sign(key, hashes.SHA256())
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return key_pem, certificate.public_bytes(serialization.Encoding.PEM)
