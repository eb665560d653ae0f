"""``python:<module>:<function>`` models through ``tunematrix``: the README's example as
written, planned without being imported, built and trained in the child (a causal LM, a
classifier, a model of the user's own classes), and a failing function reported like any
model that cannot be loaded."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.long]

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "custom_model"

DEFAULTS = """\
max_steps: 2
logging_steps: 1
learning_rate: 1e-3
report_to: none
save_strategy: "no"
"""


MAX_SEQ_LEN = 32


def readme_example() -> tuple[str, str]:
    """(the scenario's arguments lines, the function's file) of the README's example."""
    # the README and the guides behind it (docs/): wherever the example now lives
    text = "\n".join(
        p.read_text() for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    )
    start = text.index("<!-- custom-model:")
    found = re.search(r"```yaml\n(.*?)```\s*```python\n(.*?)```", text[start:], re.S)
    assert found, "no yaml and python blocks after the custom-model marker"
    return found.group(1), found.group(2)


def scenario(name: str, arguments: str) -> str:
    head = f"  - name: {name}\n    device: cpu\n    num_gpus: [1]\n"
    return head + arguments + f"      max_seq_len: {MAX_SEQ_LEN}\n"


def zoo(function: str, extra: str = "") -> str:
    return f"    arguments:\n      model_name_or_path: python:my_models.zoo:{function}\n{extra}"


def tunematrix(cwd: Path, marker: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=cwd,
        # the package is on no path but the scenarios file's folder
        env={
            **os.environ,
            "PYTHONPATH": str(REPO),
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
            "MY_MODELS_IMPORT_MARKER": str(marker),
        },
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_python_models_train_and_fail_like_any_model(tmp_path: Path) -> None:
    project = tmp_path / "project"
    shutil.copytree(FIXTURE / "my_models", project / "my_models")
    arguments, factory = readme_example()
    (project / "my_models" / "factory.py").write_text(factory)
    (project / "scenarios.yaml").write_text(
        "matrix:\n  effective_batch_size: [4]\nscenarios:\n"
        + scenario("readme", arguments)
        + scenario("classify", zoo("build_classifier", "      task: seq-classification\n"))
        + scenario("mixer", zoo("build_mixer"))
        + scenario("broken", zoo("broken", "      model_kwargs: {width: -1}\n"))
    )
    (project / "defaults.yaml").write_text(DEFAULTS)
    elsewhere = tmp_path / "elsewhere"  # the working directory is not the scenarios folder
    elsewhere.mkdir()
    marker = tmp_path / "imported"
    where = ["--scenarios", str(project / "scenarios.yaml"), "--device", "cpu"]

    planned = tunematrix(elsewhere, marker, "plan", *where)
    assert planned.returncode == 0, planned.stderr[-2000:]
    assert "readme.build.none.g1.eb4-" in planned.stdout
    assert not marker.exists(), "planning imported the user's module"

    ran = tunematrix(elsewhere, marker, "run", *where, "--results", "results")
    assert ran.returncode == 1, ran.stdout[-2000:] + ran.stderr[-2000:]
    results = elsewhere / "results"
    with (results / "raw_summary.csv").open() as f:
        by = {r["scenario"]: r for r in csv.DictReader(f)}
    # one import of the zoo per training process that built one of its models; none in
    # the parent
    assert len(marker.read_text().split()) == 3

    def result(name: str) -> dict[str, object]:
        run = results / "runs" / by[name]["experiment_id"]
        return json.loads((run / "result.json").read_text())  # type: ignore[no-any-return]

    readme = by["readme"]
    assert readme["status"] == "ok", readme["error"]
    assert int(readme["tokens_total"]) > 0
    # the README's function built the model that was trained (with tiny-llama's tokenizer)
    model = result("readme")["model"]
    assert isinstance(model, dict)
    assert (model["kind"], model["architecture"]) == ("python", "LlamaForCausalLM")
    # its FLOPs follow from its linear layers (6 per weight, all trained) and its config's
    # attention (12·d·L per layer, L at most the longest sequence)
    built = readme_model(factory, arguments)
    assert model["total_params"] == sum(p.numel() for p in built.parameters())
    linear = sum(m.weight.numel() for m in built.modules() if type(m).__name__ == "Linear")
    config = built.config
    attention = config.num_hidden_layers * 12 * config.hidden_size * MAX_SEQ_LEN
    assert 6 * linear < float(readme["flops_per_token"]) <= 6 * linear + attention

    classify = by["classify"]
    assert classify["status"] == "ok", classify["error"]
    assert float(classify["samples_per_second_global"]) > 0
    assert float(classify["flops_per_token"]) > 0
    classifier = result("classify")["model"]
    assert isinstance(classifier, dict)
    assert classifier["architecture"] == "LlamaForSequenceClassification"

    mixer = by["mixer"]
    assert mixer["status"] == "ok", mixer["error"]
    assert mixer["flops_per_token"] == "" and mixer["mfu"] == ""
    notes = result("mixer")["notes"]
    assert isinstance(notes, list)
    assert any(
        n.startswith("no FLOPs figure: the model's config (MixerConfig) has no") for n in notes
    ), notes

    broken = by["broken"]
    assert broken["status"] == "failed"
    assert broken["error"] == (
        "model 'python:my_models.zoo:broken' could not be built: "
        "ValueError: width must be positive, got -1"
    )
    assert broken["log"] == f"runs/{broken['experiment_id']}/stderr.log"
    log = (results / broken["log"]).read_text()
    assert "Traceback" in log and "in broken" in log
    assert "failed: broken." in ran.stdout

    # the report is made from files: nothing of the user's code runs
    marker.unlink()
    reported = tunematrix(elsewhere, marker, "report", "results")
    assert reported.returncode == 0, reported.stderr[-2000:]
    assert not marker.exists(), "the report imported the user's module"


def readme_model(factory: str, arguments: str) -> Any:
    """The README's model, built here with the scenario's model_kwargs."""
    import yaml

    kwargs = yaml.safe_load(arguments)["arguments"]["model_kwargs"]
    namespace: dict[str, object] = {}
    exec(compile(factory, "README.md", "exec"), namespace)
    build = namespace["build"]
    assert callable(build)
    return build(**kwargs)
