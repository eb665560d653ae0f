"""The ``speech-recognition`` task: audio reading, the counts, FLOPs against PyTorch's counter.

Every shipped speech architecture (``model_type`` whisper or wav2vec2, shrunk
with its structure kept) and the two tiny models are checked, full, LoRA and
checkpointed, against ``FlopCounterMode`` summed over clips of different
lengths and transcripts (``tests/countedcheck.py``). Whisper pads every clip to
its window, so its encoder costs the same for each.
"""

from __future__ import annotations

import importlib
import json
import wave
from pathlib import Path

import numpy as np
import pytest
import torch
from countedcheck import counted_over_reference, in_mode

from trainer_entry.data.collate import COUNTS, PADDED_TOKENS, REAL_TOKENS, ROW_DIMS
from trainer_entry.data.formats import IGNORE_INDEX
from trainer_entry.models.kinds import TINY_MODELS
from trainer_entry.models.load import ARCHITECTURES, shipped_architectures
from trainer_entry.spec_errors import SpecError
from trainer_entry.tasks.speech_recognition import (
    ClipCollator,
    SpeechRecognitionTask,
    audio_of,
    read_wav,
    resampled,
    synthetic_clip,
)

#: the model types whose shipped architectures this file checks
SPEECH_TYPES = ("whisper", "wav2vec2")
ROWS = [
    {"audio": 9000, "target": 12},
    {"audio": 24000, "target": 5},
    {"audio": 16000, "target": 30},
]


def _model_type(name: str) -> str:
    return str(json.loads((ARCHITECTURES / f"{name}.json").read_text())["model_type"])


SHIPPED = [n for n in shipped_architectures() if _model_type(n) in SPEECH_TYPES]


def _tiny(name: str) -> Path:
    module, _, function = TINY_MODELS[name].partition(":")
    return Path(getattr(importlib.import_module(module), function)())


def _shrunk(name: str):
    """A shipped architecture at a tiny size, its structure (conv front end, window) kept."""
    from transformers import AutoConfig

    config = {
        k: v
        for k, v in json.loads((ARCHITECTURES / f"{name}.json").read_text()).items()
        if not k.startswith("_")
    }
    if config["model_type"] == "whisper":
        config.update(d_model=64, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=512)
        config.update(encoder_layers=2, decoder_layers=2, max_source_positions=100)
        config.update(encoder_attention_heads=4, decoder_attention_heads=4)
        config.update(max_target_positions=64, begin_suppress_tokens=None)
        config.update(bos_token_id=1, eos_token_id=0, pad_token_id=0, decoder_start_token_id=1)
    else:
        config.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2)
        config.update(num_attention_heads=4, conv_dim=[32] * len(config["conv_dim"]))
        config.update(num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)
    return AutoConfig.for_model(**config)


def _model(name: str, mode: str):
    from transformers import AutoModelForCTC, AutoModelForSpeechSeq2Seq

    torch.manual_seed(0)
    if name.startswith("tiny-"):
        folder = _tiny(name)
        auto = AutoModelForCTC if "wav2vec2" in name else AutoModelForSpeechSeq2Seq
        model = auto.from_pretrained(folder, attn_implementation="eager")
    else:
        config = _shrunk(name)
        auto = AutoModelForSpeechSeq2Seq if config.is_encoder_decoder else AutoModelForCTC
        model = auto.from_config(config, attn_implementation="eager")
    task = SpeechRecognitionTask()
    model = in_mode(model, task, mode, ["q_proj", "v_proj"])
    # SpecAugment masks frames by index at random: off in the reference, as in the count
    (
        model.get_base_model() if hasattr(model, "get_base_model") else model
    ).config.apply_spec_augment = False
    return model, task


def test_the_shipped_speech_architectures_are_here() -> None:
    assert {"whisper-small", "whisper-large-v3", "wav2vec2-base"} <= set(SHIPPED)


@pytest.mark.parametrize(
    ("name", "mode"),
    [
        ("tiny-whisper", "full"),
        ("tiny-wav2vec2", "full"),
        *((name, mode) for name in SHIPPED for mode in ("full", "lora", "checkpointed")),
    ],
)
def test_counted_flops_match_the_flop_counter(name: str, mode: str) -> None:
    """Within 10%. A CTC model's frames are its samples divided by its convolutions'
    strides, rounded down: the fit is exact up to that rounding."""
    model, task = _model(name, mode)
    ratio = counted_over_reference(
        task,
        model,
        ROWS,
        checkpointing=mode == "checkpointed",
        labels=lambda lengths: torch.ones((1, lengths["target"]), dtype=torch.long),
    )
    assert ratio == pytest.approx(1.0, rel=0.10)
    assert ratio == pytest.approx(1.0, rel=0.01)


def _write_wav(path: Path, samples: np.ndarray, rate: int) -> None:
    with wave.open(str(path), "wb") as f:
        f.setnchannels(2)
        f.setsampwidth(2)
        f.setframerate(rate)
        pcm = (np.clip(samples, -1, 1) * 32767).astype(np.int16)
        f.writeframes(np.repeat(pcm[:, None], 2, axis=1).tobytes())


