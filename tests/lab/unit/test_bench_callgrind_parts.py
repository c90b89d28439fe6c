"""``bench callgrind``'s pure parts: a callgrind file's total and process, the figures per
session or message (the larger run minus the smaller), callgrind_annotate's lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from mailsluice_lab.bench import callgrind

pytestmark = pytest.mark.unit

ANNOTATED = """\
--------------------------------------------------------------------------------
Ir                   file:function
--------------------------------------------------------------------------------
82,680,122 ( 7.21%)  /tmp/build/Python-3.11.7/Python/ceval.c:_PyEval_EvalFrameDefault'2 [/x/libpython3.11.so.1.0]
 1,000,000 ( 0.10%)  /tmp/build/Python-3.11.7/Python/ceval.c:_PyEval_EvalFrameDefault [/x/libpython3.11.so.1.0]
26,507,000 ( 2.00%)  ???:0x00000000000ff650 [/usr/lib/x86_64-linux-gnu/libsqlite3.so.0.8.6]
   120,191 ( 0.01%)  build/__native_mailsluice.c:CPyDef_lines___Line [/w/src/mailsluice__mypyc.so]
PROGRAM TOTALS
"""  # noqa: E501


def test_annotated_functions_by_name_with_recursion_folded() -> None:
    assert callgrind.parse_functions(ANNOTATED) == {
        "ceval.c:_PyEval_EvalFrameDefault": 83_680_122,
        "???:0x00000000000ff650 [libsqlite3.so.0.8.6]": 26_507_000,
        "__native_mailsluice.c:CPyDef_lines___Line": 120_191,
    }


def test_a_callgrind_file_its_total_and_its_process(tmp_path: Path) -> None:
    head = "version: 1\ncreator: callgrind-3.19.0\npid: 7\ncmd:  {cmd}\n"
    files = {
        "w": ("/v/python -m mailsluice serve --listen 127.0.0.1:1", "summary: 1000\n"),
        "l": ("/v/python -m mailsluice.sessionlog.child", "fn=x\n5 3\ntotals: 400\n"),
        "o": ("/sbin/ldconfig -p", "totals: 5\n"),
        "t": ("/v/python -c from mailsluice.runtime.tls.client import make_pair_child; "
              "make_pair_child()", "totals: 900\n"),
    }  # fmt: skip
    profiles = []
    for name, (cmd, tail) in files.items():
        (tmp_path / name).write_text(head.format(cmd=cmd) + tail)
        profiles.append(callgrind.read_profile(tmp_path / name))
    assert [(p.role, p.instructions) for p in profiles] == [
        ("worker", 1000), ("log-writer", 400), ("other", 5), ("tls-pair", 900)
    ]  # fmt: skip
    # the pair is made once, in whichever run finds none: not a per-message cost
    assert callgrind.by_role(profiles * 2) == {"worker": 2000, "log-writer": 800, "other": 10}


def test_per_unit_is_the_growth_between_the_runs() -> None:
    small = {"worker": 3_000_000, "log-writer": 600_000}
    large = {"worker": 7_000_000, "log-writer": 1_400_000, "other": 0}
    assert callgrind.per_unit(small, large, 1000) == {
        "log-writer": 800, "other": 0, "worker": 4000, "all": 4800,
    }  # fmt: skip
