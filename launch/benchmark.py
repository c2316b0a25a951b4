r"""Benchmarks the MC and TD+CQL updates at the paper's sizes (against an eager PyTorch port when torch is installed),
the full offline training's wall time, routing latency, encoders, scaling curves, and the main job's seconds and
peak memory per phase on a reduced manifest (--main_job, the tiny reproduction by default).

  python -m launch.benchmark --config=configs/default.py --output=/tmp/rivet_bench.json

Prints a table and writes the numbers as JSON (and the scaling curves as <output>_scaling.png). With --serve,
only the routing proxy's overhead per request (launch.serve), at 1 and 16 concurrent clients (rivet_jax/bench/serve.py
says which scenarios), with the hashing encoder and MiniLM:

  python -m launch.benchmark --serve --output=/tmp/rivet_serve_bench.json
"""

from absl import flags
from ml_collections import config_flags

from launch.common import run_app
from rivet_jax.bench import benchmark
from rivet_jax.bench.main_job import MAIN_JOB

_CONFIG = config_flags.DEFINE_config_file("config", "configs/default.py", "Config file (sizes and settings).")
_OUTPUT = flags.DEFINE_string("output", "benchmark.json", "Where to write the JSON results.")
_TRANSITIONS = flags.DEFINE_integer("transitions", benchmark.PAPER_TRANSITIONS, "Replay size.")
_MODELS = flags.DEFINE_integer("models", 6, "Number of candidate models.")
_SCALING = flags.DEFINE_bool("scaling", True, "Also measure scaling curves (batch, candidates, corpus size).")
_ENCODERS = flags.DEFINE_bool("encoders", True, "Also measure frozen-encoder throughput.")
_PREFIX_REUSE = flags.DEFINE_bool("prefix_reuse", True, "Also measure Qwen3 prefix reuse on the MINT logs (skipped "
                                  "when --mint_dir or --qwen3_fixture is absent).")
_MINT = flags.DEFINE_string("mint_dir", "../shared/mint", "MINT logs for the prefix-reuse measurement.")
_RUNS = flags.DEFINE_integer("runs", 27, "Runs trained together in the run-group line (the reproduction's 27).")
_MAIN_JOB = flags.DEFINE_string("main_job", MAIN_JOB, "Config of the main job (launch.reproduce) run for "
                                "its seconds and peak memory per phase ('': skip).")
_SERVE = flags.DEFINE_bool("serve", False, "Only the routing proxy's overhead (rivet_jax/bench/serve.py).")
_SERVE_ENCODERS = flags.DEFINE_list("serve_encoders", ["hashing", "minilm"], "Encoders of the --serve benchmark.")
_QWEN3_FIXTURE = flags.DEFINE_string("qwen3_fixture", "../shared/fixtures/qwen3_tiny",
                                     "Tiny Qwen3 checkpoint timing the prefix-reuse paths.")


def main(argv):
    del argv
    reference = benchmark.matmul_flops_per_s()  # first, so that every time printed after reads against it
    print(f"machine reference: 2048^2 float32 matmul at {reference / 1e9:.0f} GFLOP/s", flush=True)
    if _SERVE.value:
        return _serve_benchmark(reference)
    result = benchmark.run_benchmark(_CONFIG.value, num_transitions=_TRANSITIONS.value, num_models=_MODELS.value,
                                     scaling=_SCALING.value, encoders=_ENCODERS.value, runs=_RUNS.value,
                                     prefix_reuse=(_MINT.value, _QWEN3_FIXTURE.value) if _PREFIX_REUSE.value else None,
                                     matmul_reference=reference, main_job=_MAIN_JOB.value or None)
    print(benchmark.format_table(result))
    benchmark.write_json(result, _OUTPUT.value)
    print(f"wrote {_OUTPUT.value}")
    if "scaling" in result:
        plot = str(_OUTPUT.value).rsplit(".", 1)[0] + "_scaling.png"
        benchmark.plot_scaling(result["scaling"], plot)
        print(f"wrote {plot}")


def _serve_benchmark(reference: float) -> None:
    from configs import serve
    from rivet_jax.bench.serve import format_serve_rows, serve_overhead

    result = serve_overhead(_CONFIG.value, serve.get_config(), encoders=tuple(_SERVE_ENCODERS.value))
    rows = format_serve_rows(result)
    width = max(len(name) for name, _, _ in rows)
    print("routing proxy overhead per request (request in -> upstream request out)")
    print("\n".join(f"  {name:<{width}}  {value:>14}  {note}" for name, value, note in rows))
    benchmark.write_json({"matmul_gflops": reference / 1e9, "serve": result}, _OUTPUT.value)
    print(f"wrote {_OUTPUT.value}")


if __name__ == "__main__":
    run_app(main)
