"""``speech-recognition``: audio in, its transcript out (Whisper; wav2vec2 with a CTC head).

**Model.** The model's config decides: an encoder-decoder (Whisper) is loaded
with ``AutoModelForSpeechSeq2Seq`` and learns the transcript token by token; an
encoder alone (wav2vec2, HuBERT) with ``AutoModelForCTC``, which learns it with
a CTC loss over its frames. Under LoRA both are a plain ``PeftModel`` (PEFT's
seq2seq wrapper feeds ``input_ids``, which Whisper has not). A model built here (``config:whisper-small``,
``config:wav2vec2-base``, a folder holding only a config) takes the processor
(feature extractor and tokenizer) of ``tiny-whisper`` or ``tiny-wav2vec2``, as
its family is, unless ``tokenizer_name_or_path`` names one.

**Data.** Without ``dataset:``, ``synthetic-speech``: clips of generated sound
(a few tones and noise, drawn from a fixed seed) whose length follows their
transcript, one of the shipped reviews (lowercased, cut to 60 characters;
0.05 s of audio per character, at least 0.5 s: clips of 0.5 to 3 s):
audio for throughput, not for learning to listen (``dataset_kwargs:
{num_clips: 256, seed: 0}``). Else a local file or hub dataset with the audio
in ``audio_field`` (default ``audio``: a ``.wav`` path relative to the file,
a list of samples at 16 kHz, or ``{"array": [...], "sampling_rate": 16000}``
as a datasets ``Audio`` column gives it) and the transcript in
``text_field`` (default ``text``). Audio at another rate is resampled to the
feature extractor's (linear interpolation). Nothing is cached: the features
(log-mel spectrograms for Whisper, normalised samples for wav2vec2) are made
as each batch is fed, so the step time includes them, as a user's training
pays them.

**Counts.** A sample is a clip. A token is a real token of a transcript (the
labels; padding excluded): tokens/s counts them, and
``audio_seconds_per_second_global`` the seconds of real audio fed per second, as
the field quotes speech throughput (Whisper reads at most its window, 30 s on
the real models: longer clips count what it read). Whisper pads every clip to
its window, so its encoder's cost is the same whatever the clip's length.

**FLOPs.** Counted (``trainer_entry.measure.counted``) along ``audio`` (the
real samples) and ``target`` (the transcript's tokens); split by part (the
audio encoder, the decoder, the head).

**Not taken.** Packing (a clip is one sample), ``completion_only_loss``, and
trainer ``sft``.
"""

from __future__ import annotations

import hashlib
import json
import wave
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer_entry.data.collate import (
    COUNTS,
    PADDED_TOKENS,
    REAL_LENGTHS,
    REAL_TOKENS,
    ROW_DIMS,
    input_dtype,
    pad_rows,
)
from trainer_entry.data.formats import IGNORE_INDEX
from trainer_entry.data.sources import load_records
from trainer_entry.models.tiny_bert import REVIEWS
from trainer_entry.settings.parsed import DataConfig, ParsedArguments
from trainer_entry.spec_errors import SpecError
from trainer_entry.tasks.task_protocol import (
    ColumnDataset,
    TaskData,
    TaskDefaults,
    refuse_completion_only,
    uncached,
    with_holdout,
)

#: the generated set's name (``dataset: synthetic-speech``, or no dataset at all)
SYNTHETIC = "synthetic-speech"
SYNTHETIC_VERSION = 1
#: a clip's length per character of its transcript, and its bounds
SECONDS_PER_CHARACTER, SHORTEST_S, LONGEST_S = 0.05, 0.5, 12.0
#: the longest transcript drawn from a review, in characters
TRANSCRIPT_CHARACTERS = 60
#: the rate a list of samples without one is taken at
DEFAULT_RATE = 16000
#: Whisper's start of a transcript, which its labels go without
START_TOKEN = "<|startoftranscript|>"


