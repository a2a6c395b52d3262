"""Aya Vision's vision policy: tiles, LLM tokens and the tile markers, from image sizes alone.

What ``GotOcr2ImageProcessor`` (``crop_to_patches=True``) + ``AyaVisionProcessor``
(transformers) do with an image, reproduced from the sizes in its header:

1. The image is cut into the tile grid InternVL's ``dynamic_preprocess`` picks
   (:func:`~dataprep.policies.internvl.internvl_grid`: ``min_tiles..max_tiles`` tiles of
   ``tile_size`` px, the grid whose aspect ratio is closest to the image's), plus the whole image
   resized to one tile (the global tile) when there is more than one tile.
2. Every tile is one encoder sequence of ``(tile_size / patch_size)^2`` patches (364/14: 676),
   pixel-shuffled 2x2 to ``tokens_per_tile`` LLM tokens (169).
3. The prompt spells the image out: ``<|START_OF_IMG|>``, then ``TILE_k`` before each of the
   ``n - 1`` grid tiles' tokens, ``TILE_GLOBAL`` before the global tile's (the only tile of a
   one-tile image), then ``<|END_OF_IMG|>``. ``TILE_k`` is plain text in the prompt, tokenized
   between two image tokens (special tokens: the tokenizer splits the text at them). The
   policy's :attr:`~dataprep.policies.base.ImageCost.text` holds the markers each followed by an
   ``<image>`` placeholder (special for prep's counter, and not counted), so that the tokenizer
   sees them bounded as in the real prompt; ``llm_tokens`` are the tiles' image tokens.

Spec: ``aya-vision[:min_tiles=1,max_tiles=12,tile_size=364,patch_size=14]`` (Aya Vision 8B and
32B: the image processor's ``min_patches``, ``max_patches`` and ``size``, the vision config's
``patch_size``). The chat template's image marker is ``<image>``, as LLaVA's.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import ClassVar

from dataprep.policies.base import ImageCost
from dataprep.policies.internvl import InternVLPolicy
from dataprep.records import IMAGE_PLACEHOLDER

__all__ = ["AYA_MARKERS", "AyaVisionPolicy"]

# AyaVisionProcessor's defaults: start, end, patch token, tile prefix, global tile marker
AYA_MARKERS = ("<|START_OF_IMG|>", "<|END_OF_IMG|>", "<|IMG_PATCH|>", "TILE", "TILE_GLOBAL")


@lru_cache(maxsize=4096)
def _cost(tiles: int, patches: int, tokens: int) -> ImageCost:
    start, end, _, tile, global_tile = AYA_MARKERS
    markers = [f"{tile}_{k}" for k in range(1, tiles)] + [global_tile]
    # each marker is followed by its tile's image tokens (special: counted in llm_tokens)
    text = start + "".join(m + IMAGE_PLACEHOLDER for m in markers) + end
    return ImageCost((patches,) * tiles, tokens * tiles, text)


@dataclass(frozen=True, kw_only=True)
class AyaVisionPolicy(InternVLPolicy):
    tile_size: int = 364
    family: ClassVar[str] = "aya-vision"

    def image_cost(self, width: int, height: int) -> ImageCost:
        tiles = self.num_tiles(width, height)
        return _cost(tiles, self.patches_per_tile, self.llm_tokens_per_tile)

    def spec(self) -> str:
        return (
            f"aya-vision:min_tiles={self.min_tiles},max_tiles={self.max_tiles},"
            f"tile_size={self.tile_size},patch_size={self.patch_size}"
        )
