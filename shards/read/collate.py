"""Collation of a group into model-ready tensors (packed, variable-length).

For every sample: the conversation is rendered with the chat template and tokenized with the
real tokenizer; each ``<image>`` becomes as many image-context tokens as the vision policy gives
that image; labels are the token ids inside assistant turns and -100 elsewhere. Images are decoded
with Pillow and cut per the policy into patch vectors (:mod:`shards.read.image_units`; with
``pixels="uint8"`` the raw pixel bytes, normalized on the device by :func:`normalize_patches`).
The group is packed: ``cu_seqlens`` delimit samples in ``input_ids``; ``patch_cu_seqlens``
delimit the encoder sequences (one per image or tile) in ``patches``, in the order their
tokens stand. ``llm_lens`` and ``vit_lens`` are the per-sample lengths the runtime balancer
needs; they equal the cost table's ``llm_tokens`` and ``vit_tokens`` (plus ``video_tokens``)
when the same tokenizer, template, policy and rules are used. ``units_hw`` gives each encoder
sequence's patch grid (rows, columns) and ``num_units`` how many belong to each sample, so a
model can merge neighbouring patches (pixel shuffle) and the trainer can move samples.

A collator of a generation whose videos or recordings prep measured builds them as well:

* videos (``video_rule``, InternVL's: :class:`~shards.read.video_frames.VideoFrames`): the
  rule's frames, each tiled as an image and run by the same encoder; the rule's frame labels
  (``Frame1: <img></img>``...) in front of the ``<video>`` mark, as prep counted them, and the
  frames' tokens in its place;
* recordings (``audio_rule``, a Whisper-style encoder's:
  :class:`~shards.read.audio_features.AudioFeatures`): each recording's log-mel frames side by
  side in ``audio_features`` (``[frames, mel]``), ``audio_lens`` (each one's frames, ``[n,
  1]``), ``audio_frames`` and ``num_audios`` per sample, and each ``<audio>`` becomes as many
  audio tokens (``audio_token_id``) as the encoder gives the LLM.

Without a rule, a sample with videos or recordings is refused: it would be counted as text.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dataprep.chat_template import load_template
from dataprep.image_orientation import decode_image
from dataprep.policies import FixedPolicy, InternVLPolicy, Qwen2VLPolicy, parse_vision_policy
from dataprep.records import AUDIO_PLACEHOLDER, IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER
from dataprep.setting_checks import check_family
from equishard.common.local_files import regular_file
from equishard.common.values import check_count, check_flag
from equishard.contracts.columns import (
    AUDIO_SEQ_LENS,
    AUDIO_TOKENS,
    LLM_TOKENS,
    VIDEO_SEQ_LENS,
    VIDEO_TOKENS,
    VIT_TOKENS,
)
from shards.read.audio_features import MAX_MEL, AudioFeatures
from shards.read.image_units import image_units, normalize_patches

__all__ = ["AUDIO_CONTEXT", "IMAGE_CONTEXT", "Collator", "normalize_patches"]

IMAGE_CONTEXT = "<IMG_CONTEXT>"
AUDIO_CONTEXT = "<AUDIO_CONTEXT>"


def _refuse_media(sample, audio: bool, video: bool) -> None:
    """A sample with videos or recordings this collator has no rule for: it would count the
    ``<video>``/``<audio>`` mark as text and drop the media (a sample counted as something else
    than it is); refused, naming what to use."""
    media = [
        f"{len(v)} {what}"
        for what, v, ruled in (
            ("video(s)", getattr(sample, "videos", ()), video),  # a sample object of the
            ("recording(s)", getattr(sample, "audios", ()), audio),  # caller's may not
        )  # carry media
        if v and not ruled
    ]
    if media:
        raise ValueError(
            f"sample {sample.meta.get('sample_id')!r} has {' and '.join(media)}: equishard's own "
            "collator (equishard train) builds images, text, and the videos and recordings of "
            "the rules prep measured (InternVL's video rule, Whisper-style audio rules), and "
            "would count these as text; train such a generation with a Hugging Face model "
            "(trainer_adapter.HFPacker, balance_model), or prep without them"
        )


def _with_labels(text: str, spans: list, marks: list[tuple[str, str]]) -> tuple[str, list]:
    """``text`` with each ``(mark, label)``'s label put in front of the next ``mark`` in order
    (a video's frame labels before its ``<video>``, as prep counted them), the assistant
    ``spans`` moved with the text behind each insertion."""
    out, at, cuts = [], 0, []
    for mark, label in marks:
        k = text.index(mark, at)
        out += [text[at:k], label, mark]
        cuts.append((k, len(label)))
        at = k + len(mark)
    out.append(text[at:])
    moved = [
        (lo + sum(n for k, n in cuts if k <= lo), hi + sum(n for k, n in cuts if k < hi))
        for lo, hi in spans
    ]
    return "".join(out), moved


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
    video_rule: str | None = None  # the rule prep measured videos with (InternVL's)

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
        videos and recordings are built with the rules prep recorded, where it measured any."""
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
            audio_rule=rec.resolve_rule("audio"),
            audio_mel=audio_mel,
            video_rule=rec.resolve_rule("video"),
        )

    def _check_cost(self, meta: dict, built: list) -> None:
        """The sample's lengths (``built``: (column, count or list of sequence lengths))
        against prep's: LLM and ViT tokens, and each encoder sequence of its videos and
        recordings (other chunks can sum to prep's positions)."""
        cost = meta.get("cost")
        if not self.check_costs or not isinstance(cost, dict):
            return
        for name, have in built:
            counted = cost.get(name)
            if counted is None:
                continue
            if (list(counted) if isinstance(have, list) else int(counted)) != have:
                shown = (
                    f"{len(have)} {name} ({have[:4]}...) "
                    if isinstance(have, list)
                    else f"{have} {name} "
                )
                raise ValueError(
                    f"sample {meta.get('sample_id')!r}: this collator makes {shown}of it, prep "
                    f"counted {str(counted)[:40]}: its tokenizer, template ({self.template!r}), "
                    f"vision policy ({self.vision_policy!r}) or media rules differ from "
                    "prep's, so the plan balanced other lengths than the model sees; build it "
                    "with Collator.from_generation (check_costs=False turns this check off)"
                )

    def __post_init__(self) -> None:
        check_flag("check_costs", self.check_costs)
        check_count("audio_mel", self.audio_mel, 1, MAX_MEL)
        if self.pixels not in ("normalized", "uint8"):
            raise ValueError(f"pixels must be 'normalized' or 'uint8', got {self.pixels!r}")
        from tokenizers import AddedToken, Tokenizer

        tok = Tokenizer.from_file(regular_file(self.tokenizer, "tokenizer.json"))
        # a medium's marks only where it is built: elsewhere "<audio>" is text, as prep
        # counted it
        audio = (AUDIO_PLACEHOLDER, AUDIO_CONTEXT) if self.audio_rule is not None else ()
        video = (VIDEO_PLACEHOLDER,) if self.video_rule is not None else ()
        tok.add_special_tokens(
            [
                AddedToken(t, special=True, normalized=False)
                for t in (IMAGE_PLACEHOLDER, IMAGE_CONTEXT, *audio, *video)
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
        features = frames = None
        if self.audio_rule is not None:
            from dataprep.media_rules import WhisperWindowsRule, parse_audio_rule

            rule = parse_audio_rule(self.audio_rule)
            if isinstance(rule, WhisperWindowsRule):
                raise ValueError(
                    f"audio rule {rule.spec()!r} cuts a recording into several padded windows "
                    "(Audio Flamingo 3's): equishard train's audio encoder takes one window or "
                    "unpadded chunks a recording; train this generation with its model "
                    "(trainer_adapter.HFPacker, family audioflamingo3)"
                )
            features = AudioFeatures(rule=rule, mel=self.audio_mel)
        if self.video_rule is not None:
            from dataprep.media_rules import parse_video_rule
            from shards.read.video_frames import VideoFrames

            frames = VideoFrames(rule=parse_video_rule(self.video_rule), policy=policy)
        object.__setattr__(self, "_audio", features)
        object.__setattr__(self, "_video", frames)
        object.__setattr__(
            self, "audio_token_id", tok.token_to_id(AUDIO_CONTEXT) if features else None
        )
        object.__setattr__(
            self,
            "_mark_ids",
            {m: tok.token_to_id(m) for m in (IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER,
                                             AUDIO_PLACEHOLDER)},
        )  # fmt: skip

    @property
    def audio(self):
        """The recordings' features (:class:`~shards.read.audio_features.AudioFeatures`: the
        rule and the mel bins); None for a collator without an audio rule."""
        return self._audio

    @property
    def vocab_size(self) -> int:
        """Token ids this collator can emit (the tokenizer's, with the media tokens added)."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def _sample(self, s) -> dict:
        """One sample's ids, labels, encoder units in the order their tokens stand, its
        recordings' features and the lengths to check against prep's."""
        sid = s.meta.get("sample_id")
        _refuse_media(s, self._audio is not None, self._video is not None)
        text, spans = self._tmpl.render_spans([tuple(t) for t in s.meta["turns"]])
        raw = self.pixels == "uint8"
        imgs = [decode_image(b) for b in s.images]
        # each mark's items in order: (token, its count, its encoder units; none for audio)
        items = {
            IMAGE_PLACEHOLDER: [
                (self.image_token_id, c.llm_tokens, image_units(self._policy, im, raw))
                for im, c in zip(imgs, self._policy.sample_costs([im.size for im in imgs]),
                                 strict=True)
            ]
        }  # fmt: skip
        built: list = []  # each medium's (column, count or sequence lengths) to check
        n_video = 0
        if self._video is not None:
            videos = [self._video(b, f"sample {sid!r} video {k}") for k, b in enumerate(s.videos)]
            text, spans = _with_labels(
                text, spans, [(VIDEO_PLACEHOLDER, c.text) for _, c in videos]
            )
            tiles = self._video.tiles
            units = [
                [u for f in frames for u in image_units(tiles, f, raw)] for frames, _ in videos
            ]
            items[VIDEO_PLACEHOLDER] = [
                (self.image_token_id, c.llm_tokens, us)
                for us, (_, c) in zip(units, videos, strict=True)
            ]
            seen = [u.shape[0] for us in units for u, _ in us]
            n_video = sum(seen)
            built += [(VIDEO_TOKENS, n_video), (VIDEO_SEQ_LENS, seen)]
        feats: list[np.ndarray] = []
        if self._audio is not None:
            from dataprep.media_rules.whisper_audio import audio_tokens

            feats = [self._audio(b) for b in getattr(s, "audios", ())]
            items[AUDIO_PLACEHOLDER] = [(self.audio_token_id, audio_tokens(len(f)), [])
                                        for f in feats]  # fmt: skip
            rule = self._audio.rule
            heard = [n for f in feats for n in rule.frame_cost(len(f)).seq_lens]
            built += [(AUDIO_TOKENS, sum(heard)), (AUDIO_SEQ_LENS, heard)]
        enc = self._tok.encode(text, add_special_tokens=False)
        by_id = {self._mark_ids[m]: (m, list(v)) for m, v in items.items()}
        for pid, (mark, todo) in by_id.items():
            if enc.ids.count(pid) != len(todo):
                what = {"<image>": "images", "<video>": "videos", "<audio>": "recordings"}[mark]
                raise ValueError(
                    f"sample {sid!r}: {enc.ids.count(pid)} {mark} tokens for {len(todo)} {what}"
                )
        ids: list[int] = []
        labels: list[int] = []
        units: list[tuple[np.ndarray, tuple[int, int]]] = []
        for tid, (a, b) in zip(enc.ids, enc.offsets, strict=True):
            if tid in by_id:  # an item's tokens, never a target; its units in this order
                token, n, its_units = by_id[tid][1].pop(0)
                ids += [token] * n
                labels += [-100] * n
                units += its_units
                continue
            # a token holding any of an assistant's text is learnt: one that also carries
            # the template's space or newline in front (" Mostly", "\nFour") included, or
            # the answer's first word would never be a target
            target = b > a and any(a < hi and b > lo for lo, hi in spans)
            ids.append(tid)
            labels.append(tid if target else -100)
        n_vit = sum(u.shape[0] for u, _ in units)  # images' and frames' rows: one encoder
        built = [(LLM_TOKENS, len(ids)), (VIT_TOKENS, n_vit - n_video), *built]
        return {"ids": ids, "labels": labels, "units": units, "feats": feats, "built": built}

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
            one = self._sample(s)
            ids += one["ids"]
            labels += one["labels"]
            positions += range(len(one["ids"]))
            cu.append(len(ids))
            llm_lens.append(len(one["ids"]))
            units += [u for u, _ in one["units"]]
            units_hw += [hw for _, hw in one["units"]]
            vit_lens.append(sum(u.shape[0] for u, _ in one["units"]))
            num_units.append(len(one["units"]))
            audio += one["feats"]
            num_audios.append(len(one["feats"]))
            audio_frames.append(sum(len(f) for f in one["feats"]))
            self._check_cost(s.meta, one["built"])
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
