"""Which models' copies changed since ``GET /status`` last looked: what the copy table feeds its report.

A report that carries only what changed (status_report.py) must learn what
changed without walking every copy on every call. The copy table
(copy_table.py) notes here the model each of its state changes touches, and
each copy it created notes every change to one of its fields
(``Copy.__setattr__``): a set of model ids, drained by the report builder.
So a copy that nobody touched costs a report nothing, and a field the
table gains later is covered without another hook. Noting a change is a
set insertion (the request path touches a copy two or three times).
"""
from __future__ import annotations

from typing import Iterable


class ChangeFeed:
    """Model ids whose copy (or failed load) changed since the last `drain`, and a change count."""

    def __init__(self) -> None:
        self._dirty: set[str] = set()
        self.count = 0  # how many changes were noted in all: unchanged means nothing moved

    def touch(self, model_id: str) -> None:
        self._dirty.add(model_id)
        self.count += 1

    def touch_all(self, model_ids: Iterable[str]) -> None:
        for model_id in model_ids:
            self.touch(model_id)

    def drain(self) -> set[str]:
        dirty, self._dirty = self._dirty, set()
        return dirty
