"""summary.md's "What shapes memory": where cells differ in what decides their peak besides
their keys, each cell's settings, and what tells a model's fullest and leanest cell apart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fakeruns import write_run

from orchestrator.contract.result import ChildResult
from orchestrator.results.report import CostSettings, write_report

GIB = 2**30
HF_LOSS = "transformers ForCausalLMLoss (full fp32 logits)"
SFT_LOSS = "trl fused LM head (chunked nll)"
HEADING = "## What shapes memory"


def shaped(root: Path, eid: str, memory: float, trainer: str, **settings: Any) -> None:
    """A run of one 1B model on one GPU, its result recording what shapes its memory."""
    run = write_run(
        root,
        eid,
        scenario="loss",
        model="org/llama-1b",
        memory=memory,
        extra_arguments={"trainer": trainer},
    )
    result = json.loads((run / "result.json").read_text())
    result.update(
        {
            "loss_implementation": SFT_LOSS if trainer == "sft" else HF_LOSS,
            "model": {"attn_implementation": "sdpa"},
            "activation_checkpointing_mode": None,
            "weights_dtype": "bfloat16",
            "gradients_dtype": "bfloat16",
            "optimizer_states_dtype": "float32 (exp_avg, exp_avg_sq)",
            "optimizer": "adamw_torch_fused (AdamW, fused)",
            **settings,
        }
    )
    (run / "result.json").write_text(json.dumps(result))


def section(summary: str) -> list[str]:
    """The section's lines, to the next section."""
    lines = summary.splitlines()
    start = lines.index(HEADING)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), None)
    return lines[start:end]


def test_cells_apart_in_their_loss_are_named_with_what_tells_their_peaks_apart(
    tmp_path: Path,
) -> None:
    root = tmp_path / "results"
    shaped(root, "sft-full", 12.3 * GIB, "sft")
    shaped(root, "hf-full", 34.0 * GIB, "hf")
    write_report(root, root, CostSettings(), plots=False)
    text = section((root / "summary.md").read_text())
    # each cell's settings, only those the cells differ in, beside its peak
    table = [line for line in text if line.startswith("| ")]
    assert table[0] == "| cell | trainer | peak mem GiB | loss implementation |"
    assert f"| `sft-full` | sft | 12.30 | {SFT_LOSS} |" in table
    assert f"| `hf-full` | hf | 34.00 | {HF_LOSS} |" in table
    # the leanest and the fullest of the model: what of these tells them apart, and which
    # of their keys differ too
    assert (
        f"- org/llama-1b: `sft-full` peaks 12.30 GiB and `hf-full` 34.00 GiB: they differ in "
        f"loss implementation ({SFT_LOSS} vs {HF_LOSS}). They also differ in trainer (sft vs hf)."
    ) in text


def test_cells_that_agree_get_no_section(tmp_path: Path) -> None:
    root = tmp_path / "results"
    # two cells agree in every setting; a third recomputes its blocks (the others record
    # no checkpointing: off)
    shaped(root, "a", 30 * GIB, "hf")
    shaped(root, "b", 12 * GIB, "hf", activation_checkpointing_mode="non-reentrant")
    shaped(root, "c", 30 * GIB, "hf")
    write_report(root, root, CostSettings(), plots=False)
    text = section((root / "summary.md").read_text())
    assert next(line for line in text if line.startswith("| ")) == (
        "| cell | peak mem GiB | checkpointing mode |"
    )
    assert text[-1] == (
        "- org/llama-1b: `b` peaks 12.00 GiB and `a` 30.00 GiB: they differ in checkpointing mode "
        "(non-reentrant vs off)."
    )

    agree = tmp_path / "agree"
    shaped(agree, "a", 12 * GIB, "hf")
    shaped(agree, "b", 30 * GIB, "hf")
    write_report(agree, agree, CostSettings(), plots=False)
    assert HEADING not in (agree / "summary.md").read_text()


def test_peaks_apart_with_no_setting_apart_say_so(tmp_path: Path) -> None:
    root = tmp_path / "results"
    shaped(root, "a", 12 * GIB, "hf", optimizer="sgd (SGD)", optimizer_states_dtype=None)
    shaped(root, "b", 30 * GIB, "hf")
    shaped(root, "c", 29 * GIB, "hf", optimizer="sgd (SGD)", optimizer_states_dtype=None)
    write_report(root, root, CostSettings(), plots=False)
    text = section((root / "summary.md").read_text())
    table = [line for line in text if line.startswith("| ")]
    # an empty setting (a run whose optimizer kept no state) is not a difference
    assert table[0] == "| cell | peak mem GiB | optimizer |"
    assert any(
        "`a` peaks 12.00 GiB and `b` 30.00 GiB: they differ in optimizer (sgd (SGD) vs "
        "adamw_torch_fused (AdamW, fused))." in line
        for line in text
    )


def test_results_written_before_these_settings_load_and_get_no_section(tmp_path: Path) -> None:
    root = tmp_path / "results"
    write_run(root, "a", memory=12 * GIB, extra_arguments={"trainer": "sft"})
    write_run(root, "b", memory=34 * GIB, extra_arguments={"trainer": "hf"})
    write_report(root, root, CostSettings(), plots=False)
    assert HEADING not in (root / "summary.md").read_text()
    old = ChildResult.model_validate(
        {
            "experiment_id": "x",
            "cell_id": "x",
            "scenario": "s",
            "framework_config": None,
            "repeat": 0,
            "swept": {},
            "model_name_or_path": "m",
            "status": "ok",
            "error": None,
            "error_type": None,
            "world_size": 1,
            "timings": {},
            "finished_at": "2026-01-01T00:00:00+00:00",
        }
    )
    assert old.loss_implementation is None and old.optimizer_states_dtype is None
    assert "loss_implementation" not in old.record()
