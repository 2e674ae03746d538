"""The router's per-model series are bounded however many models there are: at most the limit of models
have series of their own, the rest are counted under model="_other", and idle models give theirs up."""
from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hotset_router.telemetry import OTHER_MODELS, UNKNOWN_MODEL, RouterMetrics


def model_labels(metrics: RouterMetrics) -> dict[str, float]:
    """model label -> requests counted under it."""
    counted: dict[str, float] = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for sample in family.samples:
            if sample.name == "hotset_router_requests_total":
                counted[sample.labels["model"]] = counted.get(sample.labels["model"], 0) + sample.value
    return counted


def test_ten_thousand_models_make_at_most_the_limit_of_per_model_series():
    now = [0.0]
    metrics = RouterMetrics(max_model_series=50, series_idle_s=60, clock=lambda: now[0])
    for request in range(20_000):
        metrics.request(metrics.label(f"m{request % 10_000}"), 200, 0.003)
    metrics.request(metrics.label("no-such-model", known=False), 404, 0.001)
    counted = model_labels(metrics)
    assert len(counted) == 52 and counted[OTHER_MODELS] == 20_000 - 50 * 2 and counted[UNKNOWN_MODEL] == 1
    assert sum(counted.values()) == 20_001  # sums over models stay exact
    metrics.before_scrape(pods=3)
    assert metrics.model_series._value.get() == 50


def test_a_model_idle_past_its_time_gives_its_series_to_another():
    now = [0.0]
    metrics = RouterMetrics(max_model_series=2, series_idle_s=60, clock=lambda: now[0])
    for model in ("a", "b", "c"):
        metrics.request(metrics.label(model), 200, 0.01)
    assert set(model_labels(metrics)) == {"a", "b", OTHER_MODELS}
    now[0] = 30.0
    metrics.request(metrics.label("a"), 200, 0.01)  # a is still in use
    now[0] = 70.0
    metrics.request(metrics.label("c"), 200, 0.01)  # b has been idle for 70 s: its series go, c gets its own
    assert set(model_labels(metrics)) == {"a", "c", OTHER_MODELS}
