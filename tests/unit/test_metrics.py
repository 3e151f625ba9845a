"""Metrics: one module defines them all, Prometheus naming holds, and /metrics serves them."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from bigfleet import metrics


def defined() -> list[Counter | Gauge | Histogram]:
    return [
        value
        for name in metrics.__all__
        if isinstance(value := getattr(metrics, name), Counter | Gauge | Histogram)
    ]


def test_every_metric_is_named_bigfleet_subsystem_what_with_its_unit_suffix() -> None:
    for metric in defined():
        name = metric._name
        assert name.startswith("bigfleet_"), name
        assert name.count("_") >= 2, f"{name}: bigfleet_<subsystem>_<what>"
        if isinstance(metric, Counter):
            # prometheus_client keeps a counter's name without _total and adds it on export.
            assert not name.endswith("_total"), name
        if isinstance(metric, Histogram):
            assert name.endswith("_seconds"), f"{name}: histograms here measure time"
        if isinstance(metric, Gauge):
            # A gauge in seconds (a loop's lag, the longest pause) says so, as Prometheus
            # names base units; it is never a histogram's family nor a counter's.
            assert not name.endswith("_total"), name
            assert name not in {m._name for m in defined() if not isinstance(m, Gauge)}, name


def test_labels_never_name_a_machine_or_a_cluster() -> None:
    for metric in defined():
        assert not {"machine", "machine_id", "cluster", "cluster_id"} & set(metric._labelnames), (
            metric._name
        )


def test_the_endpoint_serves_the_registry_on_the_port_asked_for() -> None:
    registry = CollectorRegistry()
    Counter("bigfleet_test_things", "things", registry=registry).inc(3)
    server = metrics.serve("127.0.0.1:0", registry=registry)
    try:
        with urllib.request.urlopen(f"http://{server.address}/metrics", timeout=5) as response:
            body = response.read().decode()
    finally:
        server.stop()

    assert "bigfleet_test_things_total 3.0" in body


@pytest.mark.parametrize("listen", ["9090", "host:", "host:port"])
def test_a_listen_address_without_a_port_names_the_setting(listen: str) -> None:
    with pytest.raises(ValueError, match="BIGFLEET_METRICS_LISTEN"):
        metrics.serve(listen)
