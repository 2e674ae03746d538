"""/status from a cursor: a report carries only what changed since the caller's last one, pages a whole
state, and starts afresh from a cursor it cannot answer (a real worker, ballast models)."""
from __future__ import annotations

import httpx

from hotset_common import wire
from hotset_testing import ballast_framework as ballast
from hotset_testing.ballast_framework import MiB
from hotset_testing.worker_server import ballast_app, serve_in_thread, wait_until
from hotset_worker.status_report import ChangeLog

MODELS = {f"m{i:03d}": {"size": MiB, "memory": MiB} for i in range(200)}


def status(client: httpx.Client, since: str | None = None, limit: int | None = None,
           router: str | None = None) -> tuple[wire.WorkerStatus, int]:
    params = {k: v for k, v in {wire.STATUS_SINCE: since, wire.STATUS_LIMIT: limit}.items() if v is not None}
    headers = {wire.ROUTER_ID_HEADER: router} if router else {}
    response = client.get("/status", params=params, headers=headers)
    assert response.status_code == 200, response.text
    return wire.WorkerStatus.model_validate_json(response.content), len(response.content)


def whole_state(client: httpx.Client, limit: int) -> tuple[list[wire.WorkerStatus], str]:
    """Every page of a whole state from scratch, and the cursor after the last."""
    pages = [status(client, wire.FROM_SCRATCH, limit)[0]]
    while pages[-1].more:
        pages.append(status(client, pages[-1].cursor, limit)[0])
    return pages, pages[-1].cursor


def test_a_report_from_a_cursor_carries_only_what_changed(tmp_path) -> None:
    store = ballast.catalog(tmp_path, MODELS)
    with serve_in_thread(ballast_app(store, budget=64 * MiB)) as url, httpx.Client(base_url=url) as client:
        assert client.post("/predict", json={"model_id": "m001", "input_data": [1]}).status_code == 200
        pages, cursor = whole_state(client, limit=1000)
        assert len(pages) == 1 and not pages[0].delta and len(pages[0].catalog) == 200
        assert [c.id for c in pages[0].models] == ["m001"]

        idle, idle_bytes = status(client, cursor)
        assert idle.delta and idle.models == [] and idle.catalog == [] and idle.removed_models == []
        assert idle.ready and idle.used_bytes == MiB  # the pod's own figures are in every report
        _, whole_bytes = status(client)
        assert idle_bytes * 20 < whole_bytes  # an idle pod's report costs a sliver of the whole state

        assert client.post("/predict", json={"model_id": "m007", "input_data": [1]}).status_code == 200
        changed, _ = status(client, idle.cursor)
        assert [c.id for c in changed.models] == ["m007"] and changed.models[0].state is wire.CopyState.READY
        assert {e.id for e in changed.catalog} <= {"m007"} and changed.removed_models == []

        assert client.post("/v2/repository/models/m007/unload").status_code == 200
        gone = wait_until(lambda: (report := status(client, changed.cursor)[0]).removed_models and report,
                          what="the unload in a report")
        assert gone.removed_models == ["m007"] and [c.id for c in gone.models] == []

        again, _ = status(client, gone.cursor)
        assert again.models == [] and again.removed_models == []  # reported once, not on every report


def test_a_whole_state_comes_in_pages_and_then_only_changes(tmp_path) -> None:
    store = ballast.catalog(tmp_path, MODELS)
    with serve_in_thread(ballast_app(store, budget=64 * MiB)) as url, httpx.Client(base_url=url) as client:
        for model in ("m010", "m020", "m030"):
            assert client.post("/predict", json={"model_id": model, "input_data": [1]}).status_code == 200
        pages, cursor = whole_state(client, limit=64)
        assert len(pages) == 4 and not pages[0].delta and all(p.delta for p in pages[1:])
        assert all(len(p.catalog) + len(p.models) <= 64 for p in pages)
        assert sorted(e.id for p in pages for e in p.catalog) == sorted(MODELS)
        assert sorted(c.id for p in pages for c in p.models) == ["m010", "m020", "m030"]
        assert [p.more for p in pages] == [True, True, True, False]
        assert status(client, cursor)[0].catalog == []


def test_a_cursor_the_worker_cannot_answer_gets_the_whole_state(tmp_path) -> None:
    store = ballast.catalog(tmp_path, MODELS)
    with serve_in_thread(ballast_app(store, budget=64 * MiB)) as url, httpx.Client(base_url=url) as client:
        stale, _ = status(client, "0123abcd.5")  # another process of the worker (it restarted since)
        assert not stale.delta and len(stale.catalog) == 200 and not stale.more
        assert status(client, stale.cursor)[0].delta


def test_bad_cursors_and_limits_are_400s_naming_the_parameter(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"a": {}})
    with serve_in_thread(ballast_app(store, budget=64 * MiB)) as url, httpx.Client(base_url=url) as client:
        for params, name in (({"since": "nonsense"}, "since"), ({"since": "x." + "9" * 200}, "since"),
                             ({"since": "0", "limit": "0"}, "limit"), ({"since": "0", "limit": "many"}, "limit")):
            response = client.get("/status", params=params)
            assert response.status_code == 400 and name in response.json()["error"], (params, response.text)
        assert client.get("/status").status_code == 200  # and the next report is served


def test_every_report_lists_the_routers_that_asked_lately(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"a": {}})
    with serve_in_thread(ballast_app(store, budget=64 * MiB)) as url, httpx.Client(base_url=url) as client:
        status(client, wire.FROM_SCRATCH, router="router-a")
        report, _ = status(client, wire.FROM_SCRATCH, router="router-b")
        assert report.routers == ["router-a", "router-b"]


def test_the_change_log_answers_in_order_of_change_and_forgets_old_removals() -> None:
    log = ChangeLog(epoch="e", max_tombstones=4)
    for key in "abcdef":
        log.put(key, key.upper())
    log.put("b", "B2")  # b changed again: listed once, at its last change
    found, version, more = log.since(0, limit=100)
    assert [k for k, _ in found] == ["a", "c", "d", "e", "f", "b"] and not more and version == log.version
    first, at, more = log.since(0, limit=2)
    assert [k for k, _ in first] == ["a", "c"] and more
    assert [k for k, _ in log.since(at, limit=100)[0]] == ["d", "e", "f", "b"]
    before_removals = log.version
    for key in "abcdef":
        log.put(key, None)  # six removals: more than the log keeps
    assert not log.answers(before_removals)  # a cursor from before them gets the whole state instead
    assert log.answers(log.version) and list(log.live()) == []
