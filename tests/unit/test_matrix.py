"""Matrix expansion: counts, order, merge precedence, batch arithmetic, selection."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.contract.errors import ConfigError, UserError
from orchestrator.matrix.expand import parse_filters, resolve_batch

TWO_SCENARIOS = """
frameworks:
  fsdp: {accelerate_config: accelerate.yaml}
  ddp: {accelerate_config: accelerate-ddp.yaml}
matrix:
  effective_batch_size: [4, 8]
  max_seq_len: [512, 1024]
scenarios:
  - name: full
    framework_config: [fsdp]
    arguments:
      learning_rate: 2e-5
      model_name_or_path: [org/m1, org/m2]
  - name: peft
    framework_config: [null, ddp]
    arguments:
      peft_method: lora
      target_modules: [q_proj, v_proj]
      model_name_or_path: org/m1
    sweep:
      r: [8, 16]
      lora_alpha: [16, 32]
"""


def test_counts_and_order(plan) -> None:
    p = plan(TWO_SCENARIOS, num_gpus=(1, 2), device="gpu")
    # full: 1 fw × 2 models × 2 gpus × 2 eb × 2 seq = 16
    # peft: 2 fws × 1 model × 4 sweep combos × 2 × 2 × 2 = 64
    assert len(p.experiments) == 16 + 64
    full = [e for e in p.experiments if e.scenario == "full"]
    assert [
        (e.model_name_or_path, e.num_gpus, e.effective_batch_size, e.max_seq_len) for e in full[:9]
    ] == [
        ("org/m1", 1, 4, 512),
        ("org/m1", 1, 4, 1024),
        ("org/m1", 1, 8, 512),
        ("org/m1", 1, 8, 1024),
        ("org/m1", 2, 4, 512),
        ("org/m1", 2, 4, 1024),
        ("org/m1", 2, 8, 512),
        ("org/m1", 2, 8, 1024),
        ("org/m2", 1, 4, 512),
    ]
    peft = [e for e in p.experiments if e.scenario == "peft"]
    # run order (orchestrator/matrix/order.py): a block per model × GPU count, in it the
    # cell sizes smallest first, and the variants of one size next to each other in
    # expansion order (framework outermost, then sweep, last key fastest)
    sizes = [(e.num_gpus, e.effective_batch_size, e.max_seq_len) for e in peft[::8]]
    assert sizes == [
        (1, 4, 512),
        (1, 4, 1024),
        (1, 8, 512),
        (1, 8, 1024),
        (2, 4, 512),
        (2, 4, 1024),
        (2, 8, 512),
        (2, 8, 1024),
    ]
    assert {(e.num_gpus, e.effective_batch_size, e.max_seq_len) for e in peft[:8]} == {(1, 4, 512)}
    firsts = [(e.framework, e.swept["r"], e.swept["lora_alpha"]) for e in peft[:8]]
    assert firsts == [
        ("none", 8, 16),
        ("none", 8, 32),
        ("none", 16, 16),
        ("none", 16, 32),
        ("ddp", 8, 16),
        ("ddp", 8, 32),
        ("ddp", 16, 16),
        ("ddp", 16, 32),
    ]
    assert p.swept_keys == ("r", "lora_alpha")
    assert len({e.experiment_id for e in p.experiments}) == len(p.experiments)


def test_repeats_multiply_and_keep_first_id(plan) -> None:
    one = plan(TWO_SCENARIOS, num_gpus=(1,), device="gpu")
    three = plan(TWO_SCENARIOS, num_gpus=(1,), device="gpu", repeats=3)
    assert len(three.experiments) == 3 * len(one.experiments)
    first = three.experiments[:3]
    assert [e.repeat for e in first] == [0, 1, 2]
    assert first[0].experiment_id == one.experiments[0].experiment_id
    assert first[1].experiment_id.endswith(first[0].experiment_id[-9:])
    assert ".r1-" in first[1].experiment_id and ".r2-" in first[2].experiment_id
    assert {e.cell_id for e in first} == {first[0].experiment_id}


def test_merge_precedence_defaults_scenario_sweep_framework(plan) -> None:
    p = plan(
        """
        frameworks:
          fast:
            arguments: {use_liger_kernel: true, learning_rate: 9.0}
        scenarios:
          - name: a
            framework_config: [null, fast]
            arguments:
              model_name_or_path: m
              learning_rate: 1.0
              warmup_steps: null
            sweep:
              weight_decay: [0.0, 0.1]
        """,
        "learning_rate: 0.5\nwarmup_steps: 10\nweight_decay: 0.3\nseed: 7\n",
        num_gpus=(1,),
        effective_batch_size=(4,),
    )
    by = {(e.framework, e.swept["weight_decay"]): e.arguments for e in p.experiments}
    plain = by[("none", 0.1)]
    assert plain["learning_rate"] == 1.0  # scenario over defaults
    assert plain["weight_decay"] == 0.1  # sweep over defaults
    assert plain["seed"] == 7  # defaults reach every cell
    assert "warmup_steps" not in plain  # null removes the default
    assert "use_liger_kernel" not in plain
    fast = by[("fast", 0.0)]
    assert fast["learning_rate"] == 9.0  # framework over scenario
    assert fast["use_liger_kernel"] is True


def test_no_value_leaks_between_scenarios(plan) -> None:
    p = plan(
        """
        scenarios:
          - name: first
            arguments: {model_name_or_path: m, learning_rate: 1.0, peft_method: lora, r: 4, max_steps: null}
          - name: second
            arguments: {model_name_or_path: m}
        """,
        "learning_rate: 0.5\nmax_steps: 20\n",
        num_gpus=(1,),
        effective_batch_size=(4,),
    )
    first, second = p.experiments
    assert first.arguments["learning_rate"] == 1.0 and "max_steps" not in first.arguments
    assert second.arguments["learning_rate"] == 0.5
    assert second.arguments["max_steps"] == 20
    assert "r" not in second.arguments


def test_scenario_pins_and_sweeps_axes(plan) -> None:
    p = plan(
        """
        matrix:
          effective_batch_size: [4, 8]
          max_seq_len: [4096]
          packing: [true, false]
        scenarios:
          - name: pinned
            arguments: {model_name_or_path: m, packing: false, max_seq_len: 128}
          - name: swept
            arguments: {model_name_or_path: m}
            sweep: {max_seq_len: [256, 512], effective_batch_size: [16]}
        """,
        num_gpus=(1,),
    )
    pinned = [e for e in p.experiments if e.scenario == "pinned"]
    assert {(e.packing, e.max_seq_len) for e in pinned} == {(False, 128)}
    assert [e.effective_batch_size for e in pinned] == [4, 8]
    swept = [e for e in p.experiments if e.scenario == "swept"]
    assert {(e.max_seq_len, e.effective_batch_size) for e in swept} == {(256, 16), (512, 16)}
    assert len(swept) == 2 * 2  # × packing [true, false]
    assert all(e.arguments["max_seq_len"] == e.max_seq_len for e in p.experiments)
    assert all("effective_batch_size" not in e.arguments for e in p.experiments)


def test_scenario_restricts_gpu_counts(plan) -> None:
    text = """
    scenarios:
      - name: wide
        num_gpus: [2, 4]
        arguments: {model_name_or_path: m}
      - name: any
        arguments: {model_name_or_path: m}
    """
    p = plan(text, num_gpus=(1, 2), effective_batch_size=(8,), device="gpu")
    assert [(e.scenario, e.num_gpus) for e in p.experiments] == [
        ("wide", 2),
        ("any", 1),
        ("any", 2),
    ]
    p = plan(text, num_gpus=(1,), effective_batch_size=(8,), device="gpu")
    assert [e.scenario for e in p.experiments] == ["any"]
    assert any("scenario 'wide' is left out: it runs on num_gpus [2, 4]" in n for n in p.notes)
    with pytest.raises(UserError, match=r"the matrix is empty: scenario 'wide' is left out"):
        plan(text, num_gpus=(1,), filters=("wide",), device="gpu")


# ---------------------------------------------------------------------------
# Batch arithmetic
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("eb", "n", "pd", "ga", "expected"),
    [
        (8, 1, None, None, (8, 1)),
        (8, 2, None, None, (4, 1)),
        (8, 2, None, 2, (2, 2)),
        (8, 2, 1, None, (1, 4)),
        (16, 4, 2, 2, (2, 2)),
        (4, 4, None, None, (1, 1)),
    ],
)
def test_batch_arithmetic(eb, n, pd, ga, expected) -> None:
    assert resolve_batch(eb, n, pd, ga) == expected
    got_pd, got_ga = expected
    assert got_pd * got_ga * n == eb


def test_batch_layers_keep_the_more_specific_value() -> None:
    # defaults say accumulate 1, the scenario pins the per-device batch
    assert resolve_batch(8, 2, 1, 1, per_device_layer=1, grad_accum_layer=0) == (1, 4)
    # the scenario pins accumulation over a default per-device batch
    assert resolve_batch(8, 2, 4, 2, per_device_layer=0, grad_accum_layer=1) == (2, 2)


@pytest.mark.parametrize(
    ("eb", "n", "pd", "ga", "message"),
    [
        (
            8,
            3,
            None,
            None,
            r"effective_batch_size 8 is not divisible by num_gpus 3 × gradient_accumulation_steps 1 = 3 \(8 / 3 = 2.66667\)",
        ),
        (
            2,
            4,
            None,
            None,
            r"effective_batch_size 2 is smaller than num_gpus 4 × gradient_accumulation_steps 1 = 4, so per_device_train_batch_size would be 0",
        ),
        (
            8,
            2,
            8,
            None,
            r"effective_batch_size 8 is smaller than num_gpus 2 × per_device_train_batch_size 8 = 16, so gradient_accumulation_steps would be 0",
        ),
        (
            12,
            2,
            None,
            4,
            r"effective_batch_size 12 is not divisible by num_gpus 2 × gradient_accumulation_steps 4 = 8",
        ),
        (
            8,
            2,
            2,
            1,
            r"per_device_train_batch_size 2 × gradient_accumulation_steps 1 × num_gpus 2 = 4, not effective_batch_size 8",
        ),
        (8, 2, 0, None, r"per_device_train_batch_size must be a positive integer, got 0"),
        (8, 2, None, "2", r"gradient_accumulation_steps must be a positive integer, got '2'"),
    ],
)
def test_impossible_batches_are_refused_with_numbers(eb, n, pd, ga, message) -> None:
    with pytest.raises(ValueError, match=message):
        resolve_batch(eb, n, pd, ga)


def test_batch_error_points_at_the_scenario(plan) -> None:
    # the values come from the scenarios file's matrix: the error points at the scenario
    with pytest.raises(ConfigError) as info:
        plan(
            "matrix: {num_gpus: [1, 3], effective_batch_size: [8]}\n"
            "scenarios:\n  - name: a\n    arguments: {model_name_or_path: m}\n",
        )
    message = str(info.value)
    assert (
        "scenarios.yaml:3: scenarios[0]: effective_batch_size 8 is not divisible by num_gpus 3"
        in message
    )
    assert "(scenario 'a', framework none, model m)" in message


def test_batch_error_from_flags_names_the_flags(plan) -> None:
    scenarios = "scenarios:\n  - name: a\n    arguments: {model_name_or_path: m}\n"
    with pytest.raises(ConfigError) as info:
        plan(scenarios, num_gpus=(1, 2), effective_batch_size=(3,))
    message = str(info.value)
    # the 3 and the 2 came from the command line: the flags, not the file, are to blame
    assert message.startswith(
        "--effective-batch-size 3 with --num-gpus 2: effective_batch_size 3 is not divisible"
    ), message
    assert "scenarios.yaml" not in message
    # a flag against a split the scenario pins: both are named
    pinned = (
        "scenarios:\n  - name: a\n    arguments: {model_name_or_path: m, "
        "gradient_accumulation_steps: 2}\n"
    )
    with pytest.raises(ConfigError) as info:
        plan(pinned, num_gpus=(1,), effective_batch_size=(3,))
    message = str(info.value)
    assert "scenarios.yaml:2: scenarios[0]: --effective-batch-size 3 with --num-gpus 1: " in message
    # the file's GPU count with a flag's batch size: only the flag is named
    with pytest.raises(ConfigError) as info:
        plan("matrix: {num_gpus: [2]}\n" + scenarios, effective_batch_size=(3,))
    assert str(info.value).startswith("--effective-batch-size 3: effective_batch_size 3 ")


def test_defaults_accumulation_with_scenario_per_device(plan) -> None:
    p = plan(
        "scenarios:\n  - name: a\n    arguments: {model_name_or_path: m, per_device_train_batch_size: 2}\n",
        "gradient_accumulation_steps: 1\n",
        num_gpus=(1, 2),
        effective_batch_size=(8,),
    )
    assert [
        (e.num_gpus, e.per_device_train_batch_size, e.gradient_accumulation_steps)
        for e in p.experiments
    ] == [
        (1, 2, 4),
        (2, 2, 2),
    ]


def test_bad_pinned_axis_value(plan) -> None:
    with pytest.raises(
        ConfigError,
        match=r"packing must be true or false, got 'yes' \(from the scenario's arguments\)",
    ):
        plan(
            "scenarios:\n  - name: a\n    arguments: {model_name_or_path: m, packing: 'yes'}\n",
            num_gpus=(1,),
        )
    with pytest.raises(ConfigError, match=r"max_seq_len must be a positive integer, got 0"):
        plan(
            "scenarios:\n  - name: a\n    arguments: {model_name_or_path: m, max_seq_len: 0}\n",
            num_gpus=(1,),
        )


# ---------------------------------------------------------------------------
# Selection: filters, slow scenarios, device
# ---------------------------------------------------------------------------

SELECTION = """
scenarios:
  - name: peft-lora
    arguments: {model_name_or_path: m}
  - name: peft-qlora
    slow: true
    arguments: {model_name_or_path: m}
  - name: full
    arguments: {model_name_or_path: m}
  - name: tiny
    device: cpu
    arguments: {model_name_or_path: tiny-llama}
