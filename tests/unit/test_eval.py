"""Eval after training: the held-out split, the loss trend, the eval figures, the quality column."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from orchestrator.contract.applicability import inapplicable_argument, unknown_argument
from orchestrator.contract.spec import RunSpec
from orchestrator.results import quality
from trainer_entry.backends import get_backend
from trainer_entry.data.holdout import holdout_count, holdout_indices, split_sequences
from trainer_entry.data.tokenize import PreparedData
from trainer_entry.measure.steps import first_measured_step, loss_summary
from trainer_entry.results.evaluate import (
    accuracy,
    eval_figures,
    loss_points,
    loss_trend,
    nonfinite_steps,
    slope,
)
from trainer_entry.run.parse import parse_arguments
from trainer_entry.spec_errors import SpecError
from trainer_entry.tasks.causal_lm import CausalLMTask


def parse(arguments: dict):
    return parse_arguments(RunSpec(arguments=arguments))  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# the split
# ---------------------------------------------------------------------------


def test_holdout_count() -> None:
    assert holdout_count(100, None) == 10  # 10%
    assert holdout_count(10_000, None) == 256  # capped
    assert holdout_count(5, None) == 1  # at least one
    assert holdout_count(100, 0.25) == 25
    assert holdout_count(100, 7) == 7
    with pytest.raises(SpecError, match="nothing to train on"):
        holdout_count(10, 10)
    with pytest.raises(SpecError, match="at least 2 examples"):
        holdout_count(1, None)


def test_holdout_indices_deterministic_disjoint_and_nested() -> None:
    train, held = holdout_indices(50, 5)
    assert (train, held) == holdout_indices(50, 5)  # the same every time
    assert len(held) == 5 and not set(train) & set(held)
    assert sorted(train + held) == list(range(50))
    assert train == sorted(train) and held == sorted(held)
    assert held != list(range(45, 50)) and held != list(range(5))  # not a head or tail cut
    # a larger holdout keeps the smaller one's examples
    assert set(held) <= set(holdout_indices(50, 12)[1])


def _prepared(n: int) -> PreparedData:
    ids = [np.arange(i + 2, dtype=np.int64) for i in range(n)]
    labels = [np.where(x % 2 == 0, x, -100) for x in ids]
    return PreparedData(input_ids=ids, labels=labels, meta={"sequences": n, "source": {}})


def test_split_sequences_counts_each_part() -> None:
    data = _prepared(20)
    train, held = split_sequences(data, 4)
    assert len(train.input_ids) == 16 and len(held.input_ids) == 4
    _, held_idx = holdout_indices(20, 4)
    assert [len(x) for x in held.input_ids] == [i + 2 for i in held_idx]
    for part in (train, held):
        assert part.meta["sequences"] == len(part.input_ids)
        assert part.meta["tokens"] == sum(len(x) for x in part.input_ids)
        assert part.meta["label_tokens"] == sum(int((y != -100).sum()) for y in part.labels)
    assert train.meta["heldout_sequences"] == 4 and "heldout_sequences" not in data.meta
    assert data.meta["sequences"] == 20  # the whole set untouched


def _task_data(tokenizer, data_dir: Path, **arguments):
    parsed = parse({"model_name_or_path": "tiny-llama", "trainer": "hf", **arguments})
    # as a run prepares it: with its backend's data settings
    data = get_backend(parsed.backend).data_settings(parsed)
    return CausalLMTask().prepare(
        dataclasses.replace(parsed, data=data), tokenizer, data_dir, as_given=False
    )


def test_training_set_is_unchanged_without_eval(tiny_tokenizer, tmp_path) -> None:
    from trainer_entry.data.prepare import prepare

    plain = _task_data(tiny_tokenizer, tmp_path / "a", max_seq_len=64)
    off = _task_data(tiny_tokenizer, tmp_path / "b", max_seq_len=64, eval=False)
    direct = prepare(
        parse({"model_name_or_path": "x", "max_seq_len": 64}).data, tiny_tokenizer, tmp_path / "c"
    )
    assert off.eval_examples is None and plain.eval_examples is None
    for data in (off.examples, plain.examples):
        assert len(data.input_ids) == len(direct.input_ids)
        assert all(
            np.array_equal(a, b) for a, b in zip(data.input_ids, direct.input_ids, strict=True)
        )
    assert plain.meta["cache_key"] == direct.meta["cache_key"]


def test_unpacked_eval_splits_the_cached_sequences(tiny_tokenizer, tmp_path) -> None:
    whole = _task_data(tiny_tokenizer, tmp_path, max_seq_len=64)
    split = _task_data(tiny_tokenizer, tmp_path, max_seq_len=64, eval=True, holdout=0.2)
    # the same cache entry, read, not a new one: cells without eval are not touched
    assert split.meta["cache_key"] == whole.meta["cache_key"] and split.meta["cache_hit"] is True
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == [
        whole.meta["cache_key"]
    ]
    n = len(whole.examples.input_ids)
    train_idx, held_idx = holdout_indices(n, math.ceil(0.2 * n))
    got = split.examples.input_ids + split.eval_examples.input_ids
    want = [whole.examples.input_ids[i] for i in train_idx + held_idx]
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    assert split.meta["heldout_sequences"] == len(held_idx)


def test_packed_eval_splits_documents_before_packing(tiny_tokenizer, tmp_path) -> None:
    packed = _task_data(tiny_tokenizer, tmp_path, max_seq_len=64, packing=True)
    before = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    split = _task_data(tiny_tokenizer, tmp_path, max_seq_len=64, packing=True, eval=True)
    # the packed entry of cells without eval is left as it was
    after = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    assert all(after[name] == stamp for name, stamp in before.items())
    # the documents, whole, split, each part packed on its own
    docs = _task_data(tiny_tokenizer, tmp_path / "docs", max_seq_len=64, trainer="sft").examples
    train_idx, held_idx = holdout_indices(
        len(docs.input_ids), holdout_count(len(docs.input_ids), None)
    )
    for part, idx in ((split.examples, train_idx), (split.eval_examples, held_idx)):
        stream = np.concatenate([docs.input_ids[i] for i in idx])
        rows = np.concatenate(part.input_ids)
        assert all(len(r) == 64 for r in part.input_ids)
        assert np.array_equal(rows, stream[: len(rows)]) and len(stream) - len(rows) < 64
    assert split.meta["packing"] is True and split.meta["sequences"] == len(
        split.examples.input_ids
    )
    assert len(split.examples.input_ids) < len(packed.examples.input_ids)


# ---------------------------------------------------------------------------
# arguments
# ---------------------------------------------------------------------------


def test_eval_arguments_parse_and_are_ours() -> None:
    p = parse({"model_name_or_path": "tiny-llama", "eval": True, "holdout": 0.05})
    assert p.evaluation.enabled and p.evaluation.holdout == 0.05
    assert "eval" not in p.training and "holdout" not in p.training
    assert not parse({"model_name_or_path": "tiny-llama"}).evaluation.enabled
    assert unknown_argument("eval") is None and unknown_argument("holdout") is None
    for bad, match in (
        ({"eval": "yes"}, "eval must be true or false"),
        ({"eval": True, "holdout": 1.5}, "fraction"),
        ({"eval": True, "holdout": 0}, "count"),
    ):
        with pytest.raises(SpecError, match=match):
            parse({"model_name_or_path": "tiny-llama", **bad})


def test_holdout_needs_eval() -> None:
    def why(arguments: dict) -> str | None:
        problem = inapplicable_argument(
            "holdout", 10, task="causal-lm", backend="sft", arguments=arguments
        )
        return None if problem is None else problem.line

    assert why({"eval": True}) is None
    assert "needs eval: true" in (why({}) or "")
    assert "needs eval: true" in (why({"eval": False}) or "")


# ---------------------------------------------------------------------------
# the loss trend
# ---------------------------------------------------------------------------


def test_slope_is_least_squares() -> None:
    assert slope([(1, 5.0), (2, 4.5), (3, 4.0)]) == pytest.approx(-0.5)
    assert slope([(1, 1.0), (2, 3.0), (3, 2.0), (4, 4.0)]) == pytest.approx(0.8)
    assert slope([(1, 1.0)]) is None and slope([(2, 1.0), (2, 3.0)]) is None


def test_loss_trend_uses_the_measured_window() -> None:
    history = [{"step": s, "loss": 10.0 - (s if s > 3 else 5 * s)} for s in range(1, 11)]
    history.append({"step": 10, "eval_loss": 99.0})  # eval's entry is no training loss
    assert [s for s, _ in loss_points(history, 3, 10)] == list(range(4, 11))
    trend = loss_trend(history, {"steps": 10, "warmup_steps_excluded": 3, "steps_measured": 7})
    assert trend == {"loss_slope_per_step": pytest.approx(-1.0), "loss_nonfinite_steps": 0}
    assert loss_trend(history, {"steps": 0})["loss_slope_per_step"] is None
    # profiled steps after the warm-up are out of the window too: it is the last steps_measured
    late = loss_trend(history, {"steps": 10, "warmup_steps_excluded": 3, "steps_measured": 3})
    assert late["loss_slope_per_step"] == pytest.approx(-1.0)
    assert loss_trend(history, {"steps": 10, "steps_measured": 1})["loss_slope_per_step"] is None


def test_loss_trend_from_loss_summarys_pairs_is_the_same() -> None:
    history = [{"step": s, "loss": 10.0 - s} for s in range(1, 11)]
    history[6]["loss"] = float("nan")  # a non-finite loss stays out of the fit either way
    history.append({"step": 10, "eval_loss": 99.0})
    pairs = loss_summary(history)["loss_history"]
    for summary in (
        {"steps": 10, "warmup_steps_excluded": 3, "steps_measured": 7},
        {"steps": 10, "warmup_steps_excluded": 3, "steps_measured": 3},
        {"steps": 10, "steps_measured": 1},
        {"steps": 0},
    ):
        assert loss_trend(history, summary, losses=pairs) == loss_trend(history, summary)
    assert first_measured_step({"steps": 10, "steps_measured": 3}) == 7
    assert first_measured_step({"steps": 0}) is None


def test_nonfinite_steps_count_grad_norm_too() -> None:
    history = [
        {"step": 1, "loss": 2.0, "grad_norm": 1.0},
        {"step": 2, "loss": 0.0, "grad_norm": float("nan")},  # HF's stand-in for a NaN loss
        {"step": 3, "loss": float("inf"), "grad_norm": 1.0},
        {"step": 4, "eval_loss": float("nan")},
    ]
    assert nonfinite_steps(history) == 2
    assert (
        loss_trend(history, {"steps": 3, "warmup_steps_excluded": 0})["loss_nonfinite_steps"] == 2
    )


# ---------------------------------------------------------------------------
# eval figures
# ---------------------------------------------------------------------------


def test_eval_figures() -> None:
    lm = eval_figures({"eval_loss": 2.0}, task="causal-lm", samples=12, runtime_s=0.5)
    assert lm.figures["perplexity"] == pytest.approx(math.exp(2.0))
    assert lm.figures["eval_samples"] == 12 and lm.figures["eval_runtime"] == 0.5 and not lm.notes
    cls = eval_figures(
        {"eval_loss": 0.7, "eval_accuracy": 0.5}, task="seq-classification", samples=3, runtime_s=1
    )
    assert cls.figures["perplexity"] is None and cls.figures["eval_accuracy"] == 0.5
    bad = eval_figures({"eval_loss": float("nan")}, task="causal-lm", samples=1, runtime_s=1)
    assert bad.figures["eval_loss"] is None and bad.figures["perplexity"] is None
    assert "diverged" in bad.notes[0]
    huge = eval_figures({"eval_loss": 1000.0}, task="causal-lm", samples=1, runtime_s=1)
    assert huge.figures["perplexity"] is None and "overflows" in huge.notes[0]


def test_accuracy() -> None:
    prediction = SimpleNamespace(
        predictions=(np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]]),), label_ids=np.array([1, 1, 1])
    )
    assert accuracy(prediction) == {"accuracy": pytest.approx(2 / 3)}


# ---------------------------------------------------------------------------
# the quality column
# ---------------------------------------------------------------------------


def test_quality_flags_divergence() -> None:
    assert quality.diverged({"loss_first": 2.0, "loss_last": 2.9}) is None
    assert "over 1.5×" in (quality.diverged({"loss_first": 2.0, "loss_last": 3.1}) or "")
    assert "NaN/inf" in (quality.diverged({"loss_nonfinite_steps": 1.0}) or "")
    assert quality.diverged({"loss_first": float("nan"), "loss_last": 3.0}) is None
    text = quality.quality_text({"loss_first": 2.0, "loss_last": 5.0, "loss_slope_per_step": 0.2})
    assert text.startswith("**DIVERGED**") and "+0.2/step" in text


def test_quality_text() -> None:
    lm = {
        "perplexity": 7.389,
        "eval_loss": 2.0,
        "loss_slope_per_step": -0.05,
        "loss_first": 3.0,
        "loss_last": 2.0,
    }
    assert quality.quality_text(lm) == "ppl 7.389; -0.05/step"
    cls = {"eval_loss": 0.69, "eval_accuracy": 0.5, "perplexity": float("nan")}
    assert quality.quality_text(cls) == "eval loss 0.69, acc 50.0%"
    assert quality.quality_text({"loss_first": 3.0, "loss_last": 2.5}) == "loss 3 → 2.5"
    assert quality.quality_text({}) == "–"


def test_shows_quality() -> None:
    import pandas as pd

    assert quality.shows_quality(pd.DataFrame({"loss_first": [1.0, None]}))
    assert not quality.shows_quality(
        pd.DataFrame({"loss_first": [None], "loss_nonfinite_steps": [0]})
    )
    assert not quality.shows_quality(pd.DataFrame({"tokens_per_second_global": [1.0]}))


# ---------------------------------------------------------------------------
# what eval_loss is: checked against the cross-entropy computed here
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("packing", [True, False], ids=["packed", "unpacked"])
def test_eval_loss_is_what_the_column_says(tiny_path, tiny_tokenizer, tmp_path, packing) -> None:
    import torch
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    from trainer_entry.results.evaluate import evaluate

    parsed = parse(
        {
            "model_name_or_path": "tiny-llama",
            "trainer": "hf",
            "max_seq_len": 64,
            "packing": packing,
            "eval": True,
            "holdout": 10,
            "per_device_train_batch_size": 4,
        }
    )
    task = CausalLMTask()
    data = task.prepare(parsed, tiny_tokenizer, tmp_path / "data", as_given=False)
    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        report_to="none",
        per_device_train_batch_size=4,
        remove_unused_columns=False,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=task.dataset(data),
        data_collator=task.collator(tiny_tokenizer, parsed),
        processing_class=tiny_tokenizer,
    )
    result = evaluate(
        SimpleNamespace(trainer=trainer),
        task=task,
        data=data,
        parsed=parsed,
        backend=get_backend("hf"),
    )
    sums, counts, rows = [], [], []
    collator = task.collator(tiny_tokenizer, parsed)
    held = data.eval_examples
    features = [
        {"input_ids": x, "labels": y} for x, y in zip(held.input_ids, held.labels, strict=True)
    ]
    with torch.no_grad():
        for start in range(0, len(features), 4):  # the training batch, as eval uses it
            batch = collator(features[start : start + 4])
            logits = model(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
            ).logits
            labels = batch["labels"][:, 1:]
            sums.append(
                torch.nn.functional.cross_entropy(
                    logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                    labels.reshape(-1),
                    ignore_index=-100,
                    reduction="sum",
                ).item()
            )
            counts.append(int((labels != -100).sum()))
            rows.append(labels.shape[0])
    got = result.figures["eval_loss"]
    assert result.figures["eval_samples"] == len(features)
    # the mean over batches of each batch's per-token mean, each batch weighted by its rows
    by_batch = sum(s / c * r for s, c, r in zip(sums, counts, rows, strict=True)) / sum(rows)
    assert got == pytest.approx(by_batch, rel=1e-5)
    if packing:  # every row holds as many label tokens: the exact per-token mean, so ppl
        assert got == pytest.approx(sum(sums) / sum(counts), rel=1e-5)
        assert result.figures["perplexity"] == pytest.approx(
            math.exp(sum(sums) / sum(counts)), rel=1e-5
        )


def test_eval_figures_are_the_columns_a_run_without_eval_leaves_empty() -> None:
    # record.py fills EVAL_FIGURES with None when eval is off: the lists must agree
    from trainer_entry.results.evaluate import EVAL_FIGURES, eval_figures

    figures = eval_figures({"eval_loss": 1.0}, task="causal-lm", samples=3, runtime_s=0.5).figures
    assert tuple(figures) == EVAL_FIGURES
    assert figures["perplexity"] == pytest.approx(math.e)


@pytest.mark.parametrize(
    ("task", "model", "count"),
    [("seq2seq-lm", "tiny-t5", "sequences"), ("speech-recognition", "tiny-whisper", "sequences")],
)
def test_a_tasks_examples_are_held_out_whole_and_disjoint(
    task: str, model: str, count: str, tmp_path: Path
) -> None:
    """seq2seq's pairs and speech's clips (vision-language's conversations alike, in its e2e
    test) go through one ``with_holdout``: the trained and held-out parts are disjoint,
    together the whole set, chosen by ``holdout_indices``, each part's counts its own."""
    from transformers import AutoConfig, AutoProcessor, AutoTokenizer

    from trainer_entry.models.load import tiny_model_path
    from trainer_entry.settings.parsed import DataConfig
    from trainer_entry.tasks import get_task

    folder = tiny_model_path(model)
    loader = AutoProcessor if task == "speech-recognition" else AutoTokenizer
    processor = loader.from_pretrained(folder)
    config = AutoConfig.from_pretrained(folder)
    runner = get_task(task)
    data_cfg = DataConfig(dataset_kwargs={"num_clips": 20} if task == "speech-recognition" else {})

    def prepared(evaluation: bool):
        parsed = SimpleNamespace(
            data=data_cfg,
            evaluation=SimpleNamespace(enabled=evaluation, holdout=0.25),
            model=SimpleNamespace(name=model),
        )
        return runner.prepare(parsed, processor, tmp_path, as_given=True, model_config=config)

    whole = prepared(False)
    split = prepared(True)
    total = whole.meta[count]
    train, held = holdout_indices(total, holdout_count(total, 0.25))
    assert split.meta[count] == len(train) and split.eval_examples.meta[count] == len(held)
    assert split.meta["heldout_sequences"] == len(held)
    assert split.meta["tokens"] + split.eval_examples.meta["tokens"] == whole.meta["tokens"]
    assert whole.eval_examples is None and "heldout_sequences" not in whole.meta
