"""The recordings of a packed row: :class:`~trainer_adapter.hf.inputs.HFPacker`'s audio half.

A generation with recordings records the Whisper-style audio rule prep measured them with
(sampling rate, hop, window in seconds). The processor's feature extractor must make the same
frames, so it is checked against that rule at construction (:func:`check_processor_audio`):
its rate, hop, ``chunk_length`` and ``n_fft``, each difference named with both values. Each
recording is then loaded and turned into log-mel frames by
:class:`~shards.read.audio_features.AudioFeatures` (transformers' ``load_audio`` steps and
``WhisperFeatureExtractor``, whose settings are the checked ones: the processor's own frames,
exactly, at any length up to the window), and its ``<|AUDIO|>`` becomes
:func:`~dataprep.media_rules.whisper_audio.audio_tokens` tokens, the count the processor writes.

How the row carries them (``PackerRules.audio``):

* ``packed`` (Qwen2.5-Omni's thinker): ``input_features [recordings, mel, longest]``, each
  recording's frames from the left, zeros after them, with ``feature_attention_mask
  [recordings, longest]`` (1 on its frames). The thinker takes the masked frames side by side
  (its ``get_audio_features``), so the padding never reaches its tower: the processor pads
  every recording to the whole 300-s window; the longest recording of the row is enough.

* ``window`` (Qwen2-Audio: a padded encoder that takes the whole window): every recording's
  window as the processor pads it (:meth:`~shards.read.audio_features.AudioFeatures.window`:
  the frames of the zeros after the recording too, which its convolutions read beside the
  last frames), ``[recordings, mel, window]``, with ``feature_attention_mask``.

* ``windows`` (Audio Flamingo 3: a padded encoder over several windows a recording): every
  recording cut into windows of ``chunk_length`` seconds, at most the rule's ``max_windows``
  (:meth:`~shards.read.audio_features.AudioFeatures.windows`), each window as the processor
  pads it, ``[windows, mel, window]``, with ``input_features_mask`` (the family's
  ``audio_mask``); a recording's tokens are those of all its windows' frames. The processor's
  ``max_audio_len`` must be the rule's windows' length.

A row without recordings gets neither key.
"""

from __future__ import annotations

import numpy as np
import torch

from shards.read.audio_features import N_FFT, AudioFeatures
from shards.read.prep_settings import SettingsMismatch

__all__ = ["audio_features", "check_processor_audio", "pack_audio"]


def _extractor(processor, family: str):
    fe = getattr(processor, "feature_extractor", None)
    if fe is None:
        raise ValueError(
            f"the {family} processor has no feature_extractor: recordings are turned into "
            "features by the processor's own (WhisperFeatureExtractor); build the processor "
            "with it"
        )
    return fe


def check_processor_audio(processor, rule, family: str) -> None:
    """Raise :class:`SettingsMismatch` when ``processor``'s feature extractor makes other frames
    of a recording than ``rule`` (the generation's recorded audio rule) counted."""
    fe = _extractor(processor, family)
    pairs = (
        ("sampling_rate", getattr(fe, "sampling_rate", None), rule.sampling_rate),
        ("hop_length", getattr(fe, "hop_length", None), rule.hop_length),
        ("chunk_length", getattr(fe, "chunk_length", None), rule.chunk_length),
        ("n_fft", getattr(fe, "n_fft", None), N_FFT),
    )
    windows = getattr(rule, "max_windows", None)
    if windows is not None:  # Audio Flamingo 3's processor cuts at max_audio_len seconds
        seconds = windows * rule.chunk_length
        pairs += (("max_audio_len", getattr(processor, "max_audio_len", None), seconds),)
    diff = [
        f"{k} {have!r} (processor) vs {want!r} (prep)" for k, have, want in pairs if have != want
    ]
    if diff:
        raise SettingsMismatch(
            f"the {family} processor's feature extractor makes other frames of a recording "
            f"than audio rule {rule.spec()!r} the generation was measured with: "
            f"{'; '.join(diff)}; prep with the model's audio rule (--audio-rule), or build the "
            "processor with the rule's settings"
        )


def audio_features(processor, rule, family: str) -> AudioFeatures:
    """The recordings' features with the processor's mel bins (``feature_size``)."""
    return AudioFeatures(rule=rule, mel=int(_extractor(processor, family).feature_size))


def pack_audio(parts: list[dict], mask: str = "feature_attention_mask") -> dict:
    """The row's audio inputs from its samples' recordings (each part's ``audio_frames``:
    ``[frames, mel]`` arrays, in the order their tokens stand, and ``audio_lens``: each one's
    mask frames; a whole window is longer than its mask); ``mask``: the frame mask's name."""
    feats = [f for p in parts for f in p.get("audio_frames", ())]
    lens = [n for p in parts for n in p.get("audio_lens", ())]
    if not feats:
        return {}
    longest = max(len(f) for f in feats)
    mel = feats[0].shape[1]
    x = np.zeros((len(feats), mel, longest), dtype=np.float32)
    name, mask = mask, np.zeros((len(feats), longest), dtype=np.int64)
    for i, (f, n) in enumerate(zip(feats, lens, strict=True)):
        x[i, :, : len(f)] = f.T
        mask[i, :n] = 1
    return {"input_features": torch.from_numpy(x), name: torch.from_numpy(mask)}