"""


def _scenarios(p) -> list[str]:
    return list(dict.fromkeys(e.scenario for e in p.experiments))


def test_default_selection_is_non_slow_for_the_device(plan) -> None:
    assert _scenarios(plan(SELECTION, gpu_count=2, device="auto")) == ["peft-lora", "full"]
    assert _scenarios(plan(SELECTION, gpu_count=0, device="auto")) == ["tiny"]
    assert _scenarios(plan(SELECTION, gpu_count=2, device="cpu")) == ["tiny"]
    assert _scenarios(plan(SELECTION, device="gpu")) == ["peft-lora", "full"]


def test_slow_runs_only_when_named(plan) -> None:
    assert _scenarios(plan(SELECTION, filters=("peft-qlora",), device="gpu")) == ["peft-qlora"]
    assert _scenarios(plan(SELECTION, filters=("peft-*",), device="gpu")) == [
        "peft-lora",
        "peft-qlora",
    ]
    assert _scenarios(plan(SELECTION, filters=("full", "tiny"), device="gpu")) == ["full", "tiny"]


def test_filter_matching_nothing_lists_the_scenarios(plan) -> None:
    with pytest.raises(UserError) as info:
        plan(SELECTION, filters=("ful",), device="gpu")
    assert str(info.value).endswith(
        "filter 'ful' matches no scenario in "
        + str(info.value).split(" in ")[1].split(";")[0]
        + "; scenarios: peft-lora, peft-qlora (slow), full, tiny (cpu)"
    )


def test_no_scenario_for_the_device(plan) -> None:
    with pytest.raises(UserError) as info:
        plan("scenarios:\n  - name: a\n    arguments: {model_name_or_path: m}\n", device="auto")
    # the refusal says why and what to do instead
    assert "every non-slow scenario in " in str(info.value)
    assert " is for gpu, and this run is for cpu (no GPU detected); preview it with " in str(
        info.value
    )
    # only slow scenarios: the plain refusal
    mixed = (
        "scenarios:\n  - name: a\n    slow: true\n    arguments: {model_name_or_path: m}\n"
        "  - name: b\n    device: cpu\n    slow: true\n    arguments: {model_name_or_path: m}\n"
    )
    with pytest.raises(UserError, match=r"no non-slow scenario for device 'cpu'"):
        plan(mixed, device="auto")


def test_parse_filters() -> None:
    assert parse_filters(["a,b", " c  d ", "a"]) == ("a", "b", "c", "d")
    assert parse_filters([]) == ()


def test_default_gpu_axis(plan) -> None:
    text = "scenarios:\n  - name: a\n    arguments: {model_name_or_path: m}\n"
    assert plan(text, gpu_count=8, device="auto").axes["num_gpus"].values == (1, 2)
    assert plan(text, gpu_count=1, device="auto").axes["num_gpus"].values == (1,)
    assert plan(text, device="gpu", gpu_count=0).axes["num_gpus"].values == (1, 2)
    # the file's matrix beats the machine default; the command line beats both
    assert plan("matrix:\n  num_gpus: [4]\n" + text, gpu_count=1).axes["num_gpus"].values == (4,)
    assert plan("matrix:\n  num_gpus: [4]\n" + text, gpu_count=1, num_gpus=(2,)).axes[
        "num_gpus"
    ].values == (2,)


@pytest.mark.parametrize(
    ("matrix", "selection", "counted"),
    [
        ("", {"device": "auto"}, 1),  # the device and the default GPU axis need the count
        ("", {"device": "gpu"}, 1),  # the default GPU axis is capped at the GPUs found
        ("", {"device": "gpu", "num_gpus": (2,)}, 0),  # both given: nothing to count
        ("matrix:\n  num_gpus: [4]\n", {"device": "gpu"}, 0),  # the file's axis
        ("", {"device": "cpu"}, 0),
    ],
)
def test_gpus_are_counted_only_when_the_plan_needs_a_count(
    plan, matrix: str, selection: dict, counted: int
) -> None:
    text = matrix + "scenarios:\n  - name: a\n    arguments: {model_name_or_path: m}\n"
    if selection["device"] == "cpu":
        text = text.replace("- name: a", "- name: a\n    device: cpu")
    calls: list[int] = []

    def count() -> int:
        calls.append(1)
        return 4

    built = plan(text, gpu_count=count, **selection)
    assert len(calls) == counted
    if counted:
        assert built.axes["num_gpus"].values == (1, 2)
        assert "4 GPU(s)" in built.axes["num_gpus"].source


def test_cpu_default_is_one_process(plan) -> None:
    p = plan(
        "scenarios:\n  - name: t\n    device: cpu\n    num_gpus: [1, 2]\n"
        "    arguments: {model_name_or_path: m}\n",
        device="auto",
    )
    assert p.device == "cpu"
    assert {e.num_gpus for e in p.experiments} == {1}
    assert all(e.device == "cpu" for e in p.experiments)


GPU_ONLY = """
scenarios:
  - name: big
    arguments: {model_name_or_path: m}
  - name: later
    slow: true
    device: cpu
    arguments: {model_name_or_path: m}
