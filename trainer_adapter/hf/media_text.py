"""What each medium's mark becomes in a Hugging Face VLM's prompt, for
:class:`~trainer_adapter.hf.inputs.HFPacker`: each image's text as the family's processor writes
it (:func:`image_texts`), the mark an image's text replaces (:func:`image_mark`), and the
rendered text with every image, recording and video mark replaced in the order they stand,
with the offsets by which the trained spans move (:func:`expand_marks`).
"""

from __future__ import annotations

import re

from dataprep.policies.idefics2 import idefics2_expansion
from dataprep.records import AUDIO_PLACEHOLDER, IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER
from trainer_adapter.hf.video_inputs import END, START

__all__ = ["expand_marks", "image_mark", "image_texts"]


def image_texts(packer, images: list, processed: dict, token: str) -> list[str]:
    """What each image's placeholder becomes, as the family's processor writes it: its
    image tokens (``token`` repeated), SmolVLM's with its tile markers around them."""
    if not images:
        return []
    if packer._rules.rope_positions:
        merge = packer.processor.image_processor.merge_size**2
        return [token * (int(g.prod()) // merge) for g in processed["image_grid_thw"]]
    if packer.family == "idefics2":  # fake tokens around each crop's, joined in between
        crops = 5 if packer._setting("do_image_splitting") else 1
        crop = token * packer.processor.image_seq_len
        return [idefics2_expansion(crop, crops)] * len(images)
    if packer._rules.spelled:  # the processor writes each image's (its tiles, crops)
        return [
            packer.processor.replace_image_token(processed, image_idx=i) for i in range(len(images))
        ]
    if packer.family == "gemma4":  # its image processor counted each image's soft tokens
        return [token * int(n) for n in processed["num_soft_tokens_per_image"]]
    if packer._rules.fixed_tokens:  # a fixed count (Janus's start / end: the template's)
        return [token * packer.processor.num_image_tokens] * len(images)
    if packer.family == "aria":  # each image's own crops, a fixed count each
        per_crop = packer.processor.size_conversion[int(processed["pixel_values"].shape[-1])]
        return [token * (int(n) * per_crop) for n in processed["num_crops"]]
    if packer.family == "internvl":  # the template's <img></img> are already in the text
        return [
            token * (packer.processor.image_seq_length * int(n)) for n in processed["num_patches"]
        ]
    sizes = [(im.height, im.width) for im in images]
    mm = packer.processor._get_num_multimodal_tokens(image_sizes=sizes, **packer._images_kw)
    return [token * n for n in mm["num_image_tokens"]]


def image_mark(packer, text: str, n_images: int) -> str:
    """What each image's text replaces in the rendered text: its placeholder, or for Gemma 3
    the placeholder with the template's image start and end around it (its processor
    writes the whole block, pan-and-scan's sentence before it)."""
    if packer.family != "gemma3" or not n_images:
        return IMAGE_PLACEHOLDER
    soft = packer.processor.tokenizer.image_token * packer.processor.image_seq_length
    mark = packer.processor.full_image_sequence.replace(soft, IMAGE_PLACEHOLDER)
    if text.count(mark) != n_images:
        raise ValueError(
            f"gemma3: the template wrote {text.count(mark)} of {n_images} image(s) as "
            f"{mark!r}, the block Gemma3Processor replaces; give HFPacker Gemma 3's own "
            "chat template (its <start_of_image> marker)"
        )
    return mark


def expand_marks(
    packer, text: str, mark: str, texts: list[str], lens: list, video_texts: list[str] = ()
) -> tuple[str, list]:
    """``text`` with each image's ``mark`` replaced by its text, each ``<audio>`` by its
    recording's audio tokens and each video's mark (Qwen3-VL's with the template's vision
    start and end around it) by its text, in the order they stand; and each replacement's
    ``(position in text, length added)``, by which the trained spans move."""
    from dataprep.media_rules.whisper_audio import audio_tokens

    marks_of = {mark: iter(texts)}
    if packer._video is not None:
        vmark = VIDEO_PLACEHOLDER
        if packer._video.rule.collapses:  # Qwen3-VL: its text has its own start and end
            vmark = START + VIDEO_PLACEHOLDER + END
        found = text.count(vmark)
        if found != len(video_texts):
            raise ValueError(
                f"the {packer.family} template wrote {found} video mark(s) {vmark!r} for "
                f"{len(video_texts)} video(s)"
            )
        marks_of[vmark] = iter(video_texts)
    if packer._audio is not None:
        found = text.count(AUDIO_PLACEHOLDER)
        if found != len(lens):
            raise ValueError(
                f"the {packer.family} template wrote {found} recording mark(s) for "
                f"{len(lens)} recording(s)"
            )
        token = packer.processor.audio_token
        marks_of[AUDIO_PLACEHOLDER] = iter(token * audio_tokens(n) for n in lens)
    split = re.split("(" + "|".join(re.escape(m) for m in marks_of) + ")", text)
    pieces, marks, at = [], [], 0  # marks: (placeholder position in text, length added)
    for k, piece in enumerate(split):
        new = next(marks_of[piece], None) if k % 2 else None  # odd: a mark
        pieces.append(piece if new is None else new)  # a mark past its items stays text
        if new is not None:
            marks.append((at, len(new) - len(piece)))
        at += len(piece)
    return "".join(pieces), marks
