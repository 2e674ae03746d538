"""When a request must be answered: the router's request timeout, or the caller's shorter one.

Deadlines are event-loop times, so every part that waits for a request
(forwarding, a cold load it joined, a pod starting for it) measures the
same budget.
"""
from __future__ import annotations

import asyncio
from typing import Mapping

from hotset_common.wire import TIMEOUT_HEADER, parse_timeout


class Deadlines:
    def __init__(self, request_timeout_s: float = 60.0) -> None:
        self.request_timeout_s = request_timeout_s

    def deadline(self, headers: Mapping[str, str] | None = None) -> float:
        """The router's request timeout from now, or the caller's shorter ``X-Hotset-Timeout``."""
        asked = parse_timeout((headers or {}).get(TIMEOUT_HEADER))
        budget = self.request_timeout_s if asked is None else min(self.request_timeout_s, asked)
        return asyncio.get_running_loop().time() + budget

    @staticmethod
    def time_left(deadline: float) -> float:
        return max(0.0, deadline - asyncio.get_running_loop().time())
