"""MTA-STS (RFC 8461), the I/O: the ``_mta-sts`` TXT lookup, the HTTPS policy fetch, and
the persistent policy cache. ``MtaSts`` is the ``StsSource`` the TLS policy asks.

A lookup asks the configured resolver for ``_mta-sts.<domain>`` TXT and lets
``policy.tls.mtasts.plan`` decide from the cached entry: use it, fetch, or no policy.
The fetch follows §3.3: ``https://mta-sts.<domain>/.well-known/mta-sts.txt``, the name
resolved through the same resolver, the certificate verified for ``mta-sts.<domain>``
(``ca_file``'s anchors, else the system's), no redirect followed (a 3xx is a fetch
error), ``Content-Type: text/plain``, at most 64 KiB, 10 seconds in all. A fetch that
fails keeps a valid cached policy (enforce stays enforce); an expired one is dropped.
Concurrent lookups of one domain share one lookup.

The cache is a JSON file (``mta-sts.json`` beside the state file), written atomically
(a temporary file renamed over it) off the event loop after every change, read back at
start, and bounded (``MAX_ENTRIES``: the entries closest to expiry go first).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import ssl
import tempfile
from pathlib import Path
from typing import Any

import dns.asyncresolver
import dns.exception
import dns.resolver

from mailsluice.policy.tls.model import Result, StsLookup, StsMode, StsPolicy
from mailsluice.policy.tls.mtasts import (
    CachedPolicy,
    Step,
    StsPolicyError,
    fallback,
    parse_policy,
    plan,
    sts_record_id,
)
from mailsluice.runtime.tls.dns import resolver_for
from mailsluice.runtime.tls.https import (
    BodyTooLarge,
    HttpError,
    https_request,
    resolve_addresses,
    tls_context,
)
from mailsluice.settings.tls import TlsSettings

__all__ = ["CACHE_NAME", "MAX_BODY", "MtaSts", "StsFetchError", "cache_path_beside"]

log = logging.getLogger("mailsluice.mtasts")

CACHE_NAME = "mta-sts.json"
MAX_BODY = 65_536  # bytes of policy text
FETCH_DEADLINE = 10.0  # seconds for the whole HTTPS fetch
DNS_DEADLINE = 5.0  # seconds for the TXT lookup
MAX_ENTRIES = 10_000
WELL_KNOWN = "/.well-known/mta-sts.txt"


class StsFetchError(Exception):
    """The policy could not be fetched or is invalid: ``result`` is its RFC 8460 type."""

    def __init__(self, result: Result, reason: str) -> None:
        super().__init__(reason)
        self.result = result
        self.reason = reason


def cache_path_beside(state: Path | None) -> Path | None:
    """Where the cache goes: beside the state file (None: kept in memory only)."""
    return None if state is None else state.parent / CACHE_NAME


class MtaSts:
    """The MTA-STS source: ``await lookup(domain, now)`` gives the policy that applies."""

    def __init__(
        self,
        settings: TlsSettings,
        cache_path: Path | None,
        *,
        resolver: dns.asyncresolver.Resolver | None = None,
        fetch_deadline: float = FETCH_DEADLINE,
        max_entries: int = MAX_ENTRIES,
    ) -> None:
        self._resolver = resolver or resolver_for(settings.resolver)
        self._port = settings.mta_sts_port
        self._ca_file = settings.ca_file
        self._context: ssl.SSLContext | None = None
        self._deadline = fetch_deadline
        self._max_entries = max_entries
        self._path = cache_path
        self._cache: dict[str, CachedPolicy] = _read(cache_path)
        self._inflight: dict[str, asyncio.Future[StsLookup]] = {}
        self._write_lock = asyncio.Lock()

    def cached(self, domain: str) -> CachedPolicy | None:
        return self._cache.get(domain.lower().rstrip("."))

    async def lookup(self, domain: str, now: float) -> StsLookup:
        domain = domain.lower().rstrip(".")
        shared = self._inflight.get(domain)
        if shared is not None:
            return await asyncio.shield(shared)
        future: asyncio.Future[StsLookup] = asyncio.get_running_loop().create_future()
        self._inflight[domain] = future
        try:
            found = await self._lookup(domain, now)
        except BaseException:
            entry = self._cache.get(domain)  # the waiters get what the cache allows
            future.set_result(StsLookup(fallback(entry, now), Result.STS_POLICY_FETCH_ERROR))
            raise
        else:
            future.set_result(found)
            return found
        finally:
            del self._inflight[domain]

    async def _lookup(self, domain: str, now: float) -> StsLookup:
        entry = self._cache.get(domain)
        record_id = await self._record_id(domain)
        step = plan(entry, record_id, now)
        if step is Step.USE:
            assert entry is not None
            return StsLookup(entry.policy, None)
        if step is Step.NO_POLICY:
            if entry is not None:  # expired, and no live record: dropped
                await self._forget(domain)
            return StsLookup(None, None)
        assert record_id is not None
        try:
            policy = await self.fetch(domain, record_id)
        except StsFetchError as exc:
            kept = fallback(entry, now)
            log.info("%s: MTA-STS policy not fetched (%s); %s", domain, exc.reason,
                     "the cached one kept" if kept else "no policy")  # fmt: skip
            if kept is None and entry is not None:
                await self._forget(domain)
            return StsLookup(kept, exc.result)
        await self._remember(domain, CachedPolicy(policy, now))
        return StsLookup(policy, None)

    async def _record_id(self, domain: str) -> str | None:
        """The id of the domain's STSv1 record; None when there is none (or DNS failed)."""
        try:
            answer = await self._resolver.resolve(f"_mta-sts.{domain}", "TXT",
                                                  lifetime=DNS_DEADLINE)  # fmt: skip
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            return None
        except dns.exception.DNSException as exc:
            log.info("%s: _mta-sts TXT lookup failed: %s", domain, exc)
            return None
        return sts_record_id(rr.strings for rr in answer)

    async def fetch(self, domain: str, record_id: str) -> StsPolicy:
        """The domain's policy over HTTPS (§3.3); ``StsFetchError`` on any failure."""
        host = f"mta-sts.{domain}"
        if self._context is None:
            self._context = tls_context(self._ca_file)
        try:
            async with asyncio.timeout(self._deadline):
                addresses = await resolve_addresses(self._resolver, host)
                response = await https_request(
                    host, self._port, WELL_KNOWN, addresses=addresses, context=self._context,
                    headers=[("Accept", "text/plain")], max_body=MAX_BODY,
                )  # fmt: skip
        except ssl.SSLCertVerificationError as exc:
            raise StsFetchError(
                Result.STS_WEBPKI_INVALID, f"{host}: {exc.verify_message}"
            ) from None
        except TimeoutError:
            raise StsFetchError(Result.STS_POLICY_FETCH_ERROR, f"{host}: no answer in "
                                f"{self._deadline:g} s") from None  # fmt: skip
        except BodyTooLarge as exc:
            raise StsFetchError(Result.STS_POLICY_INVALID, f"{host}: {exc}") from None
        except (HttpError, OSError) as exc:
            raise StsFetchError(Result.STS_POLICY_FETCH_ERROR, f"{host}: {exc}") from None
        if 300 <= response.status < 400:
            raise StsFetchError(Result.STS_POLICY_FETCH_ERROR,
                                f"{host}: redirect ({response.status}) not followed")  # fmt: skip
        if response.status != 200:
            raise StsFetchError(Result.STS_POLICY_FETCH_ERROR, f"{host}: HTTP {response.status}")
        media = (response.header("content-type") or "").split(";")[0].strip().lower()
        if media != "text/plain":
            why = f"{host}: Content-Type {media or 'missing'}, not text/plain"
            raise StsFetchError(Result.STS_POLICY_INVALID, why)
        try:
            return parse_policy(response.body.decode("utf-8"), record_id)
        except (UnicodeDecodeError, StsPolicyError) as exc:
            raise StsFetchError(Result.STS_POLICY_INVALID, f"{host}: {exc}") from None

    # -- the cache ----------------------------------------------------------------------

    async def _remember(self, domain: str, entry: CachedPolicy) -> None:
        self._cache[domain] = entry
        if len(self._cache) > self._max_entries:
            by_expiry = sorted(self._cache, key=lambda d: self._cache[d].expires)
            for old in by_expiry[: len(self._cache) - self._max_entries]:
                del self._cache[old]
        await self._save()

    async def _forget(self, domain: str) -> None:
        if self._cache.pop(domain, None) is not None:
            await self._save()

    async def _save(self) -> None:
        if self._path is None:
            return
        snapshot = _dump(self._cache)
        async with self._write_lock:
            await asyncio.to_thread(_write, self._path, snapshot)


