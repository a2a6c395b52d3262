"""The sample type and cooker of equishard generations under Megatron-Energon (imports energon:
use it through :func:`shards.write.energon.equishard_cooker`)."""

from __future__ import annotations

import re

from megatron.energon import Sample, basic_sample_keys, stateless
from megatron.energon.edataclass import edataclass
from PIL import Image, ImageOps

from shards.format.sample_doc import SampleDocError, media_names, parse_sample_doc

__all__ = ["EquishardSample", "cook_equishard"]

_IMAGE_PART = re.compile(r"^(\d+)\.[A-Za-z0-9]+$")


@edataclass
class EquishardSample(Sample):
    """One sample: its JSON record (``sample_id``, ``turns``, the cost row) and its images in
    order, as Energon's decoder gave them (``image_decode`` of the dataset call). PIL images
    (``image_decode="pil"`` / ``"pilrgb"``) come with their EXIF orientation applied, as prep
    counted them; tensors (Energon's default ``"torchrgb"``) are decoded without it, so for
    photos that carry one decode with ``"pil*"``, or keep bytes (``decoder=None``) for
    :class:`shards.Collator` (:mod:`dataprep.image_orientation`)."""

    record: dict
    images: list
    videos: list  # the videos' members as the decoder gave them (bytes with decoder=None)
    audios: list  # and the recordings'

    @property
    def meta(self) -> dict:
        """The record, under the name :class:`shards.Collator` reads (with ``decoder=None``
        the images stay bytes, as the collator wants them)."""
        return self.record


@stateless
def cook_equishard(raw: dict) -> EquishardSample:
    images = sorted(
        (int(m.group(1)), value) for part, value in raw.items() if (m := _IMAGE_PART.match(part))
    )
    for _, value in images:
        if isinstance(value, Image.Image):
            ImageOps.exif_transpose(value, in_place=True)
    where = f"{raw.get('__url__', '?')}: sample {raw.get('__key__')!r}"
    record = parse_sample_doc(raw["json"], where)  # bytes, or what energon's decoder made
    parts = sorted(part for part in raw if _IMAGE_PART.match(part))
    media = media_names(record)
    if sorted(record["images"]) != parts or any(n not in raw for n in media):
        raise SampleDocError(
            f"{where} is incomplete: its .json lists {record['images'] + media}, it holds "
            f"{sorted(p for p in raw if not p.startswith('__') and p != 'json')}"
        )
    return EquishardSample(
        **basic_sample_keys(raw),
        record=record,
        images=[v for _, v in images],
        videos=[raw[n] for n in record.get("videos", ())],
        audios=[raw[n] for n in record.get("audios", ())],
    )
