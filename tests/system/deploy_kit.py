"""The deployment kit's interception rules (``deploy/nftables``, ``deploy/iptables``),
applied as written in throw-away network namespaces.

:func:`rules_text` reads a documented file and replaces only its marked placeholders:
the values of its ``define ... # EDIT`` lines (nftables) or the exact words its ``EDIT``
comment names (iptables; each must occur, so a file that loses a placeholder fails the
test instead of being applied unedited). :func:`apply_rules` loads the result with
``nft -f`` or ``iptables-restore``/``ip6tables-restore --noflush`` inside a namespace.

The three topologies, built with :mod:`mailsluice_lab.netns.plumbing` on private
addresses (10.252.0.0/16, fd6d:736d::/32) that exist only inside the namespaces:

* :func:`gateway_net`: ``msa`` -> ``gw`` (routes, runs mailsluice) -> ``mx``;
* :func:`same_host_net`: ``host`` (MSA and mailsluice side by side) -> ``mx``;
* :func:`container_net`: ``c1``, ``c2`` (containers on the bridge ``br-ct`` of
  ``host``, which runs mailsluice and routes) -> ``mx``.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from mailsluice_lab.netns.plumbing import (
    Namespace,
    address,
    default_route,
    link,
    namespaces,
    sh,
)

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
_DEFINE = re.compile(r"^define (\w+) = .*# EDIT", re.MULTILINE)


def require_nft() -> None:
    if shutil.which("nft") is None:
        pytest.skip("nft missing (apt-get install nftables; scripts/bootstrap does)")


def rules_text(path: Path, values: Mapping[str, str]) -> str:
    """The file's text with its placeholders replaced: for ``.nft`` files ``values`` maps
    a ``define`` name to its new value (every ``# EDIT`` define must be given); for the
    iptables files it maps a word of the file to its replacement (each must occur)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".nft":
        marked = set(_DEFINE.findall(text))
        assert marked == set(values), f"{path.name}: EDIT defines {marked}, given {set(values)}"
        for name, value in values.items():
            text = re.sub(
                rf"^define {name} = (.*?)(\s+# EDIT)", rf"define {name} = {value}\2", text,
                count=1, flags=re.MULTILINE,
            )  # fmt: skip
        return text
    edit = _edit_comment(text)
    for old, new in values.items():
        assert old.split()[-1] in edit, f"{path.name}: {old!r} is not an EDIT placeholder"
        assert old in text, f"{path.name}: no {old!r} to replace"
        text = text.replace(old, new)
    return text


def _edit_comment(text: str) -> str:
    """The comment lines from ``# EDIT:`` on, up to the first line that is no comment."""
    first, *rest = text.split("# EDIT:", 1)[1].splitlines()
    block = [first]
    for line in rest:
        if not line.startswith("#"):
            break
        block.append(line)
    return "\n".join(block)


def apply_rules(ns: Namespace, path: Path, values: Mapping[str, str]) -> None:
    """Load the edited file into ``ns`` with the tool it is written for."""
    tool = {".nft": ["nft", "-f"], ".v4": ["iptables-restore", "--noflush"]}.get(
        path.suffix, ["ip6tables-restore", "--noflush"]
    )
    with tempfile.NamedTemporaryFile("w", suffix=path.suffix, encoding="utf-8") as edited:
        edited.write(rules_text(path, values))
        edited.flush()
        ns.run(*tool, edited.name)


def rule_files(tool: str, topology: str) -> list[Path]:
    """The files of one topology for ``nftables`` (one, both families) or ``iptables``
    (``.v4`` and ``.v6``)."""
    if tool == "nftables":
        return [DEPLOY / "nftables" / f"{topology}.nft"]
    return [DEPLOY / "iptables" / f"{topology}.v4", DEPLOY / "iptables" / f"{topology}.v6"]


@dataclass(frozen=True, slots=True)
class Net:
    """A topology's namespaces (by role) and addresses (by name)."""

    ns: Mapping[str, Namespace]
    ip: Mapping[str, str]


def _wire(plan: list[tuple[Namespace, str, str]], routes: list[tuple[Namespace, str]]) -> None:
    for where, ifname, cidr in plan:
        address(where, ifname, cidr)
    for where, via in routes:
        default_route(where, via)


@contextmanager
def gateway_net() -> Iterator[Net]:
    with namespaces("msa", "gw", "mx") as ns:
        msa, gw, mx = ns["msa"], ns["gw"], ns["mx"]
        link(msa, "eth0", gw, "lan0")
        link(gw, "wan0", mx, "eth0")
        ip = {
            "client": "10.252.1.2", "client6": "fd6d:736d:1::2",
            "gw_lan": "10.252.1.1", "gw_lan6": "fd6d:736d:1::1",
            "gw_wan": "10.252.2.1", "gw_wan6": "fd6d:736d:2::1",
            "mx": "10.252.2.2", "mx6": "fd6d:736d:2::2",
        }  # fmt: skip
        _wire(
            [
                (msa, "eth0", f"{ip['client']}/24"), (msa, "eth0", f"{ip['client6']}/64"),
                (gw, "lan0", f"{ip['gw_lan']}/24"), (gw, "lan0", f"{ip['gw_lan6']}/64"),
                (gw, "wan0", f"{ip['gw_wan']}/24"), (gw, "wan0", f"{ip['gw_wan6']}/64"),
                (mx, "eth0", f"{ip['mx']}/24"), (mx, "eth0", f"{ip['mx6']}/64"),
            ],
            [(msa, ip["gw_lan"]), (msa, ip["gw_lan6"]), (mx, ip["gw_wan"]), (mx, ip["gw_wan6"])],
        )  # fmt: skip
        gw.run("sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
        yield Net(ns, ip)


@contextmanager
def same_host_net() -> Iterator[Net]:
    with namespaces("host", "mx") as ns:
        host, mx = ns["host"], ns["mx"]
        link(host, "eth0", mx, "eth0")
        ip = {"host": "10.252.3.1", "host6": "fd6d:736d:3::1",
              "mx": "10.252.3.2", "mx6": "fd6d:736d:3::2"}  # fmt: skip
        _wire(
            [
                (host, "eth0", f"{ip['host']}/24"), (host, "eth0", f"{ip['host6']}/64"),
                (mx, "eth0", f"{ip['mx']}/24"), (mx, "eth0", f"{ip['mx6']}/64"),
            ],
            [],
        )  # fmt: skip
        yield Net(ns, ip)


@contextmanager
def container_net() -> Iterator[Net]:
    with namespaces("host", "c1", "c2", "mx") as ns:
        host, mx = ns["host"], ns["mx"]
        sh(["ip", "-n", host.name, "link", "add", "br-ct", "type", "bridge"])
        sh(["ip", "-n", host.name, "link", "set", "br-ct", "up"])
        ip = {
            "bridge": "10.252.4.1", "bridge6": "fd6d:736d:4::1",
            "c1": "10.252.4.2", "c1_6": "fd6d:736d:4::2",
            "c2": "10.252.4.3", "c2_6": "fd6d:736d:4::3",
            "host_wan": "10.252.5.1", "host_wan6": "fd6d:736d:5::1",
            "mx": "10.252.5.2", "mx6": "fd6d:736d:5::2",
        }  # fmt: skip
        plan = [(host, "br-ct", f"{ip['bridge']}/24"), (host, "br-ct", f"{ip['bridge6']}/64")]
        routes = []
        for name in ("c1", "c2"):
            link(ns[name], "eth0", host, f"v{name}")
            sh(["ip", "-n", host.name, "link", "set", f"v{name}", "master", "br-ct"])
            plan += [
                (ns[name], "eth0", f"{ip[name]}/24"),
                (ns[name], "eth0", f"{ip[name + '_6']}/64"),
            ]
            routes += [(ns[name], ip["bridge"]), (ns[name], ip["bridge6"])]
        link(host, "wan0", mx, "eth0")
        plan += [(host, "wan0", f"{ip['host_wan']}/24"), (host, "wan0", f"{ip['host_wan6']}/64")]
        plan += [(mx, "eth0", f"{ip['mx']}/24"), (mx, "eth0", f"{ip['mx6']}/64")]
        routes += [(mx, ip["host_wan"]), (mx, ip["host_wan6"])]
        _wire(plan, routes)
        host.run("sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
        yield Net(ns, ip)