def test_audio_is_read_from_a_wav_a_list_or_an_array_dict(tmp_path: Path) -> None:
    tone = np.sin(np.linspace(0, 200, 8000)).astype(np.float32) * 0.5
    _write_wav(tmp_path / "a.wav", tone, 8000)
    samples, rate = read_wav(tmp_path / "a.wav")
    assert rate == 8000 and samples.shape == (8000,)
    assert np.allclose(samples, tone, atol=1e-4)  # the two channels averaged
    # a relative path from the data file's folder; 8 kHz made 16 kHz: twice the samples
    at16 = audio_of("a.wav", tmp_path, 16000, "record 0")
    assert at16.shape == (16000,) and np.allclose(at16[::2], tone, atol=1e-3)
    assert audio_of([0.0] * 160, None, 16000, "r").shape == (160,)
    assert audio_of({"array": [0.0] * 80, "sampling_rate": 8000}, None, 16000, "r").shape == (160,)

    class Decoded:  # what a datasets Audio column decodes to: answers the same keys
        def __getitem__(self, key: str) -> object:
            return {"array": np.zeros(80), "sampling_rate": 8000}[key]

    assert audio_of(Decoded(), None, 16000, "r").shape == (160,)
    assert resampled(np.ones(3, dtype=np.float32), 16000, 16000).shape == (3,)
    with pytest.raises(SpecError, match="audio file not found"):
        audio_of("missing.wav", tmp_path, 16000, "record 3")
    with pytest.raises(SpecError, match="record 4: the audio is int"):
        audio_of(7, None, 16000, "record 4")


def test_the_generated_clips_are_fixed_and_follow_their_text() -> None:
    a = synthetic_clip("hello there", 3, 0, 16000)
    assert np.array_equal(a, synthetic_clip("hello there", 3, 0, 16000))
    assert not np.array_equal(a, synthetic_clip("hello there", 4, 0, 16000))
    assert len(a) == int(0.55 * 16000)
    assert len(synthetic_clip("x", 0, 0, 16000)) == 8000  # at least half a second


def _whisper_processor():
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(_tiny("tiny-whisper"))


def test_a_whisper_batch_counts_the_audio_it_reads_and_the_transcripts() -> None:
    processor = _whisper_processor()
    extractor = processor.feature_extractor
    window = extractor.n_samples  # the tiny model's 2 s
    collate = ClipCollator(extractor, 16000, ctc=False, window=window)
    long = np.zeros(window + 8000, dtype=np.float32)
    short = np.zeros(4000, dtype=np.float32)
    batch = collate([{"audio": long, "labels": [5, 6, 7]}, {"audio": short, "labels": [8]}])
    assert tuple(batch["input_features"].shape) == (2, 80, 200)
    assert batch["labels"].tolist() == [[5, 6, 7], [8, IGNORE_INDEX, IGNORE_INDEX]]
    assert batch[REAL_TOKENS] == 4 and batch[PADDED_TOKENS] == 6
    # the long clip counts the window it was cut to
    assert batch[COUNTS] == {"audio_seconds": (window + 4000) / 16000, "target_tokens": 4}
    assert batch[ROW_DIMS] == {"audio": [window, 4000], "target": [3, 1]}


def test_a_ctc_batch_pads_the_samples_and_counts_them_real() -> None:
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(_tiny("tiny-wav2vec2"))
    collate = ClipCollator(processor.feature_extractor, 16000, ctc=True, window=None)
    batch = collate(
        [
            {"audio": np.ones(3200, dtype=np.float32), "labels": [5, 6]},
            {"audio": np.ones(1600, dtype=np.float32), "labels": [7]},
        ]
    )
    assert tuple(batch["input_values"].shape) == (2, 3200)
    assert batch["attention_mask"].sum().item() == 4800
    assert batch[COUNTS] == {"audio_seconds": 0.3, "target_tokens": 3}
    assert batch[ROW_DIMS] == {"audio": [3200, 1600], "target": [2, 1]}


@pytest.mark.parametrize(("name", "bins"), [("whisper-small", 80), ("whisper-large-v3", 128)])
def test_a_built_whisper_gets_the_tiny_extractor_at_its_window(name: str, bins: int) -> None:
    """config:whisper-* takes tiny-whisper's processor (2 s, 80 bins): made again for the
    model's 30 s window and its mel bins, or the model would refuse the features."""
    from transformers import AutoConfig

    from trainer_entry.models.resolve import architecture_config
    from trainer_entry.tasks.speech_recognition import fitted_extractor

    tiny = _whisper_processor().feature_extractor
    config = AutoConfig.for_model(**architecture_config(f"config:{name}"))
    fitted = fitted_extractor(tiny, config)
    features = fitted([np.zeros(16000, dtype=np.float32)], sampling_rate=16000, return_tensors="pt")
    assert tuple(features["input_features"].shape) == (1, bins, 2 * config.max_source_positions)
    assert fitted.n_samples == 30 * 16000
    # the tiny model's own extractor already fits it: kept as it is
    assert fitted_extractor(tiny, AutoConfig.from_pretrained(_tiny("tiny-whisper"))) is tiny