"""


def test_a_preview_without_a_gpu_plans_for_the_scenarios_device(plan) -> None:
    from orchestrator.contract.errors import UserError

    previewed = plan(GPU_ONLY, device="auto", preview=True, gpu_count=0)
    assert previewed.device == "gpu"
    assert previewed.device_source == (
        "no GPU detected; previewing the scenarios' own device, gpu: none is for cpu, "
        "and a run here would refuse"
    )
    assert {e.scenario for e in previewed.experiments} == {"big"}
    # a run keeps its refusal, and an explicit --device is obeyed
    with pytest.raises(UserError, match="is for gpu, and this run is for cpu"):
        plan(GPU_ONLY, device="auto", gpu_count=0)
    with pytest.raises(UserError, match=r"is for gpu, and this run is for cpu \(requested\)"):
        plan(GPU_ONLY, device="cpu", preview=True, gpu_count=0)


def test_an_old_name_sets_the_new_one_so_rows_spell_it_one_way(plan) -> None:
    """The predecessor's ``gradient_checkpointing: false`` in a scenario overrides
    defaults.yaml's ``activation_checkpointing: true``: the cells carry one spelling,
    and each setting knows the line that wrote it, as written."""
    built = plan(
        "scenarios:\n"
        "  - name: a\n"
        "    arguments:\n"
        "      model_name_or_path: m\n"
        "      gradient_checkpointing: false\n",
        "activation_checkpointing: true\nlearning_rate: 1.0e-4\n",
        num_gpus=(1,),
        effective_batch_size=(4,),
    )
    (cell,) = built.experiments
    assert (
        "old argument names read as the ones rows and ids use: gradient_checkpointing as "
        "activation_checkpointing"
    ) in built.notes
    assert cell.arguments["activation_checkpointing"] is False
    assert "gradient_checkpointing" not in cell.arguments
    for name in ("activation_checkpointing", "gradient_checkpointing"):
        place = cell.place(name)
        assert (Path(place.file).name, place.line, place.key) == (
            "scenarios.yaml",
            5,
            "scenarios[0].arguments.gradient_checkpointing",
        )
    place = cell.place("learning_rate")
    assert (Path(place.file).name, place.line, place.key) == ("defaults.yaml", 2, "learning_rate")
    place = cell.place("model_name_or_path")
    assert (place.line, place.key) == (4, "scenarios[0].arguments.model_name_or_path")
    # a setting with no line of its own: the scenario's
    assert (cell.place("nothing").line, cell.place("nothing").key) == (2, "scenarios[0]")


def test_plan_header_shows_the_values_rows_use_and_who_pins_them(plan) -> None:
    from pathlib import Path

    from orchestrator.matrix.table import format_header

    p = plan(
        "matrix: {max_seq_len: [4096], packing: [true]}\n"
        "scenarios:\n"
        "  - name: long\n    arguments: {model_name_or_path: m}\n"
        "  - name: short\n    arguments: {model_name_or_path: m, max_seq_len: 128, packing: false}\n",
        num_gpus=(1,),
    )
    header = format_header(p, Path("scenarios.yaml"), None)
    lines = header.splitlines()
    seq = lines.index(next(line for line in lines if "max_seq_len:" in line))
    assert lines[seq].split("max_seq_len:")[1].strip() == "4096  [scenarios file]: long"
    assert lines[seq + 1].strip() == "128  [the scenario's arguments: short]"
    pack = lines.index(next(line for line in lines if "packing:" in line))
    assert lines[pack + 1].strip() == "False  [the scenario's arguments: short]"
    # every row's value is in the header
    for e in p.experiments:
        assert f"{e.max_seq_len}  [" in header
    # every scenario pins it: the matrix's value is said to be unused
    q = plan(
        "matrix: {max_seq_len: [4096]}\n"
        "scenarios:\n  - name: a\n    arguments: {model_name_or_path: m, max_seq_len: 128}\n",
        num_gpus=(1,),
    )
    text = format_header(q, Path("scenarios.yaml"), None)
    assert "(4096  [scenarios file]: used by none)" in text
    assert "128  [the scenario's arguments: a]" in text
