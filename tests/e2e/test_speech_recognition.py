"""The real training child on ``speech-recognition``: the tiny Whisper and the tiny wav2vec2.

Whisper under gloo DDP with LoRA on a user's JSONL of ``.wav`` files (8 kHz,
resampled to the model's 16 kHz), every clip fed once with no step left out,
so the row's audio seconds and transcript tokens are checked against the files
and transcripts read here, and its FLOPs against PyTorch's FLOP counter run
here clip by clip. wav2vec2 (CTC) on the generated clips, one process.
"""

from __future__ import annotations

import json
import math
import wave

import numpy as np
import pytest
import torch
from countedcheck import counted_step, real
from test_child import run_child

from trainer_entry.models.tiny_whisper import ensure_tiny_whisper
from trainer_entry.tasks.speech_recognition import SpeechRecognitionTask

pytestmark = [pytest.mark.e2e, pytest.mark.long]

CLIPS, RATE = 16, 8000


def _write_clips(folder) -> list[tuple[int, str]]:
    """CLIPS .wav files of 0.3 to 3 s at 8 kHz and their transcripts; (samples, text) each."""
    rng = np.random.default_rng(0)
    records, made = [], []
    for i in range(CLIPS):
        n = int(RATE * (0.3 + 0.18 * i))
        pcm = (rng.uniform(-0.5, 0.5, n) * 32767).astype(np.int16)
        with wave.open(str(folder / f"clip{i}.wav"), "wb") as f:
            f.setnchannels(1)
            f.setsampwidth(2)
            f.setframerate(RATE)
            f.writeframes(pcm.tobytes())
        text = " ".join(["good"] * (1 + i % 5)) + " movie"
        records.append({"path": f"clip{i}.wav", "sentence": text})
        made.append((n, text))
    (folder / "speech.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return made


def test_whisper_under_ddp_counts_the_audio_and_the_transcripts(tmp_path) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForSpeechSeq2Seq, AutoProcessor

    clips = _write_clips(tmp_path)
    processes, pd = 2, 4
    arguments = {
        "task": "speech-recognition",
        "model_name_or_path": "tiny-whisper",
        "dataset": str(tmp_path / "speech.jsonl"),
        "audio_field": "path",
        "text_field": "sentence",
        "per_device_train_batch_size": pd,
        "max_steps": CLIPS // (processes * pd),
        "logging_steps": 1,
        "learning_rate": 1e-3,
        "warmup_steps_excluded": 0,
        "peft_method": "lora",
        "r": 4,
        "target_modules": ["q_proj", "v_proj"],
    }
    proc, result = run_child(tmp_path, arguments, processes=processes)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert result["status"] == "ok", result.get("error")
    assert (result["task"], result["sample_unit"]) == ("speech-recognition", "clips")
    assert result["model"]["architecture"] == "WhisperForConditionalGeneration"
    processor = AutoProcessor.from_pretrained(ensure_tiny_whisper())
    window = processor.feature_extractor.n_samples
    start = processor.tokenizer.convert_tokens_to_ids("<|startoftranscript|>")
    targets = []
    for _, text in clips:
        ids = processor.tokenizer(text)["input_ids"]
        targets.append(len(ids) - (ids[0] == start))
    # 8 kHz made 16 kHz, and Whisper reads at most its window
    seconds = sum(min(2 * n, window) for n, _ in clips) / 16000
    m = result["metrics"]
    assert m["tokens_total"] == m["tokens_measured"] == sum(targets)
    assert m["samples_measured"] == CLIPS
    time = m["measured_time_s"]
    assert m["audio_seconds_per_second_global"] == pytest.approx(seconds / time)
    # the data record counts the audio the model reads too
    assert result["data"]["counts"]["audio_seconds"] == pytest.approx(seconds)
    model = AutoModelForSpeechSeq2Seq.from_pretrained(
        ensure_tiny_whisper(), attn_implementation="eager"
    )
    model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"])).train()
    task, reference = SpeechRecognitionTask(), 0
    for (n, _), target in zip(clips, targets, strict=True):
        inputs = real(task.probe_batch(model.config, {"audio": 2 * n, "target": target}))
        reference += counted_step(model, inputs)
    assert m["flops_per_token"] == pytest.approx(reference / sum(targets), rel=0.10)
    assert {"model.encoder", "model.decoder"} <= set(result["flops"]["components"])
    assert all(math.isfinite(v) for _, v in result["loss_history"])


def test_wav2vec2_trains_on_the_generated_clips(tmp_path) -> None:
    arguments = {
        "task": "speech-recognition",
        "model_name_or_path": "tiny-wav2vec2",
        "dataset_kwargs": {"num_clips": 16},
        "per_device_train_batch_size": 4,
        "max_steps": 4,
        "logging_steps": 1,
        "learning_rate": 1e-3,
        "warmup_steps_excluded": 0,
    }
    proc, result = run_child(tmp_path, arguments, processes=1)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert result["status"] == "ok", result.get("error")
    assert result["model"]["architecture"] == "Wav2Vec2ForCTC"
    m = result["metrics"]
    counts = result["data"]["counts"]
    # every clip once: the audio per second is the set's seconds over the window
    assert m["audio_seconds_per_second_global"] == pytest.approx(
        counts["audio_seconds"] / m["measured_time_s"]
    )
    assert m["tokens_total"] == counts["target_tokens"] == result["data"]["label_tokens"]
    assert m["flops_per_token"] > 0 and result["flops"]["method"] == "counted"
    assert all(math.isfinite(v) for _, v in result["loss_history"])
    assert torch.tensor(m["flops_per_sample"]) > 0
