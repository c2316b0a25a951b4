"""The benchmark runs end to end on tiny sizes and reports every number it promises (speed is not asserted)."""

import json
from pathlib import Path

import pytest

from configs import default
from rivet_jax.bench import benchmark
from rivet_jax.settings import LossWeights, Optim, UpdateRule


@pytest.mark.slow
def test_benchmark_reports_everything(tmp_path):
    result = benchmark.run_benchmark(default.get_config("tiny"), num_transitions=200, num_models=3, single_steps=5,
                                     runs=3)
    assert result["td_update"]["flops"] > 0 and 0 < result["td_update"]["fraction_of_matmul"]
    group = result["run_group"]
    assert group["runs"] == 3
    assert all(group[how]["steps_per_epoch"] == 200 // 16 and group[how]["run_steps_per_s"] > 0
               for how in ("vmapped", "per_run"))
    assert 0 < result["routing"]["p50_us"] <= result["routing"]["p99_us"]
    assert result["offline_training"]["total_s"] > 0
    table = benchmark.format_table(result)
    assert table.splitlines()[1].lstrip().startswith("machine reference: 2048^2 matmul")  # read first
    for line in ("TD+CQL update, achieved", "routing, one decision", "offline training",
                 "reproduction training: 3 runs vmapped"):
        assert line in table
    benchmark.write_json(result, tmp_path / "bench.json")
    assert json.loads((tmp_path / "bench.json").read_text())["sizes"]["transitions"] == 200


