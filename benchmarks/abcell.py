"""A small CPU cell run again and again as two variants, alternated A B B A ...

What the benchmarks of the measurements (utilisation, profiles, eval) share:
the cell (a 4-layer Llama of random weights, packed blocks of 256 tokens,
``config:`` so nothing is downloaded), its plan, and the interleaved runs, each
a fresh ``accelerate launch`` through ``run_experiment`` with its own sidecar,
so drift on the machine hits both variants alike.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from orchestrator.config.scenarios import load_config  # noqa: E402
from orchestrator.matrix.expand import Selection, build_plan  # noqa: E402
from orchestrator.matrix.experiment import Experiment  # noqa: E402
from orchestrator.running.runner import RunOptions  # noqa: E402

ARCH = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 1024,
    "max_position_embeddings": 1024,
}
#: how the cell is named in what the benchmarks print
CELL = "llama 256×4, packed rows of 256"


def plan_cell(
    folder: Path,
    *,
    steps: int,
    processes: int = 1,
    arguments: Mapping[str, Any] | None = None,
    sweep: Mapping[str, Sequence[Any]] | None = None,
) -> list[Experiment]:
    """The cell's experiments (one per swept value), planned from files written to ``folder``."""
    arch = folder / "arch.json"
    arch.write_text(json.dumps(ARCH))
    scenario: dict[str, Any] = {
        "name": "bench",
        "device": "cpu",
        "framework_config": ["ddp"],
        "arguments": {
            "model_name_or_path": f"config:{arch}",
            "max_steps": steps,
            "logging_steps": 1,
            **(arguments or {}),
        },
    }
    if sweep:
        scenario["sweep"] = {k: list(v) for k, v in sweep.items()}
    text = {
        "frameworks": {"ddp": {"accelerate_config": str(REPO / "accelerate-ddp.yaml")}},
        "matrix": {
            "effective_batch_size": [4 * processes],
            "num_gpus": [processes],
            "max_seq_len": [256],
            "packing": [True],
        },
        "scenarios": [scenario],
    }
    (folder / "scenarios.yaml").write_text(yaml.safe_dump(text, sort_keys=False))
    config = load_config(folder / "scenarios.yaml", defaults_file=None)
    plan = build_plan(config, Selection(device="cpu", num_gpus=(processes,)), gpu_count=0)
    return list(plan.experiments)


def alternated(pairs: int, first: str, second: str) -> Iterator[tuple[int, str]]:
    """(pair, variant) in the order A B B A A B ..."""
    for i in range(pairs):
        for name in (first, second) if i % 2 == 0 else (second, first):
            yield i, name


def run_alternated(
    folder: Path,
    variants: Mapping[str, Experiment],
    pairs: int,
    figures: Callable[[str, Any, Any, dict[str, Any]], dict[str, Any]],
    *,
    before: Callable[[str], None] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Each variant's figures, run after run: ``figures(variant, outcome, run, result)``.

    ``before(variant)`` runs ahead of each launch (to set the environment a
    variant needs). A run that is not ok stops the benchmark: a failed run
    measures nothing.
    """
    from orchestrator.job.execute import run_experiment
    from orchestrator.running.resultsdir import open_results

    first, second = variants
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    with open_results(folder / "ab", resume=False) as opened:
        for i, name in alternated(pairs, first, second):
            if before is not None:
                before(name)
            run = opened.layout.run(f"ab-{i}-{name}")
            outcome = run_experiment(variants[name], run, opened.layout, RunOptions())
            assert outcome.status == "ok", outcome
            result = json.loads(run.result.read_text())
            runs[name].append(figures(name, outcome, run, result))
    return runs


def ratio_line(on: Sequence[float], off: Sequence[float], label: str) -> tuple[float, str]:
    """The ratio of the medians, and a line with it and the spread of the pairs' ratios."""
    ratios = [a / b for a, b in zip(on, off, strict=True)]
    ratio = statistics.median(on) / statistics.median(off)
    return ratio, (
        f"{label} (medians): {ratio:.4f}; per pair: median {statistics.median(ratios):.4f}, "
        f"min {min(ratios):.4f}, max {max(ratios):.4f}"
    )


def spread_line(name: str, values: Sequence[float], width: int = 13) -> str:
    """``name  tokens/s [...]  median N  (CV x%)``."""
    cv = statistics.pstdev(values) / statistics.fmean(values)
    return (
        f"{name:<{width}} tokens/s {[round(t) for t in values]}  median "
        f"{statistics.median(values):,.0f}  (CV {100 * cv:.1f}%)"
    )
