"""What every vision policy shares: :class:`ImageCost` (one image's encoder and LLM cost), the
:class:`VisionPolicy` base class, and the tile-grid helpers of the tiling families."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from functools import lru_cache

from equishard.common.values import check_count, check_flag, check_real

# a policy's whole-number options (pixels, tiles, tokens) stay below this: larger ones are a
# slip (a byte count for a pixel count) and would overflow the cost table's int32 lengths
MAX_OPTION = (1 << 31) - 1


def check_field_types(rule) -> None:
    """Every field of the dataclass ``rule`` has the type it declares (``int``, ``bool``,
    ``float``, ``str``): a spec string is parsed to these types, and a Python caller's
    ``max_tiles=2.5``, ``patch_size=True`` or ``fps=float("nan")`` would otherwise pass the range
    checks, which NaN passes and True reads as 1. Integers stay within :data:`MAX_OPTION`."""
    name = type(rule).__name__
    for f in fields(rule):
        value = getattr(rule, f.name)
        if f.type == "int":
            check_count(f"{name}.{f.name}", value, 0, MAX_OPTION)
        elif f.type == "bool":
            check_flag(f"{name}.{f.name}", value)
        elif f.type == "float":
            check_real(f"{name}.{f.name}", value, -math.inf, lo_open=True)
        elif f.type == "str" and not isinstance(value, str):
            raise ValueError(f"{name}.{f.name} must be a string, got {value!r}")


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
    """Base class; subclasses implement :meth:`image_cost` and :meth:`spec`, and their
    ``__post_init__`` starts with ``super().__post_init__()``: every option has the type its
    field declares, checked here (a spec string is parsed to these types; a Python caller's
    ``max_tiles=2.5``, ``patch_size=True``, ``tile_size=float("nan")`` or ``thumbnail="no"``
    would otherwise pass the families' range checks, which NaN passes and True reads as 1)."""

    def __post_init__(self) -> None:
        check_field_types(self)

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