@dataclass
class Clips:
    """Audio clips at the feature extractor's rate, their transcripts' token ids, and what
    the preparation did."""

    audio: list[np.ndarray]
    targets: list[np.ndarray]
    rate: int
    meta: dict[str, Any]

    #: the samples the model reads of a clip (Whisper's window); None: all
    window: int | None = None

    def take(self, indices: Sequence[int]) -> Clips:
        audio = [self.audio[i] for i in indices]
        targets = [self.targets[i] for i in indices]
        counts = _counts(audio, targets, self.rate, self.window)
        return Clips(audio, targets, self.rate, {**self.meta, **counts}, self.window)


def _counts(
    audio: Sequence[np.ndarray], targets: Sequence[np.ndarray], rate: int, window: int | None
) -> dict[str, Any]:
    """The data record's counts: clips, transcript tokens, and the seconds of audio the
    model reads of them (a clip cut to Whisper's window counts the window)."""
    tokens = int(sum(len(t) for t in targets))
    read = sum(min(len(a), window) if window else len(a) for a in audio)
    return {
        "sequences": len(audio),
        "tokens": tokens,
        "label_tokens": tokens,
        "counts": {"audio_seconds": float(read) / rate, "target_tokens": tokens},
    }


def synthetic_clip(text: str, index: int, seed: int, rate: int) -> np.ndarray:
    """A clip for ``text``: a few tones and noise, as long as the text says, from a fixed seed."""
    seconds = min(LONGEST_S, max(SHORTEST_S, SECONDS_PER_CHARACTER * len(text)))
    n = int(seconds * rate)
    digest = hashlib.sha256(f"{SYNTHETIC_VERSION}:{seed}:{index}".encode()).digest()
    rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
    t = np.arange(n, dtype=np.float64) / rate
    signal = sum(
        rng.uniform(0.1, 0.3) * np.sin(2 * np.pi * rng.uniform(120, 2400) * t + rng.uniform(0, 6))
        for _ in range(3)
    )
    signal = signal + rng.normal(0.0, 0.02, n)
    return np.asarray(signal, dtype=np.float32)


def _synthetic(cfg: DataConfig) -> tuple[list[tuple[Any, str]], dict[str, Any]]:
    """(audio, transcript) pairs of the generated set, and its identity."""
    kwargs = dict(cfg.dataset_kwargs)
    unknown = sorted(set(kwargs) - {"num_clips", "seed"})
    if unknown:
        raise SpecError(
            f"{SYNTHETIC} takes dataset_kwargs num_clips and seed, not {', '.join(unknown)}"
        )
    count, seed = int(kwargs.get("num_clips", 256)), int(kwargs.get("seed", 0))
    if count < 2:
        raise SpecError(f"{SYNTHETIC}: num_clips must be at least 2, got {count}")
    texts = [json.loads(line)["text"] for line in REVIEWS.read_text().splitlines() if line.strip()]
    pairs: list[tuple[Any, str]] = []
    for i in range(count):
        text = texts[i % len(texts)].lower()[:TRANSCRIPT_CHARACTERS].strip()
        pairs.append(({"synthetic": (i, seed)}, text))
    return pairs, {"name": SYNTHETIC, "version": SYNTHETIC_VERSION, "clips": count, "seed": seed}


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """A PCM ``.wav`` file's samples (mono, −1…1) and rate."""
    try:
        with wave.open(str(path), "rb") as f:
            width, channels, rate = f.getsampwidth(), f.getnchannels(), f.getframerate()
            frames = f.readframes(f.getnframes())
    except (OSError, wave.Error, EOFError) as exc:
        raise SpecError(f"audio {path}: not a readable PCM .wav file ({exc})") from None
    kinds = {1: np.uint8, 2: np.int16, 4: np.int32}
    if width not in kinds:
        raise SpecError(f"audio {path}: {8 * width}-bit samples; use 8-, 16- or 32-bit PCM")
    samples = np.frombuffer(frames, dtype=kinds[width]).astype(np.float32)
    if width == 1:
        samples = (samples - 128.0) / 128.0
    else:
        samples /= float(2 ** (8 * width - 1))
    return samples.reshape(-1, channels).mean(axis=1), rate


