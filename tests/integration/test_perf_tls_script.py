"""The TLS handshake micro benchmark (``mailsluice_lab.perf.tls_handshake_cost``) still drives
``MxLeg.start_tls`` as it is: a few rounds of each mode against its MX (here on the test's
own loop), each mode checked to resume or not as it should (it asserts that itself)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from mailsluice.runtime.tls.contexts import ChainVerifier
from mailsluice_lab.perf import tls_handshake_cost as bench
from mailsluice_lab.perf.bench_pki import write_pki
from mailsluice_lab.processes import free_port

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("version", ["1.2", "1.3"])
async def test_the_tls_benchmark_measures_full_and_resumed_handshakes(
    tmp_path: Path, version: str
) -> None:
    mx_file, root = write_pki(tmp_path, "ecdsa")
    tls = bench.server_context(version, str(mx_file), str(mx_file))
    port = free_port()
    async with asyncio.TaskGroup() as group:
        server = group.create_task(bench.serve(port, tls))
        await asyncio.sleep(0.1)
        try:
            [run] = await bench.measure(port, os.getpid(), 3, 1, root)
        finally:
            server.cancel()
    assert run["off_us"] > 0
    assert run["resumed_us"] > 0
    assert run["ratio"] == run["resumed_us"] / run["off_us"]
    # the chain verifies against its root: the verifier the benchmark uses says so
    assert ChainVerifier(str(root)).verify_chain(_chain(mx_file))


def _chain(pem_file: Path) -> tuple[bytes, ...]:
    import ssl

    text = pem_file.read_text()
    blocks = text.split("-----END CERTIFICATE-----")[:-1]
    return tuple(
        ssl.PEM_cert_to_DER_cert(block[block.index("-----BEGIN CERTIFICATE-----") :]
                                 + "-----END CERTIFICATE-----")
        for block in blocks
    )  # fmt: skip
