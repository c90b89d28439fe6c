"""Message filters for tests, loaded the way operators load theirs (``use = "module:attr"``)."""

from __future__ import annotations

import asyncio
from typing import Any

from mailsluice.filtering.api import (
    Accept,
    AddHeader,
    EditHeaders,
    FilterMessage,
    Reject,
    Replace,
    Verdict,
)


class Scripted:
    """Answers what its options say: ``verdict`` accept | reject | replace | header |
    raise | hang | positive | none; ``delay`` seconds first; ``only_if``: the verdict is
    for messages containing these bytes, the others are accepted."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.name = str(options.get("name", "scripted"))
        self.verdict = str(options.get("verdict", "accept"))
        self.delay = float(options.get("delay", 0.0))
        only_if = options.get("only_if")
        self.only_if = str(only_if).encode() if only_if is not None else None
        self.seen: list[FilterMessage] = []

    async def filter(self, message: FilterMessage) -> Verdict:
        self.seen.append(message)
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.only_if is not None and self.only_if not in message.raw():
            return Accept()
        match self.verdict:
            case "reject":
                return Reject(550, "5.7.1 Message refused by the test filter")
            case "tempfail":
                return Reject(451, "4.7.1 Try again later, says the test filter")
            case "replace":
                return Replace(b"Subject: replaced\n\n.a line with a dot\nbare LF body\n")
            case "header":
                return EditHeaders(add=(AddHeader("X-Test-Filter", "seen", index=0),))
            case "raise":
                raise RuntimeError("the test filter crashed")
            case "hang":
                await asyncio.sleep(3600)
            case "positive":
                return Reject(250, "2.0.0 this is not a rejection")
            case "none":
                return None  # type: ignore[return-value]
        return Accept()
