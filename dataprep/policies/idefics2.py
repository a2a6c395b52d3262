"""Idefics2's images: encoder patches, LLM tokens and the prompt text around them, from image
sizes alone.

What ``Idefics2ImageProcessor`` + ``Idefics2Processor`` (transformers) do with an image,
reproduced from the sizes in its header:

1. With splitting on (the image processor's ``do_image_splitting``), the image is cut into its
   four quarters (at half the height and width, rounded down) followed by the whole image:
   five crops; otherwise the image is one crop.
2. Each crop is resized on its own: a side above ``longest_edge`` brings the longer side down
   to it (the other keeps the aspect ratio, truncated), then each side is raised to at least
   ``shortest_edge`` on its own (the aspect ratio is not kept there).
3. The encoder attends over the ``patch_size`` cells the crop covers fully: the model masks a
   crop padded to the batch's largest by its ``pixel_attention_mask``, so ``floor(h / p) *
   floor(w / p)`` patches whatever the batch (with FlashAttention the padding is not run at
   all; with SDPA it is run and masked). The perceiver resampler turns every crop into
   ``tokens_per_image`` LLM tokens (``resampler_n_latents``: 64).
4. The prompt: every image marker becomes ``<fake_token_around_image>`` + the crop's tokens +
   ``<fake_token_around_image>`` per crop; two fake tokens in a row (between crops, between
   adjacent images) are joined into one, and a space is put after a fake token followed by
   text that starts with neither a space nor ``<`` (``Idefics2Processor``'s rules,
   :meth:`Idefics2Policy.prompt` and :func:`idefics2_image_texts`).

Spec: ``idefics2[:shortest_edge=378,longest_edge=980,patch_size=14,tokens_per_image=64,
split=0]`` (the image processor's defaults; ``split=1`` where the processor splits, the
setting Idefics2's model card tells to turn off to save memory).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from dataprep.policies.base import ImageCost, VisionPolicy
from dataprep.records import IMAGE_PLACEHOLDER

__all__ = [
    "FAKE",
    "Idefics2Policy",
    "idefics2_crops",
    "idefics2_expansion",
    "idefics2_image_texts",
    "idefics2_resize",
]

FAKE = "<fake_token_around_image>"
_SPACE_AFTER = re.compile(rf"{re.escape(FAKE)}(?=[^\s<])")  # the processor's own pattern


def idefics2_resize(height: int, width: int, shortest: int, longest: int) -> tuple[int, int]:
    """(height, width) of a crop after the image processor's resize (step 2)."""
    aspect = width / height
    if width >= height and width > longest:
        width, height = longest, int(longest / aspect)
    elif height > width and height > longest:
        height, width = longest, int(longest * aspect)
    return max(height, shortest), max(width, shortest)


def idefics2_crops(width: int, height: int, split: bool) -> list[tuple[int, int]]:
    """(height, width) of each crop before resizing (step 1), in the processor's order."""
    if not split:
        return [(height, width)]
    mh, mw = height // 2, width // 2
    quarters = [(mh, mw), (mh, width - mw), (height - mh, mw), (height - mh, width - mw)]
    return [*quarters, (height, width)]


def idefics2_expansion(crop: str, crops: int) -> str:
    """One image's text in the processor's prompt before the joining with its neighbours:
    each crop's tokens (``crop``) between fake tokens, one fake token between two crops."""
    return FAKE + (crop + FAKE) * crops


def idefics2_image_texts(parts: list[str], expanded: list[str]) -> list[str]:
    """What each image marker becomes in ``Idefics2Processor``'s prompt, given the text around
    the markers (``parts``: the text split at them) and each image's expansion (its crops'
    tokens, each between fake tokens): an image right after another drops its opening fake
    token (the processor joins the two), and one followed by text that starts with neither a
    space nor ``<`` gets a space after its closing fake token."""
    assert len(parts) == len(expanded) + 1, (len(parts), len(expanded))
    out = []
    for k, text in enumerate(expanded):
        if k and not parts[k] and text.startswith(FAKE):
            text = text[len(FAKE) :]
        following = parts[k + 1] or (expanded[k + 1][:1] if k + 1 < len(expanded) else "")
        if following and not following[0].isspace() and following[0] != "<":
            text += " "
        out.append(text)
    return out


@lru_cache(maxsize=65536)
def _cost(width: int, height: int, policy: Idefics2Policy) -> ImageCost:
    p = policy.patch_size
    seq = tuple(
        (h // p) * (w // p)
        for h, w in (
            idefics2_resize(ch, cw, policy.shortest_edge, policy.longest_edge)
            for ch, cw in idefics2_crops(width, height, policy.split)
        )
    )
    # a placeholder stands for each crop's tokens; the last one's closing fake token after
    text = idefics2_expansion(IMAGE_PLACEHOLDER, len(seq))[: -len(IMAGE_PLACEHOLDER + FAKE)]
    return ImageCost(seq, policy.tokens_per_image * len(seq), text, FAKE)


@dataclass(frozen=True, kw_only=True)
class Idefics2Policy(VisionPolicy):
    shortest_edge: int = 378
    longest_edge: int = 980
    patch_size: int = 14
    tokens_per_image: int = 64
    split: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.patch_size < 1 or self.tokens_per_image < 1:
            raise ValueError(
                f"idefics2 needs patch_size >= 1 and tokens_per_image >= 1, got "
                f"{self.patch_size} and {self.tokens_per_image} (the vision config's patch_size "
                "and the processor's image_seq_len, Idefics2-8B: 14 and 64)"
            )
        if not self.patch_size <= self.shortest_edge <= self.longest_edge:
            raise ValueError(
                f"idefics2 needs patch_size <= shortest_edge <= longest_edge, got "
                f"{self.patch_size}, {self.shortest_edge}, {self.longest_edge} (the image "
                "processor's size: shortest_edge 378, longest_edge 980)"
            )

    def image_cost(self, width: int, height: int) -> ImageCost:
        return _cost(width, height, self)

    def prompt(self, text: str) -> str:
        # the processor's own rules over its whole prompt: fake tokens in a row joined, a
        # space after one that text follows
        return _SPACE_AFTER.sub(f"{FAKE} ", text.replace(FAKE + FAKE, FAKE))

    def spec(self) -> str:
        return (
            f"idefics2:shortest_edge={self.shortest_edge},longest_edge={self.longest_edge},"
            f"patch_size={self.patch_size},tokens_per_image={self.tokens_per_image},"
            f"split={int(self.split)}"
        )
