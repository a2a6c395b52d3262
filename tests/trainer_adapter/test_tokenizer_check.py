"""The processor's tokenizer checked against the one prep counted with when the packer is built
(:mod:`trainer_adapter.hf.tokenizer_check`). Each changed tokenizer is anchored to what it does:
it makes other ids than prep's for the same text (with the same lengths where the change is a
swap of two ids, which no per-sample length check can see), and is refused naming the
difference; prep's own tokenizer, loaded by transformers into the family's processor, passes."""

from __future__ import annotations

import hashlib
import json
import re
import warnings
from pathlib import Path

import pytest

from shards.read.prep_settings import PrepSettings, SettingsMismatch
from tests.dataprep.test_jinja_template import (
    FAMILIES,
    conversations,
    make_model_dir,
    processor_for,
    reference_messages,
    template_spec,
)

pytest.importorskip("transformers")

FAMILY = "internvl"  # its image tokens are added beyond the vocabulary


def _recorded(path: Path, where: str = "gen") -> PrepSettings:
    """What a generation records of prep's tokenizer: its path and its bytes' digest."""
    return PrepSettings(
        where=where,
        vision_policy={},
        template="x",
        template_fields={},
        tokenizer=str(path),
        tokenizer_sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
    )


def _edited(root: Path, tokenizer_path: str, name: str, edit) -> Path:
    """The family's model directory with its tokenizer.json edited by ``edit``."""
    model = make_model_dir(root / name, FAMILY, tokenizer_path)
    data = json.loads((model / "tokenizer.json").read_text())
    edit(data)
    (model / "tokenizer.json").write_text(json.dumps(data))
    return model


def _texts(root: Path, processor) -> list[str]:
    """Rendered conversations, and the image tokens the processor writes into them."""
    rendered = [
        processor.apply_chat_template(reference_messages(rec), tokenize=False)
        for rec in conversations(root, 12, seed=7)
    ]
    return [*rendered, "<img>" + "<IMG_CONTEXT>" * 4 + "</img>", "The Image Shows Tokyo"]


def _ids(tokenizer_file: Path, texts: list[str]) -> list[list[int]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_file))
    return [tok.encode(t, add_special_tokens=False).ids for t in texts]


def _swap_two_ids(data: dict) -> None:
    """The ids of two common tokens exchanged: every length stays, the ids do not."""
    vocab = data["model"]["vocab"]
    a, b = vocab["Ġthe"], vocab["Ġof"]
    vocab["Ġthe"], vocab["Ġof"] = b, a


def _drop_merges(data: dict) -> None:
    """The merges that make ``Ġthe`` gone: the same vocabulary, other pieces."""
    merges = data["model"]["merges"]
    data["model"]["merges"] = [m for m in merges if "".join(m) not in ("Ġthe", "Ġth")]


def _lowercase(data: dict) -> None:
    data["normalizer"] = {"type": "Lowercase"}


def _move_image_token(data: dict) -> None:
    """The added ``<IMG_CONTEXT>`` (InternVL's image token) and ``<video>`` tokens at each
    other's ids (``tokenizers`` numbers the added tokens beyond the vocabulary in their order)."""
    tokens = data["added_tokens"]
    i, j = (
        next(k for k, t in enumerate(tokens) if t["content"] == c)
        for c in ("<IMG_CONTEXT>", "<video>")
    )
    tokens[i], tokens[j] = (
        {**tokens[j], "id": tokens[i]["id"]},
        {**tokens[i], "id": tokens[j]["id"]},
    )


CHANGES = [
    (_swap_two_ids, r"model\['vocab'\].*Another vocabulary or merges"),
    (_drop_merges, r"model\['merges'\].*Another vocabulary or merges"),
    (_lowercase, r"normalizer.*Lowercase.*The same vocabulary and merges with other settings"),
    (_move_image_token, r"of prep's tokens have other ids, e.g. '<IMG_CONTEXT>'.*added tokens"),
]


@pytest.mark.parametrize("edit, names", CHANGES, ids=[c[0].__name__[1:] for c in CHANGES])
def test_a_processor_with_another_tokenizer_is_refused(edit, names, tmp_path, tokenizer_path):
    """Bug: a processor whose tokenizer is not prep's (another vocabulary, merges, normalizer,
    added token ids) was found only where a sample's length differs, and never where only ids
    do: refused when the packer is built, naming where the tokenizers differ."""
    from trainer_adapter.hf.tokenizer_check import check_processor_tokenizer

    prep_model = make_model_dir(tmp_path / "prep", FAMILY, tokenizer_path)
    prep_file = prep_model / "tokenizer.json"
    check_processor_tokenizer(processor_for(FAMILY, prep_model), _recorded(prep_file))

    model = _edited(tmp_path, tokenizer_path, "other", edit)
    processor = processor_for(FAMILY, model)
    texts = _texts(tmp_path, processor)
    theirs, ours = _ids(model / "tokenizer.json", texts), _ids(prep_file, texts)
    assert theirs != ours  # the anchor: other ids for the same text
    if edit is _swap_two_ids:  # the same lengths: no per-sample length check sees it
        assert [len(t) for t in theirs] == [len(t) for t in ours]
    with pytest.raises(SettingsMismatch, match=names):
        check_processor_tokenizer(processor, _recorded(prep_file))


