"""The benchmark runs end to end on tiny sizes and reports every number it promises (speed is not asserted)."""

import json

from configs import default
from rivet_jax import benchmark


def test_benchmark_reports_everything(tmp_path):
    result = benchmark.run_benchmark(default.get_config("tiny"), num_transitions=200, num_models=3, single_steps=5)
    assert result["td_update"]["flops"] > 0 and 0 < result["td_update"]["fraction_of_matmul"]
    assert 0 < result["routing"]["p50_us"] <= result["routing"]["p99_us"]
    assert result["offline_training"]["total_s"] > 0
    table = benchmark.format_table(result)
    for line in ("TD+CQL update, achieved", "routing, one decision", "offline training"):
        assert line in table
    benchmark.write_json(result, tmp_path / "bench.json")
    assert json.loads((tmp_path / "bench.json").read_text())["sizes"]["transitions"] == 200