def resampled(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    """``samples`` at ``target`` Hz (linear interpolation; as they are at that rate)."""
    if rate == target or len(samples) == 0:
        return np.asarray(samples, dtype=np.float32)
    n = max(1, round(len(samples) * target / rate))
    old = np.arange(len(samples)) / rate
    new = np.arange(n) / target
    return np.asarray(np.interp(new, old, samples), dtype=np.float32)


def _decoded(value: Any) -> tuple[Any, int] | None:
    """(samples, rate) of a ``{"array", "sampling_rate"}`` dict, or of what a datasets
    ``Audio`` column decodes to (an object answering the same keys); None for others."""
    if isinstance(value, str | list | np.ndarray) or not hasattr(value, "__getitem__"):
        return None
    try:
        array = value["array"]
    except (KeyError, TypeError, IndexError):
        return None
    try:
        found = int(value["sampling_rate"] or DEFAULT_RATE)
    except (KeyError, TypeError, IndexError):
        found = DEFAULT_RATE
    return array, found


def audio_of(value: Any, folder: Path | None, rate: int, where: str) -> np.ndarray:
    """One record's audio at ``rate``: a ``.wav`` path (relative to ``folder``), a list of
    samples (16 kHz), a ``{"array", "sampling_rate"}`` dict, or a generated clip's key."""
    if isinstance(value, Mapping) and "synthetic" in value:
        index, seed = value["synthetic"]
        return synthetic_clip(value.get("text", ""), index, seed, rate)
    if isinstance(value, str):
        path = Path(value).expanduser()
        if not path.is_absolute() and folder is not None:
            path = folder / path
        if not path.is_file():
            raise SpecError(f"{where}: audio file not found: {path}")
        samples, found = read_wav(path)
        return resampled(samples, found, rate)
    decoded = _decoded(value)
    if decoded is not None:
        array, found = decoded
        return resampled(np.asarray(array, dtype=np.float32).reshape(-1), found, rate)
    if isinstance(value, list | np.ndarray) and len(value) > 0:
        return resampled(np.asarray(value, dtype=np.float32).reshape(-1), DEFAULT_RATE, rate)
    raise SpecError(
        f"{where}: the audio is {type(value).__name__}; give a .wav path, a list of samples "
        "or {array, sampling_rate}"
    )


def fitted_extractor(extractor: Any, config: Any) -> Any:
    """Whisper's feature extractor for ``config``'s window and mel bins.

    A model built here takes ``tiny-whisper``'s processor, whose window is 2 s of 80 mel
    bins; ``config:whisper-small`` reads 30 s (3000 frames), ``whisper-large-v3`` 128
    bins. Where they differ, the extractor is made again with the model's (its hop,
    rate and FFT kept); a checkpoint's own extractor already fits and is kept.
    """
    frames = 2 * int(getattr(config, "max_source_positions", 0))
    bins = int(getattr(config, "num_mel_bins", 0))
    if not frames or not bins:
        return extractor
    if int(extractor.nb_max_frames) == frames and int(extractor.feature_size) == bins:
        return extractor
    hop, rate = int(extractor.hop_length), int(extractor.sampling_rate)
    samples = frames * hop
    if samples % rate:
        raise SpecError(
            f"the model reads {frames} mel frames, which at hop {hop} is not a whole number "
            f"of seconds at {rate} Hz; set tokenizer_name_or_path to its own processor"
        )
    return type(extractor)(
        feature_size=bins,
        sampling_rate=rate,
        hop_length=hop,
        chunk_length=samples // rate,
        n_fft=int(extractor.n_fft),
    )


def _is_ctc(config: Any) -> bool:
    return not getattr(config, "is_encoder_decoder", False)


class SpeechModels:
    """``AutoModelForSpeechSeq2Seq`` or ``AutoModelForCTC``, as the model's config says;
    tells its task which it was."""

    def __init__(self, task: SpeechRecognitionTask) -> None:
        self.task = task

    def _auto(self, config: Any) -> Any:
        from transformers import AutoModelForCTC, AutoModelForSpeechSeq2Seq

        self.task.ctc = _is_ctc(config)
        return AutoModelForCTC if self.task.ctc else AutoModelForSpeechSeq2Seq

    def from_config(self, config: Any, **kwargs: Any) -> Any:
        return self._auto(config).from_config(config, **kwargs)

    def from_pretrained(self, path: str, **kwargs: Any) -> Any:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(
            path,
            revision=kwargs.get("revision"),
            trust_remote_code=kwargs.get("trust_remote_code", False),
        )
        return self._auto(config).from_pretrained(path, **kwargs)


@dataclass
class ClipCollator:
    """The feature extractor over a batch's clips, the transcripts right-padded with
    ``IGNORE_INDEX``, and the counts: real audio seconds and transcript tokens."""

    feature_extractor: Any
    rate: int
    ctc: bool
    #: the samples the model reads of a clip (Whisper's window); None: all
    window: int | None
    #: the model's weights' dtype, which the features are fed in (None: as made)
    dtype: torch.dtype | None = None

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        audio = [f["audio"] for f in features]
        targets = [f["labels"] for f in features]
        if self.ctc:
            made = self.feature_extractor(
                audio,
                sampling_rate=self.rate,
                padding=True,
                return_attention_mask=True,
                return_tensors="pt",
            )
            inputs = {"input_values": made["input_values"]}
            if "attention_mask" in made:
                inputs["attention_mask"] = made["attention_mask"]
        else:
            made = self.feature_extractor(audio, sampling_rate=self.rate, return_tensors="pt")
            inputs = {"input_features": made["input_features"]}
        if self.dtype is not None:
            # a convolution reads the features first: in the weights' dtype
            inputs = {
                k: v.to(self.dtype) if v.is_floating_point() else v for k, v in inputs.items()
            }
        labels = pad_rows(targets, IGNORE_INDEX)
        fed = [min(len(a), self.window) if self.window else len(a) for a in audio]
        lengths = [len(t) for t in targets]
        return {
            **inputs,
            "labels": labels,
            REAL_TOKENS: sum(lengths),
            PADDED_TOKENS: int(labels.numel()),
            REAL_LENGTHS: lengths,
            COUNTS: {"audio_seconds": sum(fed) / self.rate, "target_tokens": sum(lengths)},
            ROW_DIMS: {"audio": fed, "target": lengths},
        }


class SpeechRecognitionTask(TaskDefaults):
    name = "speech-recognition"
    sample_unit = "clips"
    modality = "audio"
    #: False: Whisper's and CTC's losses are means over the micro-batch
    loss_counts_items = False
    flop_dims: tuple[str, ...] = ("audio", "target")
    #: wav2vec2's SpecAugment masks frames by index (no FLOPs), which meta cannot run
    probe_config: Mapping[str, Any] = {"apply_spec_augment": False}

    def __init__(self) -> None:
        #: the model is an encoder with a CTC head (set when it is built)
        self.ctc = False
        self._window: int | None = None
        self._rate = DEFAULT_RATE
        self._extractor: Any = None
        self._dtype: torch.dtype | None = None

    @property
    def tokenizer_model(self) -> str | None:
        """The tiny model whose processor a model built here takes: its family's."""
        return "tiny-wav2vec2" if self.ctc else "tiny-whisper"

    def model_class(self) -> Any:
        return SpeechModels(self)

    # peft_task_type None, a plain PeftModel: PEFT's seq2seq wrapper feeds input_ids,
    # which Whisper has not

    def _records(
        self, cfg: DataConfig
    ) -> tuple[list[tuple[Any, str]], dict[str, Any], Path | None]:
        if cfg.dataset in (None, SYNTHETIC):
            pairs, identity = _synthetic(cfg)
            return pairs, identity, None
        records, identity = load_records(cfg)
        pairs = []
        for i, r in enumerate(records):
            for key in (cfg.audio_field, cfg.text_field):
                if r.get(key) is None:
                    fields = ", ".join(sorted(map(str, r))) or "none"
                    raise SpecError(
                        f"record {i} has no field '{key}' (set audio_field and text_field); "
                        f"its fields: {fields}"
                    )
            pairs.append((r[cfg.audio_field], str(r[cfg.text_field])))
        path = Path(cfg.dataset).expanduser()
        return pairs, identity, path.parent if path.is_file() else None

    def prepare(
        self,
        parsed: ParsedArguments,
        processor: Any,
        data_dir: Path,
        *,
        as_given: bool,
        model_config: Any,
    ) -> TaskData:
        cfg = parsed.data
        refuse_completion_only(cfg, self.name, "the transcript's")
        extractor = getattr(processor, "feature_extractor", None)
        tokenizer = getattr(processor, "tokenizer", None)
        if extractor is None or tokenizer is None:
            raise SpecError(
                "speech-recognition needs a processor with a feature extractor and a tokenizer "
                "(set tokenizer_name_or_path to the model's processor)"
            )
        self.ctc = _is_ctc(model_config)
        if not self.ctc:
            extractor = fitted_extractor(extractor, model_config)
        self._extractor = extractor
        self._dtype = input_dtype(model_config)
        self._rate = int(extractor.sampling_rate)
        self._window = None if self.ctc else int(getattr(extractor, "n_samples", 0)) or None
        limit = cfg.max_seq_len
        if not self.ctc:
            limit = min(limit, int(getattr(model_config, "max_target_positions", limit)))
        pairs, identity, folder = self._records(cfg)
        audio: list[np.ndarray] = []
        targets: list[np.ndarray] = []
        cut = dropped = 0
        # the start token the model puts before the labels itself: its own, and the
        # tokenizer's (a built model's ids are not the tiny processor's)
        starts = {getattr(model_config, "decoder_start_token_id", None)}
        starts.add(tokenizer.convert_tokens_to_ids(START_TOKEN))
        starts.discard(getattr(tokenizer, "unk_token_id", None))
        for i, (value, text) in enumerate(pairs):
            if not text.strip():
                dropped += 1
                continue
            if isinstance(value, Mapping) and "synthetic" in value:
                value = {**value, "text": text}
            samples = audio_of(value, folder, self._rate, f"record {i}")
            ids = list(tokenizer(text)["input_ids"])
            if not self.ctc and ids and ids[0] in starts:
                ids = ids[1:]  # the model puts its start token before the labels itself
            if len(ids) > limit:
                cut += 1
                ids = ids[:limit]
            audio.append(samples)
            targets.append(np.asarray(ids, dtype=np.int64))
        if not audio:
            raise SpecError("no record has a transcript to learn")
        meta: dict[str, Any] = {
            "source": identity,
            "examples": len(pairs),
            "max_seq_len": limit,
            "examples_truncated": cut,
            "examples_dropped": dropped,
            **uncached(as_given),
            **_counts(audio, targets, self._rate, self._window),
        }
        clips = Clips(audio, targets, self._rate, meta, self._window)
        # each example is a document: the two parts are disjoint
        return with_holdout(clips, len(audio), parsed)

    def dataset(self, data: TaskData) -> torch.utils.data.Dataset[Any]:
        return ColumnDataset(audio=data.examples.audio, labels=data.examples.targets)

    def collator(self, processor: Any, parsed: ParsedArguments) -> Any:
        if self._extractor is None:
            raise RuntimeError("the speech-recognition collator is made after prepare()")
        return ClipCollator(self._extractor, self._rate, self.ctc, self._window, self._dtype)

    def longest(self, parsed: ParsedArguments, model_config: Any) -> dict[str, int] | None:
        if _is_ctc(model_config):
            return None  # a CTC model reads whole clips: their lengths are the data's
        target = min(parsed.data.max_seq_len, int(model_config.max_target_positions))
        return {"audio": 0, "target": target}  # Whisper reads its window, however long

    def probe_batch(self, model_config: Any, lengths: Mapping[str, int]) -> dict[str, Any]:
        meta = torch.device("meta")
        if _is_ctc(model_config):
            # no labels: CTC's loss reads their values (the logits' mean stands for it)
            return {"input_values": torch.ones((1, lengths["audio"]), device=meta)}
        frames = 2 * int(model_config.max_source_positions)  # the window, in mel frames
        features = torch.ones((1, int(model_config.num_mel_bins), frames), device=meta)
        labels = torch.ones((1, lengths["target"]), dtype=torch.long, device=meta)
        return {"input_features": features, "labels": labels}
