"""packing: true means tunematrix's blocks under every trainer; TRL packs only when asked,
and per-document attention through masks is said in the plan and in the row."""

from __future__ import annotations

import textwrap
from pathlib import Path

from orchestrator.config.scenarios import load_config
from orchestrator.contract.packing import masked_per_document, trl_strategy
from orchestrator.matrix.expand import Selection, build_plan
from trainer_entry.backends.trl_cost import MetricsCost, cost_note


def test_trl_packs_only_when_a_strategy_is_named() -> None:
    assert trl_strategy(True, {}) is None
    assert trl_strategy(True, {"packing_strategy": "bfd"}) == "bfd"
    assert trl_strategy(False, {"packing_strategy": "bfd"}) is None


def test_per_document_attention_is_masked_without_a_varlen_kernel() -> None:
    assert masked_per_document("bfd", None)
    assert masked_per_document("bfd_split", "sdpa")
    assert masked_per_document("bfd", "eager")
    assert not masked_per_document("bfd", "flash_attention_2")
    assert not masked_per_document("bfd", "kernels-community/flash-attn3")
    assert not masked_per_document("wrapped", "sdpa")
    assert not masked_per_document(None, "sdpa")


def plan_notes(tmp_path: Path, arguments: str) -> list[str]:
    (tmp_path / "scenarios.yaml").write_text(
        textwrap.dedent(
            """\
            matrix:
              effective_batch_size: [4]
              max_seq_len: [256]
              packing: [true]
            scenarios:
              - name: s
                device: cpu
                framework_config: [null]
                arguments:
                  model_name_or_path: tiny-llama
            """
        )
        + textwrap.indent(arguments, " " * 6)
    )
    config = load_config(tmp_path / "scenarios.yaml", defaults_file=None)
    return build_plan(config, Selection(device="cpu"), gpu_count=0).notes


def test_the_plan_notes_bfd_under_sdpa_and_nothing_for_blocks(tmp_path: Path) -> None:
    notes = plan_notes(tmp_path, "packing_strategy: bfd\n")
    masked = [n for n in notes if "keeps documents apart" in n]
    assert len(masked) == 1 and masked[0].startswith("scenario 's': packing_strategy bfd")
    assert "flash_attention_2" in masked[0]
    assert not any("keeps documents apart" in n for n in plan_notes(tmp_path, "trainer: sft\n"))
    flash = "packing_strategy: bfd\nattn_implementation: flash_attention_2\n"
    assert not any("keeps documents apart" in n for n in plan_notes(tmp_path, flash))


def test_the_cost_note_gives_the_step_share_or_says_it_is_noise() -> None:
    cost = MetricsCost(with_metrics_s=0.012, without_metrics_s=0.010, tokens=4096, spread_s=0.0005)
    note = cost_note(cost, micro_batches=4, step_time_s=0.8)
    assert note.startswith("TRL's per-step entropy and token accuracy cost 8.0 ms a step, 1.0%")
    assert "4096 positions" in note and "× 4 micro-batches" in note
    noisy = MetricsCost(with_metrics_s=0.010, without_metrics_s=0.011, tokens=4096, spread_s=0.002)
    assert "less than the timing's noise" in cost_note(noisy, micro_batches=1, step_time_s=0.8)
    assert cost_note("the LM head is sharded", micro_batches=1, step_time_s=None).endswith(
        "cost not measured: the LM head is sharded"
    )
