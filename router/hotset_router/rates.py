"""Each namespace's request rate, as its ModelQuota allows (``requestsPerSecond``, ``burst``).

One token bucket per namespace with a limit, filled at the quota's rate up
to its burst; a request for one of the namespace's models takes a token,
or is refused with 429 and a ``Retry-After`` of when the next token is due,
naming the quota. Every router replica enforces its share (the rate and the
burst divided by the replicas the workers report, replicas.py), so R
replicas together allow what the quota says, whichever replica a client's
connections land on, without talking to each other: the split is exact when
the Service spreads requests evenly, and a client pinned to one replica gets
its share of that replica only. The check follows the caller's (callers.py),
so requests that would be refused anyway spend nobody's rate. A namespace
without a limit costs one dictionary lookup.
"""
from __future__ import annotations

import math
import time
from typing import Callable

from hotset_common import errors
from hotset_common.spec import RequestRate


class NamespaceRates:
    def __init__(self, rate_of: Callable[[str], RequestRate | None], replicas: Callable[[], int] = lambda: 1,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate_of = rate_of  # the namespace's strictest ModelQuota limit (discovery)
        self.replicas = replicas
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # namespace -> (tokens, when counted)

    def take(self, namespace: str | None) -> None:
        """One request for a model of `namespace`: pass, or 429 with Retry-After."""
        rate = self.rate_of(namespace) if namespace else None
        if rate is None:
            return
        share = max(1, self.replicas())
        per_second, burst = rate.per_second / share, max(1.0, rate.burst / share)
        now = self.clock()
        tokens, counted = self._buckets.get(namespace, (burst, now))  # type: ignore[arg-type]
        tokens = min(burst, tokens + (now - counted) * per_second)
        if tokens < 1.0:
            self._buckets[namespace] = (tokens, now)  # type: ignore[index]
            wait_s = (1.0 - tokens) / per_second
            raise errors.TooManyRequests(
                f"namespace {namespace!r} is over its request rate: its ModelQuota allows {rate.per_second:g} "
                f"requests a second (burst {rate.burst}) through the routers, {per_second:g} through each of "
                f"{share}; the next is due in {wait_s:.2f} s", retry_after_s=max(1, math.ceil(wait_s)))
        self._buckets[namespace] = (tokens - 1.0, now)  # type: ignore[index]


NO_RATES = NamespaceRates(lambda namespace: None)