def _dump(cache: dict[str, CachedPolicy]) -> dict[str, Any]:
    return {
        "version": 1,
        "policies": {
            domain: {
                "id": entry.policy.id,
                "mode": entry.policy.mode.value,
                "mx": list(entry.policy.mx),
                "max_age": entry.policy.max_age,
                "text": list(entry.policy.text),
                "fetched_at": entry.fetched_at,
            }
            for domain, entry in cache.items()
        },
    }


def _write(path: Path, data: dict[str, Any]) -> None:
    temporary = ""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".mta-sts-")
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(data, out)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except OSError as exc:
        if temporary:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
        log.warning("%s: MTA-STS cache not written: %s", path, exc)


def _read(path: Path | None) -> dict[str, CachedPolicy]:
    """The cache a previous run wrote; entries that do not parse are left out."""
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        policies = data["policies"]
        if not isinstance(policies, dict):
            raise TypeError("policies is not an object")
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("%s: MTA-STS cache not read back (%s); policies are fetched again", path, exc)
        return {}
    cache: dict[str, CachedPolicy] = {}
    for domain, raw in policies.items():
        try:
            policy = StsPolicy(
                id=str(raw["id"]),
                mode=StsMode(raw["mode"]),
                mx=tuple(str(p) for p in raw["mx"]),
                max_age=int(raw["max_age"]),
                text=tuple(str(t) for t in raw.get("text", ())),
            )
            cache[str(domain)] = CachedPolicy(policy, float(raw["fetched_at"]))
        except (KeyError, ValueError, TypeError):
            continue
    return cache
