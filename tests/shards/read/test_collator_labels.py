"""Which tokens the reference trainer learns from: the collator's labels against assistant
spans found independently (each turn's text located in the rendered conversation, in order),
for every built-in template, with several turns, a system turn, and the ``plain`` template
whose first token is an assistant's (the first token of a sample carries a label there). The
HF packer's labels are checked against transformers' own assistant masks
(tests/trainer_adapter/test_hf_inputs.py)."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from dataprep.chat_template import BUILTIN_TEMPLATES, load_template
from shards.read.collate import Collator
from shards.read.reader import ShardSample

CONVERSATIONS = [
    [("user", "Which colour is the sky?"), ("assistant", "Mostly blue, grey when it rains.")],
    [
        ("system", "Answer briefly."),
        ("user", "Two plus two?"),
        ("assistant", "Four."),
        ("user", "And times three?"),
        ("assistant", "Twelve, since four times three is twelve."),
    ],
    [
        ("assistant", "An opening remark from the model."),
        ("user", "Go on."),
        ("assistant", "Done."),
    ],
]


def _spans(text: str, turns) -> list[tuple[int, int]]:
    """The assistant turns' character spans, found by locating every turn's text in order."""
    out, at = [], 0
    for role, content in turns:
        start = text.index(content, at)
        at = start + len(content)
        if role == "assistant":
            out.append((start, at))
    return out


@pytest.mark.parametrize("template", sorted(BUILTIN_TEMPLATES))
@pytest.mark.parametrize("k", range(len(CONVERSATIONS)))
def test_labels_are_exactly_the_assistant_tokens(tokenizer_path, template, k):
    turns = CONVERSATIONS[k]
    tmpl = load_template(template)
    text = tmpl.render(turns) if hasattr(tmpl, "render") else tmpl.render_spans(turns)[0]
    spans = _spans(text, turns)
    enc = Tokenizer.from_file(tokenizer_path).encode(text, add_special_tokens=False)
    enc_ids = list(enc.ids)
    col = Collator(tokenizer=tokenizer_path, template=template, check_costs=False)
    batch = col([ShardSample("s", {"turns": [list(t) for t in turns], "sample_id": "s"}, [])])
    got = batch["labels"].tolist()
    assert batch["input_ids"].tolist() == enc_ids
    offsets = enc.offsets
    # every character of every assistant turn lies in a labelled token (its first word too:
    # the plain and vicuna templates' tokenizer merges the newline or space before it)
    for lo, hi in spans:
        for ch in range(lo, hi):
            holders = [i for i, (a, b) in enumerate(offsets) if a <= ch < b]
            assert holders and all(got[i] == enc_ids[i] for i in holders), (text[lo:hi], ch)
    # and no token wholly outside the assistant turns is labelled
    for i, (a, b) in enumerate(offsets):
        if not any(a < hi and b > lo for lo, hi in spans):
            assert got[i] == -100, (i, text[a:b])
    if template == "plain" and turns[0][0] == "assistant":
        assert got[0] != -100  # the sample opens with a labelled token
