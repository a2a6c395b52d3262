"""Collation of a group into model-ready tensors (packed, variable-length).

For every sample: the conversation is rendered with the chat template and tokenized with the
real tokenizer; each ``<image>`` becomes as many image-context tokens as the vision policy gives
that image; labels are the token ids inside assistant turns and -100 elsewhere. Images are decoded
with Pillow and cut per the policy (InternVL tiles + thumbnail, a fixed square, or Qwen2-VL's
smart resize) into patch vectors (3 x patch x patch values each, CLIP-normalized; with
``pixels="uint8"`` the raw pixel bytes, a quarter of the bytes to move between ranks, normalized
on the device by :func:`normalize_patches`). The group is
packed: ``cu_seqlens`` delimit samples in ``input_ids``; ``patch_cu_seqlens`` delimit the
encoder sequences (one per image or tile) in ``patches``. ``llm_lens`` and ``vit_lens`` are the
per-sample lengths the runtime balancer needs; they equal the cost table's ``llm_tokens`` and
``vit_tokens`` when the same tokenizer, template and policy are used. ``units_hw`` gives each
encoder sequence's patch grid (rows, columns) and ``num_units`` how many belong to each sample,
so a model can merge neighbouring patches (pixel shuffle) and the trainer can move samples.

A collator of a generation whose recordings prep measured (``audio_rule``, a Whisper-style
encoder's) also builds them: each recording's log-mel frames
(:class:`~shards.read.audio_features.AudioFeatures`: the frames prep counted) side by side in
``audio_features`` (``[frames, mel]``), ``audio_lens`` (each recording's frames, ``[n, 1]``),
``audio_frames`` and ``num_audios`` per sample, and each ``<audio>`` becomes as many audio
tokens (``audio_token_id``) as the encoder gives the LLM. Videos are refused: this collator
would count them as text.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from dataprep.chat_template import load_template
from dataprep.image_orientation import decode_image
from dataprep.policies import (
    FixedPolicy,
    InternVLPolicy,
    Qwen2VLPolicy,
    internvl_grid,
    parse_vision_policy,
)
from dataprep.records import AUDIO_PLACEHOLDER, IMAGE_PLACEHOLDER
from dataprep.setting_checks import check_family
from equishard.common.local_files import regular_file
from equishard.common.values import check_count, check_flag
from equishard.contracts.columns import AUDIO_SEQ_LENS, AUDIO_TOKENS, LLM_TOKENS, VIT_TOKENS
from shards.read.audio_features import MAX_MEL, AudioFeatures

__all__ = ["AUDIO_CONTEXT", "IMAGE_CONTEXT", "Collator", "normalize_patches"]

IMAGE_CONTEXT = "<IMG_CONTEXT>"
AUDIO_CONTEXT = "<AUDIO_CONTEXT>"
_MEAN = np.array([0.48145466, 0.4578275, 0.40821073], dtype=np.float32)
_STD = np.array([0.26862954, 0.26130258, 0.27577711], dtype=np.float32)


def _patches(
    img: Image.Image, size: tuple[int, int], p: int, raw: bool = False
) -> tuple[np.ndarray, tuple[int, int]]:
    """Resize to (width, height) and cut into row-major p x p patches -> ([n, 3*p*p], (rows, cols));
    ``raw``: the uint8 pixels, else CLIP-normalized float32."""
    a = np.asarray(img.resize(size, Image.Resampling.BICUBIC))
    if not raw:
        a = (a.astype(np.float32) / 255.0 - _MEAN) / _STD
    h, w = size[1] // p, size[0] // p
    return a.reshape(h, p, w, p, 3).transpose(0, 2, 1, 3, 4).reshape(h * w, p * p * 3), (h, w)


def normalize_patches(x: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 patch rows ([n, p*p*3], channels last, as ``pixels="uint8"`` collates them) ->
    CLIP-normalized rows in ``dtype``, computed where ``x`` is (float32, then cast); float rows
    (already normalized) are only cast."""
    if x.dtype != torch.uint8:
        return x.to(dtype)
    mean = torch.as_tensor(_MEAN, device=x.device)
    std = torch.as_tensor(_STD, device=x.device)
    y = (x.view(x.shape[0], x.shape[1] // 3, 3).to(torch.float32) / 255.0 - mean) / std
    return y.view(x.shape).to(dtype)


def _refuse_media(sample, audio: bool) -> None:
    """A sample with videos, or recordings without an audio rule: this collator would count
    its ``<video>``/``<audio>`` mark as text and drop the media (a sample counted as something
    else than it is); refused, naming what to use."""
    media = [
        f"{len(v)} {what}"
        for what, v in (
            ("video(s)", getattr(sample, "videos", ())),  # a sample object of the caller's
            ("recording(s)", () if audio else getattr(sample, "audios", ())),  # own may not
        )  # carry media
        if v
    ]
    if media:
        raise ValueError(
            f"sample {sample.meta.get('sample_id')!r} has {' and '.join(media)}: equishard's own "
            "collator (equishard train) builds images, text and the recordings of an audio "
            "rule prep measured, and would count these as text; train such a generation with "
            "a Hugging Face model (trainer_adapter.HFPacker, balance_model), or prep without them"
        )


@dataclass(frozen=True, kw_only=True)
class Collator:
    tokenizer: str
    template: str = "chatml"
    vision_policy: str = "internvl"
    pixels: str = "normalized"  # or "uint8": raw pixel bytes, normalized later on the device
    # each sample's lengths against the costs prep recorded in it (meta["cost"]), where present
    check_costs: bool = True
    audio_rule: str | None = None  # the Whisper-style rule prep measured recordings with
    audio_mel: int = 128  # log-mel bins of the audio encoder (Qwen2-Audio's, Omni's: 128)

    @classmethod
    def from_generation(
        cls,
        generation,
        *,
        tokenizer: str | None = None,
        template: str | None = None,
        vision_policy: str | None = None,
        pixels: str = "normalized",
        check_costs: bool = True,
        audio_mel: int = 128,
    ) -> Collator:
        """The collator of what a generation (a :class:`~shards.Manifest` or its path) was
        measured with: the tokenizer, template and vision policy prep recorded. Each may be
        given (a copy elsewhere, a model directory); one that differs from the recorded
        setting is a :class:`~shards.read.prep_settings.SettingsMismatch` naming both. Its
        recordings are built with the audio rule prep recorded, where it measured any."""
        from shards.read.prep_settings import PrepSettings
        from shards.store.manifest import Manifest, open_generation

        m = generation if isinstance(generation, Manifest) else open_generation(generation)
        rec = PrepSettings.from_manifest(m)
        return cls(
            tokenizer=rec.resolve_tokenizer(tokenizer),
            template=rec.resolve_template(template)[0],
            vision_policy=rec.resolve_policy(vision_policy),
            pixels=pixels,
            check_costs=check_costs,
            audio_rule=rec.resolve_audio_rule(),
            audio_mel=audio_mel,
        )

    def _check_cost(self, meta: dict, llm: int, vit: int, heard: list[int] | None) -> None:
        """The sample's lengths against prep's: its LLM and ViT tokens, and with an audio rule
        each encoder sequence of its recordings (``heard``: their chunks or windows)."""
        cost = meta.get("cost")
        if not self.check_costs or not isinstance(cost, dict):
            return
        built = [(LLM_TOKENS, llm), (VIT_TOKENS, vit)]
        if heard is not None:  # the chunks' lengths: other chunks can sum to prep's positions
            built += [(AUDIO_TOKENS, sum(heard)), (AUDIO_SEQ_LENS, heard)]
        for name, have in built:
            counted = cost.get(name)
            if counted is None:
                continue
            if (list(counted) if isinstance(have, list) else int(counted)) != have:
                shown = (
                    f"{len(have)} audio sequences ({have[:4]}...) "
                    if isinstance(have, list)
                    else f"{have} {name} "
                )
                raise ValueError(
                    f"sample {meta.get('sample_id')!r}: this collator makes {shown}of it, prep "
                    f"counted {str(counted)[:40]}: its tokenizer, template ({self.template!r}), "
                    f"vision policy ({self.vision_policy!r}) or audio rule "
                    f"({self.audio_rule!r}) differ from prep's, so the plan balanced other "
                    "lengths than the model sees; build it with Collator.from_generation "
                    "(check_costs=False turns this check off)"
                )

    def __post_init__(self) -> None:
        check_flag("check_costs", self.check_costs)
        check_count("audio_mel", self.audio_mel, 1, MAX_MEL)
        if self.pixels not in ("normalized", "uint8"):
            raise ValueError(f"pixels must be 'normalized' or 'uint8', got {self.pixels!r}")
        from tokenizers import AddedToken, Tokenizer

        tok = Tokenizer.from_file(regular_file(self.tokenizer, "tokenizer.json"))
        # the audio marks only where recordings are built: elsewhere "<audio>" is text, as
        # prep counted it
        audio = (AUDIO_PLACEHOLDER, AUDIO_CONTEXT) if self.audio_rule is not None else ()
        tok.add_special_tokens(
            [
                AddedToken(t, special=True, normalized=False)
                for t in (IMAGE_PLACEHOLDER, IMAGE_CONTEXT, *audio)
            ]
        )
        object.__setattr__(self, "_tok", tok)
        object.__setattr__(self, "_tmpl", load_template(self.template))
        policy = parse_vision_policy(self.vision_policy)
        check_family(self._tmpl, self.template, self.vision_policy)
        # the exact classes: a subclass (Aya Vision's tiling) writes its own prompt text
        if type(policy) not in (FixedPolicy, InternVLPolicy, Qwen2VLPolicy):
            raise ValueError(
                f"vision policy {self.vision_policy!r} counts tokens for a Hugging Face model "
                "(train it with trainer_adapter.HFPacker); equishard's own VLM collates with "
                "fixed:S/P, internvl or qwen2vl: prep with one of those to use equishard train"
            )
        object.__setattr__(self, "_policy", policy)
        object.__setattr__(self, "image_token_id", tok.token_to_id(IMAGE_CONTEXT))
        object.__setattr__(self, "_placeholder_id", tok.token_to_id(IMAGE_PLACEHOLDER))
        features = None
        if self.audio_rule is not None:
            from dataprep.media_rules import parse_audio_rule

            features = AudioFeatures(rule=parse_audio_rule(self.audio_rule), mel=self.audio_mel)
        object.__setattr__(self, "_audio", features)
        object.__setattr__(self, "_audio_mark", tok.token_to_id(AUDIO_PLACEHOLDER))
        object.__setattr__(
            self, "audio_token_id", tok.token_to_id(AUDIO_CONTEXT) if features else None
        )

    @property
    def audio(self):
        """The recordings' features (:class:`~shards.read.audio_features.AudioFeatures`: the
        rule and the mel bins); None for a collator without an audio rule."""
        return self._audio

    @property
    def vocab_size(self) -> int:
        """Token ids this collator can emit (the tokenizer's, with the image tokens added)."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def _image_units(self, img: Image.Image) -> list[tuple[np.ndarray, tuple[int, int]]]:
        """Encoder sequences (patch vectors, patch grid) of one image under the policy."""
        pol, raw = self._policy, self.pixels == "uint8"
        w, h = img.size
        if isinstance(pol, FixedPolicy):
            return [_patches(img, (pol.image_size, pol.image_size), pol.patch_size, raw)]
        if isinstance(pol, InternVLPolicy):
            cols, rows = internvl_grid(w, h, pol.min_tiles, pol.max_tiles, pol.tile_size)
            s = pol.tile_size
            big = img.resize((cols * s, rows * s), Image.Resampling.BICUBIC)
            tiles = [
                big.crop((c * s, r * s, (c + 1) * s, (r + 1) * s))
                for r in range(rows)
                for c in range(cols)
            ]
            if pol.thumbnail and len(tiles) != 1:
                tiles.append(img)
            return [_patches(t, (s, s), pol.patch_size, raw) for t in tiles]
        assert isinstance(pol, Qwen2VLPolicy)
        hh, ww = pol.resized(w, h)
        return [_patches(img, (ww, hh), pol.patch_size, raw)]

    def _marks(self, sample, enc, costs) -> tuple[dict, list[np.ndarray]]:
        """Each placeholder token's (context token, tokens of each item in order), checked
        against the sample's items; and its recordings' features."""
        sid = sample.meta.get("sample_id")
        marks = {self._placeholder_id: (self.image_token_id, [c.llm_tokens for c in costs])}
        feats: list[np.ndarray] = []
        if self._audio is not None:
            from dataprep.media_rules.whisper_audio import audio_tokens

            feats = [self._audio(b) for b in getattr(sample, "audios", ())]
            marks[self._audio_mark] = (self.audio_token_id, [audio_tokens(len(f)) for f in feats])
        for (pid, (_, counts)), mark in zip(marks.items(), ("<image>", "<audio>"), strict=False):
            n_ph = enc.ids.count(pid)
            if n_ph != len(counts):
                what = "images" if mark == "<image>" else "recordings"
                raise ValueError(f"sample {sid!r}: {n_ph} {mark} tokens for {len(counts)} {what}")
        return marks, feats

    def __call__(self, samples: list) -> dict:
        ids: list[int] = []
        labels: list[int] = []
        positions: list[int] = []
        cu = [0]
        units: list[np.ndarray] = []
        vit_lens: list[int] = []
        llm_lens: list[int] = []
        units_hw: list[tuple[int, int]] = []
        num_units: list[int] = []
        audio: list[np.ndarray] = []
        num_audios: list[int] = []
        audio_frames: list[int] = []
        for s in samples:
            _refuse_media(s, self._audio is not None)
            text, spans = self._tmpl.render_spans([tuple(t) for t in s.meta["turns"]])
            enc = self._tok.encode(text, add_special_tokens=False)
            imgs = [decode_image(b) for b in s.images]
            costs = self._policy.sample_costs([im.size for im in imgs])
            marks, feats = self._marks(s, enc, costs)
            taken = dict.fromkeys(marks, 0)
            sample_ids: list[int] = []
            sample_labels: list[int] = []
            for tid, (a, b) in zip(enc.ids, enc.offsets, strict=True):
                if tid in marks:  # an image's or a recording's tokens, never a target
                    token, counts = marks[tid]
                    sample_ids += [token] * counts[taken[tid]]
                    sample_labels += [-100] * counts[taken[tid]]
                    taken[tid] += 1
                    continue
                # a token holding any of an assistant's text is learnt: one that also carries
                # the template's space or newline in front (" Mostly", "\nFour") included, or
                # the answer's first word would never be a target
                target = b > a and any(a < hi and b > lo for lo, hi in spans)
                sample_ids.append(tid)
                sample_labels.append(tid if target else -100)
            ids += sample_ids
            labels += sample_labels
            positions += range(len(sample_ids))
            cu.append(len(ids))
            llm_lens.append(len(sample_ids))
            n_vit = 0
            for im in imgs:
                for u, hw in self._image_units(im):
                    units.append(u)
                    units_hw.append(hw)
                    n_vit += u.shape[0]
            vit_lens.append(n_vit)
            num_units.append(len(units_hw) - sum(num_units))
            audio += feats
            num_audios.append(len(feats))
            audio_frames.append(sum(len(f) for f in feats))
            heard = None
            if self._audio is not None:  # the encoder's sequences, as prep priced them
                rule = self._audio.rule
                heard = [n for f in feats for n in rule.frame_cost(len(f)).seq_lens]
            self._check_cost(s.meta, len(sample_ids), n_vit, heard)
        patch_dim = 3 * self._policy.patch_size**2
        pcu = np.concatenate([[0], np.cumsum([u.shape[0] for u in units])]).astype(np.int32)
        out = {
            "input_ids": torch.tensor(ids, dtype=torch.long),
            "labels": torch.tensor(labels, dtype=torch.long),
            "position_ids": torch.tensor(positions, dtype=torch.long),
            "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
            "patches": torch.from_numpy(np.concatenate(units))
            if units
            else torch.zeros(0, patch_dim, dtype=torch.uint8 if self.pixels == "uint8" else None),
            "patch_cu_seqlens": torch.from_numpy(pcu),
            "llm_lens": torch.tensor(llm_lens, dtype=torch.long),
            "vit_lens": torch.tensor(vit_lens, dtype=torch.long),
            "units_hw": torch.tensor(units_hw, dtype=torch.long).reshape(-1, 2),
            "num_units": torch.tensor(num_units, dtype=torch.long),
            "image_token_id": self.image_token_id,
            "sample_ids": [s.meta["sample_id"] for s in samples],
        }
        if self._audio is not None:
            frames = [len(f) for f in audio]
            out["audio_features"] = torch.from_numpy(
                np.concatenate(audio) if audio else np.zeros((0, self.audio_mel), np.float32)
            )
            out["audio_lens"] = torch.tensor(frames, dtype=torch.long).reshape(-1, 1)
            out["num_audios"] = torch.tensor(num_audios, dtype=torch.long)
            out["audio_frames"] = torch.tensor(audio_frames, dtype=torch.long)
            out["audio_token_id"] = self.audio_token_id
        return out
