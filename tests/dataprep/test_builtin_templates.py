"""The built-in chat templates (``chatml``, ``vicuna``, ``plain``): the text training rows are
made of (``render_spans``) is the text prep counts (``render``), and the training targets are
exactly the assistant answers.

Anchored to references outside the code: literal renderings written by hand from each format's
definition, and, for the targets, the answers themselves found in the text. Planted bugs these
catch: assistant spans that start or end a character off (an answer's first or last token never
trained), a default system prompt rendered twice in training rows but once in prep's count, an
image's markers missing from one of the two renderings."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataprep.chat_template import BUILTIN_TEMPLATES
from dataprep.records import IMAGE_PLACEHOLDER

VICUNA_SYSTEM = (
    "A chat between a curious human and an artificial intelligence assistant. The assistant "
    "gives helpful, detailed, and polite answers to the human's questions."
)
TURNS = [("user", f"{IMAGE_PLACEHOLDER}\nWhat is it?"), ("assistant", "A cat."), ("user", "Sure?")]
TURNS += [("assistant", "Yes.")]

EXPECTED = {
    "chatml": (
        f"<|im_start|>user\n<img>{IMAGE_PLACEHOLDER}</img>\nWhat is it?<|im_end|>\n"
        "<|im_start|>assistant\nA cat.<|im_end|>\n"
        "<|im_start|>user\nSure?<|im_end|>\n<|im_start|>assistant\nYes.<|im_end|>\n"
    ),
    "vicuna": (
        f"<s>{VICUNA_SYSTEM} USER: {IMAGE_PLACEHOLDER}\nWhat is it? ASSISTANT: A cat. USER: Sure?"
        " ASSISTANT: Yes."
    ),
    "plain": f"{IMAGE_PLACEHOLDER}\nWhat is it?\nA cat.\nSure?\nYes.\n",
}


@pytest.mark.parametrize("name", sorted(BUILTIN_TEMPLATES))
def test_builtin_renders_its_format_by_hand(name):
    t = BUILTIN_TEMPLATES[name]
    text, spans = t.render_spans(TURNS)
    assert t.render(TURNS) == text == EXPECTED[name]
    assert [text[a:b] for a, b in spans] == ["A cat.", "Yes."]


def test_a_given_system_turn_replaces_the_default_prompt():
    t = BUILTIN_TEMPLATES["vicuna"]
    turns = [("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello")]
    text, spans = t.render_spans(turns)
    assert text == t.render(turns) == "<s>Be brief. USER: Hi ASSISTANT: Hello"
    assert VICUNA_SYSTEM not in text
    assert [text[a:b] for a, b in spans] == ["Hello"]


_words = st.text(alphabet="ab c\n.?", min_size=0, max_size=12)
_turn = st.tuples(
    st.sampled_from(["user", "assistant"]),
    st.lists(st.one_of(_words, st.just(IMAGE_PLACEHOLDER)), max_size=3).map("".join),
)


@settings(max_examples=200, deadline=None)
@given(
    name=st.sampled_from(sorted(BUILTIN_TEMPLATES)),
    system=st.one_of(st.none(), _words),
    turns=st.lists(_turn, max_size=6),
)
def test_training_rows_are_the_counted_text_and_targets_are_the_answers(name, system, turns):
    t = BUILTIN_TEMPLATES[name]
    turns = ([("system", system)] if system is not None else []) + turns
    text, spans = t.render_spans(turns)
    assert text == t.render(turns)
    answers = [c for r, c in turns if r == "assistant"]
    expand = (t.image_prefix + IMAGE_PLACEHOLDER + t.image_suffix) if t.image_prefix else None
    if expand:
        answers = [a.replace(IMAGE_PLACEHOLDER, expand) for a in answers]
    assert [text[a:b] for a, b in spans] == answers
    assert all(0 <= a <= b <= len(text) for a, b in spans)
    assert all(b1 <= a2 for (_, b1), (a2, _) in itertools.pairwise(spans))
