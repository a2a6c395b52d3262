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
* ``llava-onevision`` — LLaVA-OneVision's anyres_max_9 (:mod:`dataprep.anyres_policy`): a
  sample's image costs depend on how many images the sample has.
* ``llava-next`` — LLaVA-NeXT's anyres (:mod:`dataprep.anyres_policy`): every image, over the
  model's own grid list, never pooled.
* ``pixtral`` / ``mistral3`` — Pixtral's resize to fit the longest edge, rows of image tokens
  with a break after each (:mod:`dataprep.pixtral_policy`).
* ``smolvlm`` / ``idefics3`` — their image splitting into tiles plus a global tile, with the
  tile markers of the prompt (:mod:`dataprep.smolvlm_policy`).
* ``glm4v`` — GLM-4.1V / 4.5V / 4.6V (:mod:`dataprep.glm4v_policy`): Qwen2-VL's resize with
  GLM's small-image upscaling and two frames per image against the pixel bounds.
* ``aya-vision`` — Aya Vision: InternVL's tiling with 364-px tiles and the prompt's tile
  markers (:mod:`dataprep.aya_policy`).
* ``ovis2`` — Ovis2 (:mod:`dataprep.ovis2_policy`): the fewest 448-px tiles covering 90 % of
  the image, a thumbnail, 256 atoms a tile and the prompt's grid markers.
* ``aria`` — Aria (:mod:`dataprep.aria_policy`): every image (or, split, each crop) padded to
  980 px, a fixed number of query tokens a crop.
* ``granite-docling`` — Granite Docling (:mod:`dataprep.granite_docling_policy`): 512-px page
  tiles on the closest-aspect grid, a thumbnail, SmolVLM-style markers in the prompt.
* ``idefics2`` — Idefics2 (:mod:`dataprep.idefics2_policy`): each image (or its four quarters
  and itself) resized within 378..980 px, the patches it covers, 64 resampled tokens a crop.
* ``gemma3`` — Gemma 3 (:mod:`dataprep.gemma3_policy`): every image resized to 896 x 896, patch
  14 (4096 encoder patches), average-pooled to 256 LLM tokens; with ``pan_and_scan=1`` a long
  image's crops too, each an image of its own, and the sentence its processor writes.
* ``gemma4`` — Gemma 4 (:mod:`dataprep.gemma4_policy`): an aspect-preserving resize within a
  patch budget, ``max_soft_tokens`` pooled soft tokens at most, every image padded to the
  budget for the encoder.

Spec strings take options (:func:`dataprep.policy_spec.parse_vision_policy`):
``internvl:max_tiles=6,thumbnail=0``,
``qwen2vl:min_pixels=3136,max_pixels=1003520,resize=qwen-vl-utils``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import ClassVar

from dataprep.errors import SampleRejected

__all__ = [
    "ERNIE45VL_DEFAULTS",
    "QWEN2VL_RESIZE",
    "QWEN3VL_DEFAULTS",
    "FixedPolicy",
    "ImageCost",
    "InternVLPolicy",
    "Qwen2VLPolicy",
    "VisionPolicy",
    "closest_aspect_grid",
    "internvl_grid",
    "qwen2vl_smart_resize",
    "tile_grids",
]


@dataclass(frozen=True, slots=True)
class ImageCost:
    """What one image costs: encoder sequence length per image/tile, and LLM tokens.
    ``text``: prompt text the processor writes around the image's tokens that depends on the
    image (SmolVLM's tile markers); prep counts it with the tokenizer, beside ``llm_tokens``.
    It stands before the template's image placeholder, ``after`` after it (text the processor
    writes after the image's last tokens, which may join the template's text that follows),
    ``before`` before the template's own start of the image (Gemma 3's pan-and-scan sentence)."""

    vit_seq_lens: tuple[int, ...]
    llm_tokens: int
    text: str = ""
    after: str = ""
    before: str = ""

    @property
    def vit_tokens(self) -> int:
        return sum(self.vit_seq_lens)


@dataclass(frozen=True, kw_only=True)
class VisionPolicy:
    """Base class; subclasses implement :meth:`image_cost` and :meth:`spec`."""

    def image_cost(self, width: int, height: int) -> ImageCost:
        raise NotImplementedError

    def sample_costs(self, sizes: list[tuple[int, int]]) -> list[ImageCost]:
        """The costs of one sample's images, given their (width, height) in order (a policy
        whose image costs depend on the sample overrides this)."""
        return [self.image_cost(w, h) for w, h in sizes]

    def prompt(self, text: str) -> str:
        """The rendered text (each image's own text in place) as the family's processor
        rewrites its whole prompt at the end (Idefics2's joined fake tokens); most leave it."""
        return text

    def spec(self) -> str:
        raise NotImplementedError

    def describe(self) -> dict:
        return {"spec": self.spec(), "kind": type(self).__name__, **asdict(self)}


