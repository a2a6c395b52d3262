"""The image inputs of a packed row: each family's processed images, joined over the row's samples.

:class:`~trainer_adapter.hf.inputs.HFPacker` processes every sample's images with the family's
image processor; this joins them in the form the family's model takes:

* most families: every image (tile, crop) along the first dimension, ``[n, C, H, W]``;
* SmolVLM / Idefics3 and Granite Docling: ``[1, tiles, C, H, W]`` with each tile's
  ``pixel_attention_mask`` beside it (SmolVLM's per pixel, Granite Docling's per tile), and
  Granite Docling's one ``tile_fine_mask`` for the row on its fine connector path;
* Idefics2: ``[1, crops, C, H, W]``, every crop padded at the bottom and right to the row's
  largest, with its ``pixel_attention_mask`` (0 on the padding) beside it;
* Mistral 3 / Pixtral: every image padded at the bottom and right to the row's largest, with
  ``image_sizes``; LLaVA-NeXT and LLaVA-OneVision: ``image_sizes`` (OneVision's
  ``batch_num_images`` per sample too);
* Qwen-style: ``image_grid_thw``; Gemma 4: ``image_position_ids``; Aria: ``pixel_mask``;
  DeepSeek-VL's hybrid: ``high_res_pixel_values``.

A row without images gets ``pixel_values=None`` (and ``None`` for the keys beside it).

:func:`images_settings`: what a processor's call passes its image processor, which
``HFPacker`` passes it too.
"""

from __future__ import annotations

import torch

from dataprep.families.spec import PackerRules

__all__ = ["images_settings", "pack_images"]


def pack_images(
    family: str, rules: PackerRules, parts: list[dict], *, fine_route: bool = False
) -> dict:
    """The row's image inputs from its samples' processed images (``parts``: each sample's
    dict, ``pixel_values`` absent where it has no image)."""
    with_images = [p for p in parts if "pixel_values" in p]

    def cat(key: str, dim: int = 0):
        return torch.cat([p[key] for p in with_images], dim) if with_images else None

    out = {}
    if family == "mistral3":  # every image padded to the row's largest, with its size
        out["pixel_values"] = _pad_images([p["pixel_values"] for p in with_images])
    elif family == "idefics2":  # every crop padded to the row's largest, with its pixel mask
        for key in ("pixel_values", "pixel_attention_mask"):
            out[key] = _pad_images([p[key] for p in with_images], dim=1)
    else:
        out["pixel_values"] = cat("pixel_values", 1 if rules.tiles else 0)
    if rules.tiles:
        out["pixel_attention_mask"] = cat("pixel_attention_mask", 1)
    if family == "granite_docling" and with_images and fine_route:
        out["tile_fine_mask"] = torch.ones(1, dtype=torch.bool)  # the row's path
    for key in rules.beside:
        out[key] = cat(key)
    if family == "llava_onevision":
        out["batch_num_images"] = [int(p["batch_num_images"][0]) for p in with_images] or None
    return out


def _pad_images(parts: list, dim: int = 0) -> torch.Tensor | None:
    """Blocks of images ``[..., H, W]`` (each padded to its own largest image at the bottom and
    right, as Pixtral's and Idefics2's image processors pad) -> one block padded to the largest
    of all, joined along ``dim``."""
    if not parts:
        return None
    h = max(p.shape[-2] for p in parts)
    w = max(p.shape[-1] for p in parts)
    pad = lambda p: torch.nn.functional.pad(p, (0, w - p.shape[-1], 0, h - p.shape[-2]))  # noqa: E731
    return torch.cat([pad(p) for p in parts], dim)


def images_settings(processor, given: dict) -> dict:
    """The keyword arguments a processor's call passes its image processor: its own defaults
    (the class's ``images_kwargs``) under the call's ``given`` ones (a :class:`ValueError`
    names a setting the image processor does not take)."""
    if not isinstance(given, dict):
        raise ValueError(f"images_kwargs must be a dict of image settings, got {given!r}")
    valid = getattr(getattr(processor.image_processor, "valid_kwargs", None), "__annotations__", {})
    unknown = sorted(set(given) - set(valid)) if valid else []
    if unknown:
        raise ValueError(
            f"images_kwargs {unknown} are not settings of {type(processor.image_processor).__name__}"
            f" (it takes {', '.join(sorted(valid))})"
        )
    settings = {**(getattr(processor, "images_kwargs", None) or {}), **given}
    settings.pop("return_tensors", None)  # the packer's own
    return settings
