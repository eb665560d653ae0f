"""The plan's run order: smaller cells first within a ladder, variants counterbalanced."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import pytest

from orchestrator.matrix.order import counterbalance, order_experiments
from orchestrator.matrix.prune import Size, ladder_key, size_of
from orchestrator.matrix.table import plan_csv

TWO_VARIANTS = """
frameworks:
  ddp: {accelerate_config: accelerate-ddp.yaml}
matrix:
  effective_batch_size: [8, 4]
  max_seq_len: [1024, 512]
scenarios:
  - name: s
    framework_config: [null, ddp]
    arguments: {model_name_or_path: org/m}
"""


def _grid(rng: random.Random) -> str:
    """A random matrix: two models, frameworks, a LoRA rank swept, random axes."""
    ebs = rng.sample([2, 4, 8, 16, 32], rng.randint(1, 4))
    seqs = rng.sample([64, 128, 256, 512, 1024], rng.randint(1, 4))
    packing = rng.choice(["[true]", "[false]", "[true, false]", "[false, true]"])
    return f"""
frameworks:
  ddp: {{accelerate_config: accelerate-ddp.yaml}}
matrix:
  effective_batch_size: {ebs}
  max_seq_len: {seqs}
  packing: {packing}
scenarios:
  - name: a
    framework_config: [ddp, null]
    arguments:
      model_name_or_path: [org/m1, org/m2]
      peft_method: lora
      target_modules: [q_proj]
    sweep:
      r: [{rng.choice([8, 16])}, 4]
      activation_checkpointing: [true, false]
  - name: b
    arguments: {{model_name_or_path: org/m1}}
"""


@pytest.mark.parametrize("seed", range(12))
def test_within_a_ladder_a_smaller_cell_always_runs_first(plan, seed: int) -> None:
    rng = random.Random(seed)
    built = plan(_grid(rng), num_gpus=(1, 2), repeats=rng.randint(1, 3))
    runs = built.experiments
    assert [e.position for e in runs] == list(range(1, len(runs) + 1))
    ladders = {e.experiment_id: ladder_key(e) for e in runs}
    checked = 0
    for a, b in itertools.permutations(runs, 2):
        if ladders[a.experiment_id] != ladders[b.experiment_id]:
            continue
        small, big = size_of(a), size_of(b)
        if big.needs_at_least(small) and big != small:
            assert a.position is not None and b.position is not None
            assert a.position < b.position, (a.experiment_id, b.experiment_id)
            checked += 1
    sizes: dict[str, set[Size]] = {}
    for e in runs:
        sizes.setdefault(ladders[e.experiment_id], set()).add(size_of(e))
    # the property was checked wherever a ladder has cells of two sizes
    assert checked > 0 or all(len(s) == 1 for s in sizes.values())


def test_the_order_key_is_a_linear_extension_of_needing_more_memory() -> None:
    sizes = [
        Size(pd, seq, pack, accumulates)
        for pd in (1, 2, 3, 8)
        for seq in (None, 1, 64, 128, 512)
        for pack in (None, False, True)
        for accumulates in (False, True)
    ]
    for a, b in itertools.permutations(sizes, 2):
        if b.needs_at_least(a) and not a.needs_at_least(b):
            assert a.order_key() < b.order_key(), (a, b)


def test_variants_of_a_size_alternate_by_repeat(plan) -> None:
    built = plan(TWO_VARIANTS, num_gpus=(1,), repeats=2)
    first = built.experiments[:4]
    # the smallest cell first (batch 4, seq 512), its two variants A B B A
    assert {(e.per_device_train_batch_size, e.max_seq_len) for e in first} == {(4, 512)}
    assert [(e.framework, e.repeat) for e in first] == [
        ("none", 0),
        ("ddp", 0),
        ("ddp", 1),
        ("none", 1),
    ]
    sizes = [(e.per_device_train_batch_size, e.max_seq_len) for e in built.experiments[::4]]
    assert sizes == [(4, 512), (4, 1024), (8, 512), (8, 1024)]


def test_counterbalance_three_variants_three_repeats() -> None:
    cells = [[f"{name}{r}" for r in range(3)] for name in "ABC"]
    order = counterbalance(cells)  # type: ignore[arg-type]
    assert order == ["A0", "B0", "C0", "C1", "B1", "A1", "A2", "B2", "C2"]


def test_blocks_keep_model_and_gpu_count_together(plan) -> None:
    text = TWO_VARIANTS.replace("{model_name_or_path: org/m}", "{model_name_or_path: [m1, m2]}")
    built = plan(text, num_gpus=(1, 2))
    blocks = [(e.model_name_or_path, e.num_gpus) for e in built.experiments]
    # each block contiguous, in the order expansion met them
    assert list(dict.fromkeys(blocks)) == [("m1", 1), ("m1", 2), ("m2", 1), ("m2", 2)]
    assert blocks == sorted(blocks, key=list(dict.fromkeys(blocks)).index)


def test_positions_are_recorded_in_the_spec_and_plan_csv(plan) -> None:
    built = plan(TWO_VARIANTS, num_gpus=(1,), repeats=2)
    assert built.experiments[2].spec()["position"] == 3
    lines = plan_csv(built).splitlines()
    header = lines[0].split(",")
    assert "position" in header
    column = header.index("position")
    assert [line.split(",")[column] for line in lines[1:]] == [
        str(i) for i in range(1, len(built.experiments) + 1)
    ]
    # an experiment not from a plan has no position, and its spec no key for it
    assert "position" not in replace(built.experiments[0], position=None).spec()


def test_reordering_an_ordered_plan_changes_nothing(plan) -> None:
    built = plan(TWO_VARIANTS, num_gpus=(1, 2), repeats=3)
    again = order_experiments(built.experiments)
    assert [e.experiment_id for e in again] == [e.experiment_id for e in built.experiments]


def test_image_cells_have_no_sequence_length_and_still_order(plan) -> None:
    text = """
scenarios:
  - name: img
    arguments: {model_name_or_path: tiny-vit, task: image-classification}
"""
    built = plan(text, num_gpus=(1,), effective_batch_size=(8, 2, 4))
    assert [e.per_device_train_batch_size for e in built.experiments] == [2, 4, 8]
    assert {e.max_seq_len for e in built.experiments} == {None}
