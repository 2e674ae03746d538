"""Following one worker's ``GET /status`` from a cursor: the reader's side of the delta protocol.

A whole report carries the pod's catalog and every copy (1.66 MB at 10,000
models), so a reader that asks every pod every few seconds for one reads, and
parses, in proportion to the catalog. The worker answers
``?since=<cursor>&limit=<n>`` with only what changed after the report that
gave the cursor (worker status_report.py; the names are ``wire.STATUS_SINCE``,
``wire.STATUS_LIMIT``, ``wire.FROM_SCRATCH``): an idle pod's answer is a few
hundred bytes whatever it holds. The reader keeps the pod's copies as last
reported and applies each page:

- a page with ``delta`` false starts a whole state (first contact, a worker
  that restarted, a cursor older than what its log remembers): the copies it
  and the pages after it name replace what the reader held once the last page
  (``more`` false) is in; what they did not name is gone;
- a delta changes the copies it names and drops those ``removed_models``
  names;
- the pod's own figures (readiness, room, queue, preemptions) are current in
  every page.

A copy's times (since last use, since loaded, since a failure) and its
decayed request count are as of its report; ``aged`` moves them to any later
moment as the worker itself would (the one definition of it: the worker's
report builder ages its records with it), so a copy nobody touched needs no
new record. The router's model map applies pages into its own indexes
(router model_map.py); the operator follows each pod with ``StatusFollower``.
"""
from __future__ import annotations

from typing import Any

from hotset_common import wire

DEFAULT_PAGE = 500  # entries per page of a whole state: parsing one stays a few milliseconds


def aged(copy: wire.ModelCopy, elapsed: float, half_life_s: float) -> wire.ModelCopy:
    """`copy` as it stands `elapsed` seconds after it was reported, nothing having happened to it."""
    if elapsed <= 0:
        return copy
    changed: dict[str, Any] = {}
    if copy.state in (wire.CopyState.READY, wire.CopyState.UNLOADING):
        changed["last_used_s"] = copy.last_used_s + elapsed
        changed["loaded_at_s"] = copy.loaded_at_s + elapsed
    if copy.state is wire.CopyState.FAILED:
        changed["failed_at_s"] = copy.failed_at_s + elapsed
    if copy.frequency:
        changed["frequency"] = copy.frequency * 0.5 ** (elapsed / half_life_s)
    return copy.model_copy(update=changed) if changed else copy


class StatusFollower:
    """One pod's reports, followed from the cursor of the last one applied (catalogs are not kept:
    this reader needs the copies and the pod's figures)."""

    def __init__(self, page: int = DEFAULT_PAGE) -> None:
        self.page = page
        self.cursor = ""  # of the last page applied; "": nothing yet (ask for the whole state)
        self._copies: dict[str, tuple[wire.ModelCopy, float]] = {}  # id -> (copy, the moment it was asked for)
        self._reading: dict[str, tuple[wire.ModelCopy, float]] | None = None  # a whole state coming in, page by page
        self._figures: wire.WorkerStatus | None = None  # the last page, without its copies and entries
        self._whole = False  # a whole state has come in since the reader started

    def query(self) -> dict[str, str]:
        """The parameters of the next ``GET /status``."""
        return {wire.STATUS_SINCE: self.cursor or wire.FROM_SCRATCH, wire.STATUS_LIMIT: str(self.page)}

    def apply(self, status: wire.WorkerStatus, asked_at: float) -> bool:
        """Take one page, asked for at `asked_at` (the reader's clock); True when nothing more waits
        (the next page would be asked for on the next pass)."""
        if not status.delta:
            self._reading = {}
        into = self._reading if self._reading is not None else self._copies
        for copy in status.models:
            into[copy.id] = (copy, asked_at)
        for model in status.removed_models:
            into.pop(model, None)
        if self._reading is not None and not status.more:
            self._copies, self._reading, self._whole = self._reading, None, True
        self._figures = status.model_copy(update={"models": [], "catalog": [], "removed_models": [],
                                                  "removed_catalog": []})
        self.cursor = status.cursor  # a worker without cursors answers whole each time: "" asks again so
        return not (status.more and status.cursor)

    @property
    def complete(self) -> bool:
        """Whether the reader holds a whole state (none is being read page by page)."""
        return self._whole and self._reading is None

    def report(self, now: float) -> wire.WorkerStatus | None:
        """The pod's whole report as of `now` (its copies aged), in id order as a whole report lists
        them; None until a whole state has come in."""
        if not self.complete or self._figures is None:
            return None
        half_life = self._figures.demand_half_life_s
        copies = [aged(copy, now - at, half_life) for _, (copy, at) in sorted(self._copies.items())]
        return self._figures.model_copy(update={"models": copies, "delta": False, "more": False})

    def copies(self) -> int:
        return len(self._copies)
