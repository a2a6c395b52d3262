"""Idefics2's policy at its limits: the resize around both edges against transformers' own
``get_resize_output_image_size``, each setting at, below and above its limit with its message,
and the processor's prompt rules by hand.

Bugs these catch: a side exactly at ``longest_edge`` shrunk (``>=`` for ``>``), a square image
taking the portrait branch, a side raised to ``shortest_edge`` only below it by one, a limit
of 1 taken as 0, fake tokens in a row not joined (or three joined into one), a space put
before ``<`` or whitespace, an image right after another keeping its opening fake token, the
space decided by the text's last character, a default that is not the processor's."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dataprep.policies.idefics2 import (
    FAKE,
    Idefics2Policy,
    idefics2_crops,
    idefics2_expansion,
    idefics2_image_texts,
    idefics2_resize,
)
from tests.conftest import built_or_refused

hf = pytest.importorskip("transformers.models.idefics2.image_processing_pil_idefics2")


@pytest.mark.parametrize(("shortest", "longest"), [(378, 980), (378, 378), (14, 28)])
def test_the_resize_around_both_edges_equals_the_processors(shortest, longest):
    from transformers.image_utils import SizeDict

    size = SizeDict(shortest_edge=shortest, longest_edge=longest)
    # beside a side at longest_edge, the other sides whose float round trip through the aspect
    # ratio truncates (980 / (980 / 387) -> 386): there a side at the edge shrunk instead of
    # kept (>= for >) changes the result; elsewhere it is the identity
    between = range(shortest + 1, longest)
    trunc = [s for s in between if int(longest / (longest / s)) != s][:2]  # landscape
    trunc += [s for s in between if int(longest * (s / longest)) != s][:2]  # portrait
    sides = sorted(
        {1, 2, 3, *(shortest + e for e in (-1, 0, 1)), *(longest + e for e in (-1, 0, 1))}
        | {2 * longest, 2 * longest + 1, 5 * longest + 3, *trunc}
    )
    wrong = []
    for h, w in itertools.product(sides, repeat=2):
        image = np.broadcast_to(np.zeros(1, dtype=np.uint8), (3, h, w))
        want = tuple(hf.get_resize_output_image_size(image, size))
        if idefics2_resize(h, w, shortest, longest) != want:
            wrong.append(((h, w), want))
    assert not wrong, wrong[:5]


def test_the_quarters_by_hand():
    """Odd sides: the first row and column of quarters get the smaller half, as the
    processor's ``split_images`` slices them; the whole image comes last."""
    assert idefics2_crops(101, 67, True) == [(33, 50), (33, 51), (34, 50), (34, 51), (67, 101)]
    assert idefics2_crops(101, 67, False) == [(67, 101)]


@pytest.mark.parametrize(
    ("kw", "bad"),
    [
        ({"patch_size": 1, "tokens_per_image": 1, "shortest_edge": 1, "longest_edge": 1}, None),
        ({"patch_size": 0}, "patch_size >= 1 and tokens_per_image >= 1, got 0 and 64"),
        ({"tokens_per_image": 0}, "got 14 and 0"),
        ({"shortest_edge": 14}, None),  # at the patch
        ({"shortest_edge": 13}, "patch_size <= shortest_edge <= longest_edge, got 14, 13, 980"),
        ({"shortest_edge": 980}, None),  # at the longest edge
        ({"shortest_edge": 981}, "got 14, 981, 980"),
    ],
)
def test_settings_at_below_and_above_their_limits(kw, bad):
    p = built_or_refused(Idefics2Policy, kw, bad)
    if p is None:
        return
    h, w = idefics2_resize(500, 700, p.shortest_edge, p.longest_edge)
    c = p.image_cost(700, 500)
    assert c.vit_seq_lens == ((h // p.patch_size) * (w // p.patch_size),)
    assert c.llm_tokens == p.tokens_per_image


def test_the_prompt_rules_by_hand():
    p = Idefics2Policy()
    two = FAKE + "<image>" + FAKE + FAKE + "<image>" + FAKE
    # two fake tokens in a row are one; a space after one that text follows, none before '<'
    # or whitespace
    assert p.prompt(two + "What") == FAKE + "<image>" + FAKE + "<image>" + FAKE + " What"
    assert p.prompt(FAKE + "<b>") == FAKE + "<b>"
    assert p.prompt(FAKE + " x") == FAKE + " x"
    assert p.prompt(FAKE + "\nx") == FAKE + "\nx"
    assert p.prompt("no image") == "no image"
    assert idefics2_expansion("T", 3) == f"{FAKE}T{FAKE}T{FAKE}T{FAKE}"
    a, b = idefics2_expansion("A", 1), idefics2_expansion("B", 1)
    # the second image right after the first drops its opening fake token; text after the
    # last one that starts with a letter gets a space
    assert idefics2_image_texts(["x ", "", "Why"], [a, b]) == [a, b[len(FAKE) :] + " "]
    # text between them: each keeps its own; the first is followed by text, so a space
    assert idefics2_image_texts(["", "and", ""], [a, b]) == [a + " ", b]
    assert idefics2_image_texts(["", " <", ""], [a, b]) == [a, b]


def test_the_defaults_are_the_image_processors():
    """The policy's edges and splitting default to what ``Idefics2ImageProcessor`` does when
    built without settings (378 / 980, no splitting); the 14-pixel patches and 64 tokens an
    image are the released checkpoints' (their configuration classes default otherwise)."""
    proc = hf.Idefics2ImageProcessorPil()
    p = Idefics2Policy()
    got = (p.shortest_edge, p.longest_edge, p.split)
    assert got == (proc.size.shortest_edge, proc.size.longest_edge, proc.do_image_splitting)
    assert (p.patch_size, p.tokens_per_image) == (14, 64)


def test_the_image_texts_read_the_first_character_after_and_need_one_part_more():
    """The space after an image's closing fake token depends on the first character of the
    text after it (the processor's ``(?=[^\\s<])``), not on the last; the text around n
    markers is n + 1 parts, anything else is a caller's error."""
    a = idefics2_expansion("A", 1)
    assert idefics2_image_texts(["", "x<"], [a]) == [a + " "]
    assert idefics2_image_texts(["", "<x"], [a]) == [a]
    assert Idefics2Policy().prompt(FAKE + "x<") == FAKE + " x<"
    for parts in (["x"], ["x", "y", "z"]):
        with pytest.raises(AssertionError):
            idefics2_image_texts(parts, [a])


def test_the_spec_names_every_setting():
    p = Idefics2Policy(shortest_edge=364, longest_edge=728, patch_size=16, tokens_per_image=32)
    assert p.spec() == (
        "idefics2:shortest_edge=364,longest_edge=728,patch_size=16,tokens_per_image=32,split=0"
    )
    assert Idefics2Policy(split=True).spec().endswith(",split=1")
    with pytest.raises(TypeError):
        Idefics2Policy(378)  # keyword-only