def _dot_flops(jaxpr) -> int:
    """2 x (output elements) x (contracted size) for every dot_general in a jaxpr, sub-jaxprs included."""
    import numpy as np
    from jax.extend import core

    total = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (lhs_contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            total += 2 * int(np.prod(eqn.outvars[0].aval.shape)) * int(np.prod([lhs[i] for i in lhs_contract]))
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(sub, core.ClosedJaxpr):
                    total += _dot_flops(sub.jaxpr)
                elif isinstance(sub, core.Jaxpr):
                    total += _dot_flops(sub)
    return total


def test_analytic_update_flops_match_the_matmuls_jax_traces():
    import jax
    import numpy as np

    from rivet_jax.corpus import gather_batch
    from rivet_jax.learner import make_optimizer, make_update, template_state
    from rivet_jax.networks import make_network

    config = default.get_config("tiny")
    pool = benchmark.synthetic_pool(3)
    data = benchmark.synthetic_data(50, config.encoder.dim, pool)
    net, tx = make_network(config), make_optimizer(Optim.of(config))
    batch = gather_batch(data, np.arange(config.optim.batch_size))
    for stage in ("mc", "td"):
        state = template_state(config.seed, net, tx, config.encoder.dim, pool, stage)
        traced = jax.make_jaxpr(make_update(net, tx, UpdateRule.of(config), stage))(state, batch, data.cards(),
                                                                               LossWeights.of(config))
        expected = _dot_flops(traced.jaxpr)
        assert benchmark.update_matmul_flops(config, 3, int(data.card_x.shape[1]), stage) == expected, stage


@pytest.mark.slow
def test_scaling_curves_measure_every_point_and_clean_up(tmp_path):
    config = default.get_config("tiny")
    scaling = benchmark._scaling(config, batch_sizes=(8, 16), candidates=(3,), corpus_sizes=(100,),
                                 disk_corpus_sizes=(100, 300), steps=4, directory=tmp_path)
    assert [p["x"] for p in scaling["batch_size"]] == [8, 16]
    disk = scaling["corpus_size_memory_mapped"]
    assert [p["x"] for p in disk] == [100, 300] and all(p["steps_per_s"] > 0 for p in disk)
    table_bytes = (2 * 300 + 6) * config.encoder.dim * 4 + 128  # (states + responses + cards) x dim float32, header
    assert round(disk[1]["table_gb"] * 1e9) == table_bytes
    assert not list(tmp_path.iterdir())  # the memory-mapped tables were deleted
    benchmark.plot_scaling(scaling, tmp_path / "scaling.png")
    assert (tmp_path / "scaling.png").stat().st_size > 0


@pytest.mark.slow
def test_the_proxy_overhead_benchmark_measures_every_request_of_every_scenario():
    from configs import serve
    from rivet_jax.bench.serve import format_serve_rows, serve_overhead

    result = serve_overhead(default.get_config("tiny"), serve.get_config(), encoders=("hashing",),
                            scenarios=((1, 0.0), (2, 0.01)), conversations=2, turns=3, feedback_words=20)
    rows = result["hashing"]
    assert [(r["clients"], r["upstream_latency_s"], r["requests"]) for r in rows.values()] == [(1, 0.0, 6),
                                                                                                (2, 0.01, 6)]
    assert all(0 < r["p50_ms"] <= r["p99_ms"] and r["requests_per_s"] > 0 for r in rows.values())
    assert [name for name, _, _ in format_serve_rows(result)] == ["hashing, 1 client, upstream 0 s",
                                                                  "hashing, 2 clients, upstream 0.01 s"]


FAKE_JOB = """
import json, sys, time
from pathlib import Path
from rivet_jax.progress import peak_rss_gb
held = bytearray(400 * 2**20)          # 400 MB, every page touched, held a moment as a job holds its memory
held[::4096] = b"x" * len(held[::4096])
time.sleep(0.5)
meta = {"seconds": 30.0, "phases": [{"phase": "collect", "seconds": 0.5, "peak_rss_gb": 0.1},
                                    {"phase": "train", "seconds": 10.0, "peak_rss_gb": 0.3},
                                    {"phase": "report", "seconds": 28.0, "peak_rss_gb": 0.35}]}
Path(sys.argv[1], "results.json").write_text(json.dumps({"experiments": {}, "meta": meta, "own": peak_rss_gb()}))
"""

# The launcher's own peak is 1.2 GB before it starts the job: on Linux, exec hands a child the peak of the memory
# it replaces, so getrusage's count (and the job's own, read that way) would say 1.2 GB.
LAUNCHER = """
import json, sys
from rivet_jax.bench import main_job
from rivet_jax.progress import peak_rss_gb
held = bytearray(1200 * 2**20)
held[::4096] = b"x" * len(held[::4096])
del held
result = main_job.run_main_job(sys.argv[1], command=[sys.executable, "-c", sys.argv[2], sys.argv[1]])
print(json.dumps({"result": result, "launcher": peak_rss_gb()}))
"""


def test_the_main_job_line_reports_each_phase_and_the_childs_own_peak_memory(tmp_path):
    import subprocess
    import sys

    from rivet_jax.bench import main_job

    run = subprocess.run([sys.executable, "-c", LAUNCHER, str(tmp_path), FAKE_JOB], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[1])
    measured = json.loads(run.stdout.splitlines()[-1])
    result = measured["result"]
    assert measured["launcher"] >= 1.2
    assert 0.4 <= result["peak_rss_gb"] < 0.9                     # the child's 400 MB, not the launcher's 1.2 GB
    assert 0.4 <= json.loads((tmp_path / "results.json").read_text())["own"] < 0.9     # and so says the child
    assert result["outside_phases_s"] == 0.0                      # it took far less than its phases say
    # Each phase runs from its mark to the next (the last to the job's end), its peak is the next mark's
    assert [(r["phase"], r["seconds"]) for r in result["phases"]] == [("collect", 9.5), ("train", 18.0),
                                                                      ("report", 2.0)]
    assert [r["peak_rss_gb"] for r in result["phases"]] == [0.3, 0.35, result["peak_rss_gb"]]
    rows = main_job.main_job_rows(result)
    assert rows[0][0] == "main job (reduced manifest)" and [r[0].split(": ")[1] for r in rows[1:-1]] == [
        "collect", "train", "report"]
    with pytest.raises(RuntimeError, match=r"exit 3(.|\n)*main_job.log:\nboom"):     # what it printed, from its log
        main_job.run_main_job(tmp_path / "failed", command=[sys.executable, "-c",
                                                           "import sys; print('bo' + 'om'); sys.exit(3)"])