@dataclass(frozen=True, kw_only=True)
class FixedPolicy(VisionPolicy):
    image_size: int = 336
    patch_size: int = 14

    def __post_init__(self) -> None:
        if self.image_size <= 0 or self.patch_size <= 0 or self.image_size % self.patch_size:
            raise ValueError(
                f"fixed policy needs image_size divisible by patch_size, got "
                f"{self.image_size}/{self.patch_size}; use e.g. 'fixed:336/14'"
            )

    def image_cost(self, width: int, height: int) -> ImageCost:
        n = (self.image_size // self.patch_size) ** 2
        return ImageCost((n,), n)

    def spec(self) -> str:
        return f"fixed:{self.image_size}/{self.patch_size}"


def _internvl_target_ratios(min_num: int, max_num: int) -> list[tuple[int, int]]:
    # Same construction and order as the reference: a set of grids sorted (stably) by tile count.
    ratios = {
        (i, j)
        for n in range(min_num, max_num + 1)
        for i in range(1, n + 1)
        for j in range(1, n + 1)
        if min_num <= i * j <= max_num
    }
    return sorted(ratios, key=lambda r: r[0] * r[1])


@lru_cache(maxsize=64)
def tile_grids(min_tiles: int, max_tiles: int, max_side: int) -> tuple[tuple[int, int], ...]:
    """Every ``a x b`` grid of ``min_tiles..max_tiles`` tiles, each side at most ``max_side``, in
    the order GOT-OCR2's, Ovis2's and Granite Docling's image processors try them: ``a`` then
    ``b`` ascending, sorted (stably) by tile count."""
    grids = [
        (a, b)
        for a in range(1, max_side + 1)
        for b in range(1, max_side + 1)
        if min_tiles <= a * b <= max_tiles
    ]
    return tuple(sorted(grids, key=lambda g: g[0] * g[1]))


def closest_aspect_grid(width: int, height: int, grids, tile: int) -> tuple[int, int]:
    """Of ``grids`` ((columns, rows), in order), the one whose aspect ratio is closest to the
    image's; a later one as close wins while the image has more than half its area in tiles of
    ``tile`` px (InternVL's ``find_closest_aspect_ratio``, which GOT-OCR2's, Aya Vision's and
    Granite Docling's image processors reproduce)."""
    aspect_ratio = width / height
    best_diff = float("inf")
    best = (1, 1)
    area = width * height
    for ratio in grids:
        diff = abs(aspect_ratio - ratio[0] / ratio[1])
        if diff < best_diff:
            best_diff = diff
            best = ratio
        elif diff == best_diff and area > 0.5 * tile * tile * ratio[0] * ratio[1]:
            best = ratio
    return best


@lru_cache(maxsize=65536)
def internvl_grid(width: int, height: int, min_num: int, max_num: int, image_size: int) -> tuple:
    """The (columns, rows) tile grid InternVL's ``dynamic_preprocess`` picks for an image."""
    return closest_aspect_grid(width, height, _internvl_target_ratios(min_num, max_num), image_size)


@dataclass(frozen=True, kw_only=True)
class InternVLPolicy(VisionPolicy):
    min_tiles: int = 1
    max_tiles: int = 12
    tile_size: int = 448
    patch_size: int = 14
    downsample_ratio: float = 0.5
    thumbnail: bool = True
    family: ClassVar[str] = "internvl"  # the spec name errors speak of (subclasses: their own)

    def __post_init__(self) -> None:
        if not 1 <= self.min_tiles <= self.max_tiles:
            raise ValueError(
                f"{self.family} needs 1 <= min_tiles <= max_tiles, got {self.min_tiles}..{self.max_tiles}"
            )
        if self.patch_size < 1 or self.tile_size < self.patch_size:
            raise ValueError(
                f"{self.family} needs patch_size >= 1 and tile_size >= patch_size, got tile_size="
                f"{self.tile_size}, patch_size={self.patch_size} (defaults: 448 and 14)"
            )
        if self.tile_size % self.patch_size:
            raise ValueError(f"tile_size {self.tile_size} must be a multiple of {self.patch_size}")
        if self.llm_tokens_per_tile < 1 or (self.tile_size // self.patch_size) % 2:
            raise ValueError(
                f"{self.family}'s 2x2 pixel shuffle needs an even number of patches per tile side; "
                f"tile_size {self.tile_size} / patch_size {self.patch_size} is "
                f"{self.tile_size // self.patch_size}"
            )

    @property
    def patches_per_tile(self) -> int:
        return (self.tile_size // self.patch_size) ** 2

    @property
    def llm_tokens_per_tile(self) -> int:
        return int(self.patches_per_tile * self.downsample_ratio**2)

    def num_tiles(self, width: int, height: int) -> int:
        cols, rows = internvl_grid(width, height, self.min_tiles, self.max_tiles, self.tile_size)
        tiles = cols * rows
        return tiles + 1 if self.thumbnail and tiles != 1 else tiles

    def image_cost(self, width: int, height: int) -> ImageCost:
        tiles = self.num_tiles(width, height)
        return ImageCost((self.patches_per_tile,) * tiles, self.llm_tokens_per_tile * tiles)

    def spec(self) -> str:
        return (
            f"internvl:min_tiles={self.min_tiles},max_tiles={self.max_tiles},"
            f"tile_size={self.tile_size},thumbnail={int(self.thumbnail)}"
        )


QWEN2VL_RESIZE = ("transformers", "qwen-vl-utils")


def qwen2vl_smart_resize(
    height: int,
    width: int,
    factor: int = 28,
    min_pixels: int = 56 * 56,
    max_pixels: int = 28 * 28 * 1280,
    resize: str = "transformers",
) -> tuple[int, int]:
    """Qwen2-VL's ``smart_resize``: (height, width) after resizing, multiples of ``factor``.

    ``resize="transformers"``: the transformers image processor's form (a side may round to 0
    before the min_pixels branch scales it up; a shrunk side is kept >= ``factor``).
    ``resize="qwen-vl-utils"``: qwen-vl-utils' form (each side first rounded to >= ``factor``;
    a shrunk side is floored without that clamp).
    """
    if max(height, width) / min(height, width) > 200:
        raise SampleRejected(
            "aspect_ratio_out_of_range",
            f"{width}x{height}: qwen2vl accepts aspect ratios up to 200",
        )
    utils = resize == "qwen-vl-utils"
    floor = factor if utils else 0
    h_bar = max(floor, round(height / factor) * factor)
    w_bar = max(floor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = math.floor(height / beta / factor) * factor
        w_bar = math.floor(width / beta / factor) * factor
        if not utils:
            h_bar, w_bar = max(factor, h_bar), max(factor, w_bar)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@lru_cache(maxsize=65536)
def _qwen2vl_cost(
    width: int, height: int, min_px: int, max_px: int, patch: int, merge: int, resize: str
) -> ImageCost:
    h, w = qwen2vl_smart_resize(height, width, patch * merge, min_px, max_px, resize)
    patches = (h // patch) * (w // patch)
    return ImageCost((patches,), patches // (merge * merge))


@dataclass(frozen=True, kw_only=True)
class Qwen2VLPolicy(VisionPolicy):
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    patch_size: int = 14
    merge_size: int = 2
    resize: str = "transformers"

    def __post_init__(self) -> None:
        if self.resize not in QWEN2VL_RESIZE:
            raise ValueError(
                f"qwen2vl resize must be one of {', '.join(QWEN2VL_RESIZE)}, got {self.resize!r}: "
                "'transformers' as Qwen2VLProcessor resizes, 'qwen-vl-utils' as fetch_image does"
            )
        if not 0 < self.min_pixels <= self.max_pixels:
            raise ValueError(
                f"qwen2vl needs 0 < min_pixels <= max_pixels, got {self.min_pixels}, {self.max_pixels}"
            )
        if self.patch_size < 1 or self.merge_size < 1:
            raise ValueError(
                f"qwen2vl needs patch_size >= 1 and merge_size >= 1, got {self.patch_size} and "
                f"{self.merge_size} (defaults: 14 and 2)"
            )

    def image_cost(self, width: int, height: int) -> ImageCost:
        return _qwen2vl_cost(
            width,
            height,
            self.min_pixels,
            self.max_pixels,
            self.patch_size,
            self.merge_size,
            self.resize,
        )

    def resized(self, width: int, height: int) -> tuple[int, int]:
        """(height, width) the image is resized to before cutting patches."""
        factor = self.patch_size * self.merge_size
        return qwen2vl_smart_resize(
            height, width, factor, self.min_pixels, self.max_pixels, self.resize
        )

    def spec(self) -> str:
        return (
            f"qwen2vl:min_pixels={self.min_pixels},max_pixels={self.max_pixels},"
            f"patch_size={self.patch_size},merge_size={self.merge_size},resize={self.resize}"
        )


# ERNIE 4.5-VL: its image processor is Qwen2-VL's (transformers' smart resize, patch 14, 2x2
# merge) with its own pixel bounds (size: shortest_edge 3136, longest_edge 28 * 28 * 6177)
ERNIE45VL_DEFAULTS = {"min_pixels": 56 * 56, "max_pixels": 28 * 28 * 6177}

# Qwen3-VL: Qwen2-VL's smart resize with 16-px patches (multiples of 32) and the pixel bounds of
# its released image processor (size: shortest_edge 65536, longest_edge 16777216)
QWEN3VL_DEFAULTS = {"patch_size": 16, "min_pixels": 65536, "max_pixels": 16777216}