def test_a_tokenizer_not_at_hand_is_named_or_given(tmp_path, tokenizer_path):
    """Where the recorded file is gone (trained on another machine), a warning says the
    tokenizers were not compared; the file given in its place must have prep's bytes."""
    from trainer_adapter.hf.tokenizer_check import check_processor_tokenizer

    prep_model = make_model_dir(tmp_path / "prep", FAMILY, tokenizer_path)
    recorded = _recorded(prep_model / "tokenizer.json")
    copy = make_model_dir(tmp_path / "copy", FAMILY, tokenizer_path)
    other = _edited(tmp_path, tokenizer_path, "other", _swap_two_ids)
    processor = processor_for(FAMILY, copy)
    (prep_model / "tokenizer.json").unlink()
    with pytest.warns(UserWarning, match=r"gen: the tokenizer prep counted with .* not at hand"):
        check_processor_tokenizer(processor, recorded)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_processor_tokenizer(processor, recorded, str(copy))  # a directory: its file
        given = str(other / "tokenizer.json")  # refused for its bytes, before any comparison
        with pytest.raises(SettingsMismatch, match=rf"^tokenizer {re.escape(given)} is not the"):
            check_processor_tokenizer(processor, recorded, given)


def test_from_generation_refuses_a_processor_with_another_tokenizer(tmp_path, tokenizer_path):
    """The whole path: a generation prepped with one tokenizer, a packer built for it from a
    processor whose tokenizer swaps two ids (every length equal) is refused."""
    from tests.dataprep.helpers import run, write_jsonl, write_test_generation
    from trainer_adapter.hf.inputs import HFPacker

    prep_model = make_model_dir(tmp_path / "prep", FAMILY, tokenizer_path)
    src = write_jsonl(tmp_path / "data.jsonl", conversations(tmp_path, 8, seed=3))
    run(
        tmp_path,
        [src],
        str(prep_model / "tokenizer.json"),
        template=template_spec(prep_model, FAMILY),
        vision_policy=FAMILIES[FAMILY]["policy"],
    )
    cost = tmp_path / "out" / "cost.parquet"
    gen = write_test_generation(tmp_path, cost)
    HFPacker.from_generation(gen, processor_for(FAMILY, prep_model), family=FAMILY)
    other = processor_for(FAMILY, _edited(tmp_path, tokenizer_path, "other", _swap_two_ids))
    with pytest.raises(SettingsMismatch, match=r"tokenizer is not the one .* model\[.vocab.\]"):
        HFPacker.from_generation(gen, other, family=FAMILY)


def _reconverted(data: dict) -> None:
    """What another transformers release's conversion of the same checkpoint did (issue 70):
    ``continuing_subword_prefix`` spelled ``""`` for none (the same tokenizer) and
    ``ignore_merges`` flipped (a setting that changes how the merges apply)."""
    model = data["model"]
    model["continuing_subword_prefix"] = (
        "" if model.get("continuing_subword_prefix") is None else None
    )
    model["ignore_merges"] = not model.get("ignore_merges", False)


def test_the_difference_that_changes_ids_is_named_with_the_fix_that_matches_it(
    tmp_path, tokenizer_path
):
    """Bug: the first difference shown was the cosmetic ``continuing_subword_prefix: '' vs
    None`` (the same tokenizer), and the first fix suggested was to build the processor from
    the checkpoint prep counted with, which the user had done. Now the spelling of "none" is
    no difference, the setting is named, and the fix is the one for a re-converted tokenizer;
    where the vocabulary differs too, it comes first, before settings sorted earlier."""
    from trainer_adapter.hf.tokenizer_check import check_processor_tokenizer

    prep_file = make_model_dir(tmp_path / "prep", FAMILY, tokenizer_path) / "tokenizer.json"
    processor = processor_for(FAMILY, _edited(tmp_path, tokenizer_path, "reconv", _reconverted))
    with pytest.raises(SettingsMismatch) as err:
        check_processor_tokenizer(processor, _recorded(prep_file))
    message = str(err.value)
    assert "ignore_merges" in message and "continuing_subword_prefix" not in message
    assert "The same vocabulary and merges with other settings" in message
    assert "PreTrainedTokenizerFast(tokenizer_file=PATH)" in message

    def both(data: dict) -> None:
        _reconverted(data)
        data["model"]["byte_fallback"] = not data["model"].get("byte_fallback", False)
        _swap_two_ids(data)

    processor = processor_for(FAMILY, _edited(tmp_path, tokenizer_path, "both", both))
    with pytest.raises(SettingsMismatch) as err:
        check_processor_tokenizer(processor, _recorded(prep_file))
    message = str(err.value)
    assert message.index("model['vocab']") < message.index("byte_fallback")
    assert message.index("byte_fallback") < message.index("ignore_merges")
    assert "Another vocabulary or merges" in message
    # the evidence: a probe text whose ids differ, at the first token that differs
    assert re.search(r"the ids from token \d+ are \[\d+.*\] \(processor\) vs \[\d+", message)


def test_a_tokenizer_that_only_spells_none_otherwise_is_the_same(tmp_path, tokenizer_path):
    from trainer_adapter.hf.tokenizer_check import check_processor_tokenizer

    def spelled(data: dict) -> None:
        model = data["model"]
        for key in ("continuing_subword_prefix", "end_of_word_suffix"):
            model[key] = "" if model.get(key) is None else None

    prep_file = make_model_dir(tmp_path / "prep", FAMILY, tokenizer_path) / "tokenizer.json"
    processor = processor_for(FAMILY, _edited(tmp_path, tokenizer_path, "spelled", spelled))
    check_processor_tokenizer(processor, _recorded(prep_file))  # no difference
