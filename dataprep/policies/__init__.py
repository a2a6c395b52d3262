"""Vision policies: how many encoder patches and LLM tokens one image costs, from its size alone.

Each policy reproduces the preprocessing of a published model family exactly:

* ``fixed:S/P`` — resize to S x S, (S/P)^2 patches, one LLM token per patch (LLaVA-1.5: 336/14).
* ``internvl`` — InternVL 1.5/2 ``dynamic_preprocess``: the tile grid (i, j) with min..max tiles
  whose aspect ratio is closest to the image's (ties go to the larger grid when the image has
  more than half of that grid's area), plus a thumbnail tile when more than one tile; 448 px tiles,
  patch 14 (1024 patches per tile), pixel shuffle 0.5 (256 LLM tokens per tile).
* ``qwen2vl`` — Qwen2-VL ``smart_resize``: round height and width to multiples of 28 keeping the
  pixel count within [min_pixels, max_pixels]; patches of 14; 2x2 merge for LLM tokens. Two
  published forms differ for small and extreme-aspect images (10x500 px: 60 patches against
  72): ``resize=transformers`` (default) is the Qwen2-VL image processor of ``transformers``
  (``Qwen2VLProcessor``: LLaMA-Factory, TRL, ms-swift and other trainers built on HF processors);
  ``resize=qwen-vl-utils`` is ``qwen_vl_utils.fetch_image``, which rounds each side to at least
  28 px first (the Qwen2-VL / Qwen2.5-VL repositories' own fine-tuning code and vLLM-style
  pipelines that call ``process_vision_info``). Pick the one your training data loader runs.
* ``qwen3vl`` — the same resize with Qwen3-VL's image processor settings: 16-px patches
  (multiples of 32), pixels within [65536, 16777216].
* ``ernie45vl`` — the same resize with ERNIE 4.5-VL's settings: 14-px patches merged 2x2,
  pixels within [3136, 4842768] (its image processor is Qwen2-VL's under another name).
* ``llava-onevision`` — LLaVA-OneVision's anyres_max_9 (:mod:`.anyres`): a
  sample's image costs depend on how many images the sample has.
* ``llava-next`` — LLaVA-NeXT's anyres (:mod:`.anyres`): every image, over the
  model's own grid list, never pooled.
* ``pixtral`` / ``mistral3`` — Pixtral's resize to fit the longest edge, rows of image tokens
  with a break after each (:mod:`.pixtral`).
* ``smolvlm`` / ``idefics3`` — their image splitting into tiles plus a global tile, with the
  tile markers of the prompt (:mod:`.smolvlm`).
* ``glm4v`` — GLM-4.1V / 4.5V / 4.6V (:mod:`.glm4v`): Qwen2-VL's resize with
  GLM's small-image upscaling and two frames per image against the pixel bounds.
* ``aya-vision`` — Aya Vision: InternVL's tiling with 364-px tiles and the prompt's tile
  markers (:mod:`.aya`).
* ``ovis2`` — Ovis2 (:mod:`.ovis2`): the fewest 448-px tiles covering 90 % of
  the image, a thumbnail, 256 atoms a tile and the prompt's grid markers.
* ``aria`` — Aria (:mod:`.aria`): every image (or, split, each crop) padded to
  980 px, a fixed number of query tokens a crop.
* ``granite-docling`` — Granite Docling (:mod:`.granite_docling`): 512-px page
  tiles on the closest-aspect grid, a thumbnail, SmolVLM-style markers in the prompt.
* ``idefics2`` — Idefics2 (:mod:`.idefics2`): each image (or its four quarters
  and itself) resized within 378..980 px, the patches it covers, 64 resampled tokens a crop.
* ``gemma3`` — Gemma 3 (:mod:`.gemma3`): every image resized to 896 x 896, patch
  14 (4096 encoder patches), average-pooled to 256 LLM tokens; with ``pan_and_scan=1`` a long
  image's crops too, each an image of its own, and the sentence its processor writes.
* ``gemma4`` — Gemma 4 (:mod:`.gemma4`): an aspect-preserving resize within a
  patch budget, ``max_soft_tokens`` pooled soft tokens at most, every image padded to the
  budget for the encoder.

Spec strings take options (:func:`parse_vision_policy`; the names are :data:`POLICIES` in
:mod:`.registry`; the policies are defined by the model families,
:mod:`dataprep.families`):
``internvl:max_tiles=6,thumbnail=0``,
``qwen2vl:min_pixels=3136,max_pixels=1003520,resize=qwen-vl-utils``.

One module per family (``internvl``, ``qwen2vl``, ``anyres``, ``pixtral``, ...), its shared pieces
in :mod:`.base`.
"""

from dataprep.policies.base import ImageCost, VisionPolicy, closest_aspect_grid, tile_grids
from dataprep.policies.fixed import FixedPolicy
from dataprep.policies.internvl import InternVLPolicy, internvl_grid
from dataprep.policies.qwen2vl import (
    ERNIE45VL_DEFAULTS,
    QWEN2VL_RESIZE,
    QWEN3VL_DEFAULTS,
    Qwen2VLPolicy,
    qwen2vl_smart_resize,
)

__all__ = [
    "ERNIE45VL_DEFAULTS",
    "POLICIES",
    "QWEN2VL_RESIZE",
    "QWEN3VL_DEFAULTS",
    "FixedPolicy",
    "ImageCost",
    "InternVLPolicy",
    "PolicyFamily",
    "Qwen2VLPolicy",
    "VisionPolicy",
    "closest_aspect_grid",
    "internvl_grid",
    "parse_vision_policy",
    "qwen2vl_smart_resize",
    "tile_grids",
]

# the registry reads the families' specs, which import the policy modules: loaded on first use
_REGISTRY = ("POLICIES", "PolicyFamily", "parse_vision_policy")


def __getattr__(name: str):
    if name in _REGISTRY:
        from dataprep.policies import registry

        return getattr(registry, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
