"""Start-up objects kept out of the garbage collector's full passes.

A full collection (generation 2) looks into every container object the
process holds, and it runs on whatever thread allocated last: for a server,
the event loop. What a process makes at start-up (the modules it imported,
their functions and classes, the app) lives until it exits, yet every full
pass walks it again: about 78,000 objects and 36-40 ms on this project's
2-core machine for the router's imports (FastAPI, pydantic, aiohttp, grpc),
the longest stretch an idle router's event loop had; the router's map of
its first reports (10,000 copies: 20,000 objects) another 2-14 ms.
``freeze_start_up`` moves what exists into the collector's permanent
generation (``gc.freeze``) once, before serving (the router calls it after
its first status pass, in its app's start-up): full passes then cost what
was made since. What it costs: an object frozen now that later becomes
garbage in a reference cycle is kept until exit (one without a cycle is
freed by its reference count as ever, as the map's copies and entries are
when reports replace them); before serving, few such objects exist.
"""
from __future__ import annotations

import gc


def freeze_start_up() -> int:
    """Collect once, then keep everything alive now out of later passes; how many objects that was."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
