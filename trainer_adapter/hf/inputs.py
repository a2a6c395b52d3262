"""Turn equishard samples into a Hugging Face VLM's inputs: one packed row per rank.

:class:`HFPacker` renders each sample with the model's own chat template (the same
:class:`~dataprep.jinja_template.JinjaChatTemplate` prep counted with), preprocesses its images
with the model's own image processor, expands every image marker to the image tokens the
family's processor writes, tokenizes with the model's tokenizer, and packs the samples in one
row: ``input_ids``, ``labels`` (the assistant's text only: the template's ``generation`` spans
or the assistant turns), position ids restarting at 0 per sample (HF's packed convention) and
the images. Per family:

* Qwen2-VL, Qwen3-VL, GLM-4.1V, ERNIE 4.5-VL: ``grid_thw.prod() / merge^2`` tokens; patches +
  ``image_grid_thw``; ``[4, 1, L]`` positions, the text row first and each sample's 3-D
  positions from the model's ``get_rope_index``; ERNIE's ``moe_mm_token_type_ids`` (its
  processor's: image tokens and their start / end for the vision experts).
* InternVL: tiles x ``image_seq_length``; LLaVA: the patches of the processor's crop.
* LLaVA-NeXT (anyres for every image) and LLaVA-OneVision (anyres for a sample's only image, a
  tile each for several): their processors' counts; every image's tiles ``[tiles, C, H, W]``,
  none padded, with ``image_sizes`` (OneVision's ``batch_num_images`` per sample too).
* Gemma 3: ``image_seq_length`` soft tokens between its image start and end, and with
  pan-and-scan (``images_kwargs={"do_pan_and_scan": True}``) its processor's sentence and each
  crop's own block after them (``replace_image_token``); every image and crop ``[n, C, H, W]``;
  ``token_type_ids`` (1 on image tokens), which its mask makes bidirectional inside each image.
* Gemma 4: each image's soft tokens (its image processor's ``num_soft_tokens_per_image``)
  between ``<|image>`` and ``<image|>``; every image's patch rows padded to the budget
  ``[n, P, C*p*p]`` with ``image_position_ids [n, P, 2]``; ``mm_token_type_ids`` (its
  processor's: 1 on image tokens), which its vision layers' mask makes bidirectional.
* SmolVLM / Idefics3: its processor's ``replace_image_token``, each tile's tokens behind its
  row/column marker; ``[1, tiles, C, H, W]`` with each tile's ``pixel_attention_mask``.
* Mistral 3 / Pixtral: its processor's rows of ``[IMG]``, each closed by ``[IMG_BREAK]``, the
  last by ``[IMG_END]``; every image padded to the row's largest, ``[n, C, H, W]``, with
  ``image_sizes``.
* DeepSeek-VL and Janus: ``num_image_tokens`` ``<image_placeholder>`` per image (Janus's
  between ``<begin_of_image>`` and ``<end_of_image>``); every image ``[n, C, H, W]`` as its
  image processor pads it to a square; DeepSeek-VL's hybrid: each image's high-resolution copy
  ``high_res_pixel_values [n, C, H', W']`` beside it, for its SAM tower.
* Aya Vision: its processor's ``replace_image_token`` (``TILE_k`` before each grid tile's
  ``<|IMG_PATCH|>`` tokens, ``TILE_GLOBAL`` before the global tile's); every tile
  ``[tiles, C, H, W]``.
* Aria: each image's crops x the processor's ``size_conversion`` ``<|img|>`` tokens; every crop
  ``[crops, C, S, S]`` with its ``pixel_mask``. Each image is processed on its own: a call of
  several split images gives every image the most crops any image of the call has, more
  tokens than the model makes features when they differ.
* Granite Docling: its processor's ``replace_image_token`` (SmolVLM's markers, four times the
  tokens on the fine path); ``[1, tiles, C, H, W]`` with ``pixel_attention_mask [1, tiles]``
  and, on the fine path, one ``tile_fine_mask`` for the row.
* Idefics2: each image's crops (one, or its four quarters and itself) x ``image_seq_len``
  ``<image>`` tokens, each crop between fake tokens, as its processor joins and spaces them
  (:func:`~dataprep.policies.idefics2.idefics2_image_texts`); ``[1, crops, C, H, W]`` padded to
  the row's largest crop, with ``pixel_attention_mask``.
* Qwen2.5-Omni's thinker: Qwen2-VL's images as ``<|IMAGE|>`` tokens, each recording's
  ``<|AUDIO|>`` repeated once a token of its audio encoder; ``[4, 1, L]`` positions from the
  thinker's ``get_rope_index`` (with each recording's frames); ``input_features`` and
  ``feature_attention_mask`` (:mod:`~trainer_adapter.hf.audio_inputs`).
* Qwen2-Audio (no images): ``Audio k:`` and each recording's ``<|AUDIO|>`` repeated as for
  Qwen2.5-Omni; every recording's whole padded window, ``[n, mel, window]``, with
  ``feature_attention_mask``; positions ``[1, L]``.
* Audio Flamingo 3 (no images): each recording's ``<sound>`` repeated once a token of all its
  30-s windows' frames; every window whole, ``[windows, mel, window]``, with
  ``input_features_mask``.
* Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4.1V videos (a video rule): each video's patches and grid
  as its video processor makes them, ``pixel_values_videos`` and ``video_grid_thw``, its tokens
  (and Qwen3-VL's or GLM's timestamps) in the text (:mod:`~trainer_adapter.hf.video_inputs`);
  GLM-4.1V's pairs of frames among the images (its model takes both at every ``<|image|>``).
* Ovis2: its processor's ``replace_image_token`` (``<IMG_START>``, the thumbnail's atoms,
  ``<IMG_GRID>``, each grid tile's atoms between ``<IMG_COL>`` / ``<IMG_ROW>``, ``<IMG_END>``);
  every tile and thumbnail ``[tiles, C, H, W]``.

The images are processed with the settings the processor's own call passes its image processor:
the processor's defaults (its class's ``images_kwargs``: InternVL's and Aya Vision's
``crop_to_patches=True``, Aria's ``max_image_size=980`` and no splitting, Gemma 3's pan-and-scan
off) over the image processor's attributes, and ``HFPacker(images_kwargs=...)`` over both, as
keyword arguments of the call would be (``processor(..., do_pan_and_scan=True)``).

A rank without images gets ``pixel_values=None``:
:func:`~trainer_adapter.hf.balance.balance_model` makes it join the tower's exchange anyway.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from dataprep.chat_template import load_template
from dataprep.families.registry import FAMILIES as FAMILY_SPECS
from dataprep.families.registry import family_spec
from dataprep.families.spec import PackerRules
from dataprep.image_orientation import decode_image
from dataprep.policies.idefics2 import idefics2_image_texts
from dataprep.records import IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER
from equishard.common.values import check_flag
from trainer_adapter.hf.audio_inputs import audio_features, check_processor_audio, pack_audio
from trainer_adapter.hf.frame_videos import InternVLVideo, NextVideo, OneVisionVideo
from trainer_adapter.hf.images import images_settings, pack_images
from trainer_adapter.hf.media_text import expand_marks, image_mark, image_texts
from trainer_adapter.hf.packing import PACKING_KEYS, packing_kwargs
from trainer_adapter.hf.policy_check import check_processor_policy
from trainer_adapter.hf.sample_checks import (
    audio_families,
    check_cost,
    refuse_media,
    video_families,
)
from trainer_adapter.hf.tokenizer_check import check_processor_tokenizer
from trainer_adapter.hf.video_inputs import QwenVideo, pack_videos

__all__ = ["HFPacker"]

# the families and how each one's rows are built: one spec per family (dataprep.families)
FAMILIES = FAMILY_SPECS  # name -> FamilySpec, in the registry's order


@dataclass(kw_only=True)
class HFPacker:
    """``family``: qwen2vl (Qwen2-VL, Qwen2.5-VL) | qwen3vl (Qwen3-VL, Qwen3.5) | glm4v (GLM-4.1V,
    GLM-4.5V, GLM-4.6V) | internvl | llava | llava_next | llava_onevision | gemma3 | gemma4 | smolvlm
    (SmolVLM, Idefics3) | mistral3 (Mistral 3, Pixtral: ``PixtralProcessor``) | aya_vision
    (Aya Vision 8B / 32B: ``AyaVisionProcessor``) | ernie45vl (ERNIE 4.5-VL) | deepseek_vl
    (DeepSeek-VL 1.3B) | janus (Janus, Janus-Pro) | ovis2 (Ovis2: ``Ovis2Processor``) | aria
    (Aria: ``AriaProcessor``) | granite_docling (Granite Docling) | idefics2 (Idefics2:
    ``Idefics2Processor``) | deepseek_vl_hybrid (DeepSeek-VL 7B: ``DeepseekVLHybridProcessor``,
    its template named ``#images=deepseek_vl``) | qwen2_5_omni (Qwen2.5-Omni's thinker:
    ``Qwen2_5OmniProcessor``, images and recordings) | qwen2_audio (Qwen2-Audio:
    ``Qwen2AudioProcessor``, recordings only, whole padded windows) | audioflamingo3 (Audio
    Flamingo 3: ``AudioFlamingo3Processor``, recordings only, padded 30-s windows).
    ``processor``:
    the model's HF processor (its ``tokenizer`` and ``image_processor`` are used). ``template``:
    the chat template spec prep used (a model directory or template file). ``rope_index``: the
    Qwen / GLM / ERNIE model's ``model.model.get_rope_index`` (needed for their 3-D positions).
    ``packing_kwargs``: give the row HF's packing kwargs too (``cu_seq_lens_q/k``,
    ``max_length_q/k``, ``seq_idx``: what ``DataCollatorWithFlattening(return_flash_attn_kwargs=
    True, return_seq_idx=True)`` gives), for FlashAttention's varlen kernels and for decoders
    with recurrent layers (Qwen3.5's linear attention); an empty row gets none.
    ``check_costs``: check each sample against the costs prep measured (``meta["cost"]``, in
    every equishard generation): a sample whose row is not ``llm_tokens`` long raises a
    ``ValueError`` naming it, since then prep's vision policy, template or tokenizer differ
    from this processor and the plan balanced other lengths than the model sees. On by default
    for samples that carry costs (None); True also refuses samples without; False: off.
    :meth:`from_generation` takes the template and checks the policy from the generation.
    ``images_kwargs``: the image settings your processor call passes (``processor(...,
    do_pan_and_scan=True)`` -> ``{"do_pan_and_scan": True}``); they and the processor's own
    defaults go over the image processor's attributes, as in the processor's call.
    ``audio_rule``: the Whisper-style audio rule prep measured the recordings with
    (:meth:`from_generation` takes the generation's): a family that takes recordings loads each
    one and makes its features as its processor's feature extractor does, whose settings are
    checked against the rule (:mod:`~trainer_adapter.hf.audio_inputs`). ``video_rule``: the
    Qwen video rule prep measured the videos with (:meth:`from_generation` takes the
    generation's): the Qwen2-VL, Qwen2.5-VL and Qwen3-VL families sample, resize and patch each
    video's frames as their video processor does (:mod:`~trainer_adapter.hf.video_inputs`);
    ``pixel_values_videos`` and ``video_grid_thw`` go with the row. A sample with videos and no
    video rule, or with recordings and no audio rule, is refused (their marks would be packed
    as text)."""

    family: str
    processor: object
    template: str
    rope_index: Callable | None = None
    packing_kwargs: bool = False
    check_costs: bool | None = None
    images_kwargs: dict = field(default_factory=dict)
    audio_rule: str | None = None
    video_rule: str | None = None
    _template: object = field(init=False, repr=False)
    _audio: object = field(init=False, repr=False)
    _video: object = field(init=False, repr=False)
    _images_kw: dict = field(init=False, repr=False)
    _rules: PackerRules = field(init=False, repr=False)
    _takes_images: bool = field(init=False, repr=False)

    def __post_init__(self) -> None:
        check_flag("packing_kwargs", self.packing_kwargs)
        if self.check_costs is not None:  # None: where samples carry costs
            check_flag("check_costs (or None)", self.check_costs)
        if not isinstance(self.images_kwargs, dict):
            raise ValueError(f"images_kwargs must be a dict, got {self.images_kwargs!r}")
        spec = family_spec(self.family)
        self._rules = spec.packer
        self._takes_images = spec.image_tokens is not None  # an audio-only family's: none
        if self._rules.rope_positions and self.rope_index is None:
            raise ValueError(
                f"{self.family} needs rope_index=model.model.get_rope_index (3-D positions)"
            )
        # an audio-only family's processor has no image processor
        self._images_kw = (
            images_settings(self.processor, self.images_kwargs) if self._takes_images else {}
        )
        self._template = load_template(self.template)
        self._audio = None
        if self.audio_rule is not None:
            if not self._rules.audio:
                raise ValueError(
                    f"audio_rule {self.audio_rule!r}: the {self.family} family takes no "
                    f"recordings; families that do: {audio_families()}"
                )
            from dataprep.media_rules import WhisperWindowsRule, parse_audio_rule

            rule = parse_audio_rule(self.audio_rule)
            if isinstance(rule, WhisperWindowsRule) != (self._rules.audio == "windows"):
                raise ValueError(
                    f"audio_rule {self.audio_rule!r}: the {self.family} processor takes "
                    + ("several padded windows a recording (--audio-rule audioflamingo3)"
                       if self._rules.audio == "windows" else
                       "one window or unpadded chunks a recording, not several windows")
                )  # fmt: skip
            self._audio = audio_features(self.processor, rule, self.family)  # Whisper-style only
            check_processor_audio(self.processor, rule, self.family)
        self._video = None
        if self.video_rule is not None:
            from dataprep.media_rules import (
                InternVLVideoRule,
                LlavaNextVideoRule,
                OneVisionVideoRule,
                parse_video_rule,
            )

            rule = parse_video_rule(self.video_rule)
            name = rule.spec().partition(":")[0]
            if not self._rules.videos or name not in spec.video_rules:
                raise ValueError(
                    f"video_rule {self.video_rule!r}: HFPacker builds the {self.family} "
                    f"family's videos with {' or '.join(spec.video_rules) or 'no rule'}"
                    f"{'' if self._rules.videos else ' (none: it builds no videos)'}; "
                    f"families whose videos it builds: {video_families()}"
                )
            if self._rules.audio and rule.source != "transformers":  # Qwen2.5-Omni
                raise ValueError(
                    f"video_rule {self.video_rule!r}: Qwen2.5-Omni's processor samples and "
                    "times a video with its own video processor: measure its videos with "
                    "source=transformers"
                )
            if isinstance(rule, OneVisionVideoRule):  # each frame a tile of its tower
                self._video = OneVisionVideo.of(self.processor, rule, self.family)
            elif isinstance(rule, LlavaNextVideoRule):
                self._video = NextVideo.of(self.processor, rule, self.family)
            elif isinstance(rule, InternVLVideoRule):  # its frames among the images' tiles
                self._video = InternVLVideo.of(self.processor, rule, self.family)
            else:
                self._video = QwenVideo.of(self.processor, rule, self.family)

    def _setting(self, name: str):
        """An image setting as the image processor runs it: the call's, else its own."""
        ip = getattr(self.processor, "image_processor", None)  # none: an audio-only family
        return self._images_kw.get(name, getattr(ip, name, None))

    @property
    def fine_route(self) -> bool:
        """Granite Docling: its image processor sends the pages on the fine connector path."""
        return bool(self._setting("fine_route"))

    def sample(
        self,
        turns: list,
        image_bytes: list[bytes],
        audio_bytes: list[bytes] = (),
        video_bytes: list[bytes] = (),
        *,
        sample_id: str = "?",
    ) -> dict:
        """One sample's ``input_ids``, ``labels``, ``positions``, processed images, recordings'
        frames (``audio_frames``) and videos (``videos``: each one's patches and grid);
        ``sample_id`` names it in errors."""
        images = [decode_image(b) for b in image_bytes]  # EXIF orientation applied, as prep counts
        videos = [self._video(b, f"sample {sample_id!r} video {k}")
                  for k, b in enumerate(video_bytes)] if (
            self._video is not None) else []  # fmt: skip
        recording_frames = None  # each recording's frames, where not one window's
        if self._audio is None:
            feats, lens = [], []
        elif self._rules.audio == "window":  # the whole window, as the processor pads it
            pairs = [self._audio.window(b) for b in audio_bytes]
            feats, lens = [f for f, _ in pairs], [n for _, n in pairs]
        elif self._rules.audio == "windows":  # each recording's windows, each padded
            cut = [self._audio.windows(b) for b in audio_bytes]
            feats, lens = [f for w in cut for f, _ in w], [n for w in cut for _, n in w]
            recording_frames = [sum(n for _, n in w) for w in cut]
        else:
            feats = [self._audio(b) for b in audio_bytes]
            lens = [len(f) for f in feats]
        # LLaVA-OneVision: nested, so that a sample's several images are one multi-image sample
        given = [images] if self._rules.nested else images
        kw = dict(self._images_kw)
        if self.family == "smolvlm":
            kw["return_row_col_info"] = True
        if self._rules.one_image_per_call and images:
            # one image at a time: LLaVA-NeXT's processor pads a call's images to the most
            # tiles, Aria's counts every image as the call's most crops
            each = [
                self.processor.image_processor(images=[im], return_tensors="pt", **kw)
                for im in images
            ]
            nested = self.family == "llava_next"  # [1, tiles, C, H, W] per call
            processed = {
                k: torch.cat([e[k][0] if nested and k == "pixel_values" else e[k] for e in each])
                for k in self._rules.one_image_per_call
            }
            if self.family == "aria":
                processed["num_crops"] = [len(e["pixel_values"]) for e in each]
        elif images:
            if self.family == "mistral3":  # resized to multiples of the merged patch
                step = self.processor.patch_size * self.processor.spatial_merge_size
                kw["patch_size"] = {"height": step, "width": step}
            processed = dict(
                self.processor.image_processor(images=given, return_tensors="pt", **kw)
            )
        else:
            processed = {}
        # the token repeated per image (Gemma 3's processor names its image start token so)
        tokenizer = self.processor.tokenizer
        token = (
            tokenizer.image_token
            if self.family == "gemma3"
            else getattr(self.processor, "image_token", None)  # None: an audio-only family's
        )
        texts = image_texts(self, images, processed, token)
        if self.family == "llava_onevision" and images:
            # [images, tiles, C, H, W] -> every tile in order: one image is cut anyres, several
            # are a tile each, so no padding is dropped; the model takes the 4-D form as is
            pix = processed["pixel_values"]
            assert pix.shape[0] == 1 or pix.shape[1] == 1, pix.shape
            processed["pixel_values"] = pix.reshape(-1, *pix.shape[2:])
        text, spans = self._template.render_spans([tuple(t) for t in turns])
        if self.family == "idefics2":  # joined with a neighbouring image, spaced from text
            texts = idefics2_image_texts(text.split(IMAGE_PLACEHOLDER), texts)
        mark = image_mark(self, text, len(texts))
        video_texts = [self._video.text(v) for v in videos]
        frames = lens if recording_frames is None else recording_frames
        expanded, marks = expand_marks(self, text, mark, texts, frames, video_texts)

        def moved(x: int) -> int:
            return x + sum(d for p, d in marks if p < x)

        out_spans = [(moved(a), moved(b)) for a, b in spans]
        enc = tokenizer(expanded, add_special_tokens=False, return_offsets_mapping=True)
        ids = torch.tensor(enc["input_ids"], dtype=torch.long)
        offsets = np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2)
        target = np.zeros(len(ids), dtype=bool)
        for a, b in out_spans:
            # a token that overlaps the trained text is a target (its first token may carry
            # the space or newline of the template in front of it)
            target |= (offsets[:, 1] > a) & (offsets[:, 0] < b) & (offsets[:, 1] > offsets[:, 0])
        labels = torch.where(torch.from_numpy(target), ids, torch.full_like(ids, -100))
        if len(labels):
            labels[0] = -100  # never predict a sample's first token from the previous sample
        text_pos = torch.arange(len(ids))[None]
        image_id = tokenizer.convert_tokens_to_ids(token) if token is not None else None
        extra = {}
        if self.family == "gemma3":
            extra["token_type_ids"] = (ids == image_id).long()
        if self.family == "gemma4":  # its processor's modality of each token (1: image)
            types = self.processor.create_mm_token_type_ids([enc["input_ids"]])[0]
            extra["mm_token_type_ids"] = torch.tensor(types, dtype=torch.long)
        if self.family == "ernie45vl":  # image tokens and their start / end go to vision experts
            types = self.processor.create_moe_mm_token_type_ids(enc["input_ids"])
            extra["moe_mm_token_type_ids"] = torch.tensor(types, dtype=torch.long)
        if self._rules.audio and self._rules.rope_positions:  # Qwen2.5-Omni's thinker: each
            # recording's frames in its positions
            grid = processed.get("image_grid_thw")
            seqlens = torch.tensor(lens) if lens else None
            ones = torch.ones_like(ids)[None]
            kw = {}
            if videos:  # its processor times a video by the fps its call asks (2 by default)
                rule = self._video.rule
                kw["video_grid_thw"] = pack_videos([{"videos": videos}])["video_grid_thw"]
                seconds = rule.temporal_patch_size / (rule.fps or 2.0)
                kw["second_per_grids"] = torch.tensor([seconds] * len(videos))
            rope, _ = self.rope_index(ids[None], image_grid_thw=grid, attention_mask=ones,
                                      audio_seqlens=seqlens, **kw)  # fmt: skip
            positions = torch.cat([text_pos[None], rope], dim=0)
        elif self._rules.rope_positions:
            grid = processed.get("image_grid_thw")
            if self.family == "glm4v":  # its image tokens inside a video's start / end: type 2
                made = self.processor.create_mm_token_type_ids
                types = torch.tensor(made([enc["input_ids"]])[0], dtype=torch.int)
            else:
                types = (ids == image_id).int()
            kw = {}
            if videos:  # videos' tokens are type 2; Qwen2.5-VL's time per temporal patch
                kw = {"video_grid_thw": pack_videos([{"videos": videos}])["video_grid_thw"]}
                if self.family != "glm4v":
                    types[ids == tokenizer.convert_tokens_to_ids(self.processor.video_token)] = 2
                    kw["second_per_grid_ts"] = torch.tensor([v["seconds_per_grid"] for v in videos])
            rope, _ = self.rope_index(ids[None], types[None], image_grid_thw=grid, **kw)
            positions = torch.cat([text_pos[None], rope], dim=0)
        else:
            positions = text_pos
        if videos and self._rules.videos_with_images:  # GLM's pairs, InternVL's frames
            found = re.findall(f"{re.escape(mark)}|{re.escape(VIDEO_PLACEHOLDER)}", text)
            processed = self._video.among_images(processed, videos, [m != mark for m in found])
        processed.pop("num_crops", None)  # Gemma 3's (0 without pan-and-scan), Aria's: in text
        processed.pop("num_soft_tokens_per_image", None)  # Gemma 4's, in its text
        processed.pop("num_patches", None)  # Aya Vision's tiles per image, in its text
        processed.pop("grids", None)  # Ovis2's tile grids, in its text
        processed.pop("rows", None), processed.pop("cols", None)  # SmolVLM's, in its text
        processed.pop("tile_fine_mask", None)  # Granite Docling's: one for the row
        if feats:
            extra["audio_frames"], extra["audio_lens"] = feats, lens
        if videos:
            extra["videos"] = videos
        return {"input_ids": ids, "labels": labels, "positions": positions, **extra, **processed}

    @classmethod
    def from_generation(
        cls,
        generation,
        processor,
        *,
        family: str,
        template: str | None = None,
        tokenizer: str | None = None,
        **kwargs,
    ) -> HFPacker:
        """The packer for a generation (a :class:`~shards.Manifest` or its path): the chat
        template prep measured with (``template`` may name the same one elsewhere), refused at
        construction, naming both, when the generation's vision policy is not this family's or
        a setting it models differs from the processor's (:mod:`~trainer_adapter.hf.policy_check`:
        pixel bounds, tiles, tokens a tile, ...), or when the processor's tokenizer is not the
        one prep counted with (:mod:`~trainer_adapter.hf.tokenizer_check`; ``tokenizer`` names
        prep's file or model directory where the recorded path is not at hand); every sample's
        row is checked against prep's costs (``check_costs=False`` turns that off)."""
        from dataprep.media_rules import parse_audio_rule, parse_video_rule
        from shards.read.prep_settings import PrepSettings, SettingsMismatch
        from shards.store.manifest import Manifest, open_generation

        m = generation if isinstance(generation, Manifest) else open_generation(generation)
        rec = PrepSettings.from_manifest(m)
        kwargs.setdefault("check_costs", True)
        # each medium's recorded rule (checked where it enters; None: none measured) is taken;
        # a differing rule given is refused, the same one by another name accepted
        for what, parse, items in (("audio", parse_audio_rule, "recordings"),
                                   ("video", parse_video_rule, "videos")):  # fmt: skip
            recorded, given = rec.resolve_rule(what), kwargs.get(f"{what}_rule")
            if given is not None and (recorded is None or parse(given) != parse(recorded)):
                raise SettingsMismatch(
                    f"{what}_rule {given!r} given, but the generation's {items} were measured "
                    f"with {recorded!r}: leave {what}_rule out (the generation's is taken)"
                )
            kwargs[f"{what}_rule"] = recorded
        packer = cls(
            family=family, processor=processor, template=rec.resolve_template(template)[0], **kwargs
        )
        rec.resolve_policy()  # the recorded fields are its spec's
        if family_spec(family).policies:  # an audio-only family counts no images
            check_processor_policy(packer, rec.vision_policy)
        check_processor_tokenizer(processor, rec, tokenizer)
        return packer

    def __call__(self, samples: list) -> dict:
        """Samples with ``.meta["turns"]``, ``.images`` and ``.audios`` (encoded bytes) -> the
        packed row."""
        for s in samples:
            refuse_media(self, s)
        parts = [
            self.sample(
                s.meta["turns"],
                list(s.images),
                list(getattr(s, "audios", ())),
                list(getattr(s, "videos", ())),
                sample_id=s.meta.get("sample_id", "?"),
            )
            for s in samples
        ]
        if self.check_costs is not False:
            for s, p in zip(samples, parts, strict=True):
                check_cost(self, s.meta, len(p["input_ids"]))
        qwen = self._rules.rope_positions
        cat = lambda key, dim: torch.cat([p[key] for p in parts], dim=dim)  # noqa: E731
        empty_pos = torch.zeros((4, 1, 0) if qwen else (1, 0), dtype=torch.long)
        batch = {
            "input_ids": cat("input_ids", 0)[None]
            if parts
            else torch.zeros(1, 0, dtype=torch.long),
            "labels": cat("labels", 0)[None] if parts else torch.zeros(1, 0, dtype=torch.long),
            "position_ids": cat("positions", -1) if parts else empty_pos,
        }
        key = self._rules.per_token
        if key is not None:
            batch[key] = cat(key, 0)[None] if parts else torch.zeros_like(batch["input_ids"])
        batch |= pack_images(self.family, self._rules, parts, fine_route=self.fine_route)
        batch |= pack_audio(parts, self._rules.audio_mask)
        if not self._rules.videos_with_images:  # else among the images (pairs_among_images)
            batch |= pack_videos(parts)
        if self.packing_kwargs and parts:
            lengths = np.array([len(p["input_ids"]) for p in parts], dtype=np.int64)
            spec = {k: "int" if k.startswith("max") else "torch.int32" for k in PACKING_KEYS}
            batch = packing_kwargs(batch, spec, lengths, batch["input_ids"].device)
        return batch
