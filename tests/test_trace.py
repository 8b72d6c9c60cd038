"""The Chrome trace: one track per client, one complete event per non-empty span."""

import json

from edgefl.report.trace import chrome_trace
from edgefl.sim.engine import Span


def test_chrome_trace_events_by_hand():
    spans = [Span(0, 1, "download", 0.0, 0.5), Span(0, 1, "compute", 0.5, 2.0),
             Span(0, 0, "wait", 1.0, 1.0)]  # an empty span leaves no event
    trace = chrome_trace(spans, ["esp32_s3", "iphone_12"])
    json.dumps(trace)  # serialisable
    events = trace["traceEvents"]
    tracks = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert tracks == {0: "client 0 (esp32_s3)", 1: "client 1 (iphone_12)"}
    spans_out = [e for e in events if e["ph"] == "X"]
    assert [(e["name"], e["tid"], e["ts"], e["dur"]) for e in spans_out] == [
        ("download", 1, 0.0, 500_000.0), ("compute", 1, 500_000.0, 1_500_000.0)]


def test_a_run_writes_a_trace_whose_straggler_spans_add_up_to_the_clock(tmp_path):
    from pathlib import Path

    from edgefl.experiment import prepare, run
    from edgefl.scenario import load_scenario

    quickstart = Path(__file__).resolve().parents[1] / "scenarios" / "quickstart.toml"
    s = load_scenario(quickstart, ["rounds=1", "training.local_iters=1", "attack.steps=1",
                                   "evaluation.steps=1", "data.test_samples=16"])
    summary = run(prepare(s, str(quickstart)), tmp_path, progress=False)
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    tracks = [e for e in events if e.get("name") == "thread_name"]
    assert len(tracks) == s.fleet.clients
    busy: dict[int, float] = {}
    for e in events:
        if e["ph"] == "X":
            busy[e["tid"]] = busy.get(e["tid"], 0.0) + e["dur"]
    # every selected client's spans (its work plus its wait) fill the one round exactly
    assert len(busy) == round(s.fleet.sample_fraction * s.fleet.clients)
    for total in busy.values():
        assert abs(total / 1e6 - summary["sim_time_s"]) < 1e-6 * summary["sim_time_s"]
