"""Consumers built from the generation (issue 38): the collator takes the tokenizer, template and
vision policy prep recorded, refuses a different one at construction naming both, and checks
every sample's lengths against prep's costs unless told not to."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from shards import GroupDataset, RankInfo, open_generation
from shards.read.collate import Collator
from shards.read.prep_settings import PrepSettings, SettingsMismatch


def _samples(generation):
    return next(iter(GroupDataset(generation, RankInfo(rank=0, world_size=4))))["samples"]


def test_from_generation_rebuilds_the_lengths_prep_counted(generation):
    """The anchor is prep's own cost table: every sample's collated LLM and encoder lengths
    equal what prep wrote in its costs (meta['cost'])."""
    m = open_generation(generation)
    col = Collator.from_generation(m)
    assert col.vision_policy == m.raw["prep"]["vision_policy"]["spec"]
    samples = _samples(generation)
    batch = col(samples)
    for s, llm, vit in zip(samples, batch["llm_lens"], batch["vit_lens"], strict=True):
        assert (int(llm), int(vit)) == (s.meta["cost"]["llm_tokens"], s.meta["cost"]["vit_tokens"])


def test_the_same_settings_spelled_otherwise_are_accepted(generation, gen_inputs):
    demo, _, _ = gen_inputs
    copy = demo.parent / "copied-tokenizer"
    copy.mkdir(exist_ok=True)
    shutil.copy(demo / "tokenizer.json", copy / "tokenizer.json")
    col = Collator.from_generation(
        generation,
        tokenizer=str(copy),  # a model directory holding the same bytes
        template="chatml",
        vision_policy="internvl:max_tiles=12",  # the default, written out
    )
    assert col.tokenizer == str(copy / "tokenizer.json")


@pytest.mark.parametrize(
    ("setting", "value", "named"),
    [
        ("vision_policy", "internvl:max_tiles=4", "max_tiles"),
        ("vision_policy", "qwen2vl", "differing: the family, Qwen2VLPolicy vs InternVLPolicy"),
        ("template", "vicuna", "'chatml'"),
    ],
)
def test_a_different_setting_is_refused_at_construction_naming_both(
    generation, setting, value, named
):
    with pytest.raises(SettingsMismatch) as err:
        Collator.from_generation(generation, **{setting: value})
    assert value in str(err.value) and named in str(err.value)


def test_a_different_tokenizer_is_refused(generation, tmp_path):
    m = open_generation(generation)
    tok = json.loads(Path(m.raw["prep"]["tokenizer"]["path"]).read_text())
    tok["added_tokens"] = tok.get("added_tokens", [])[:-1]
    other = tmp_path / "other.json"
    other.write_text(json.dumps(tok))
    with pytest.raises(SettingsMismatch, match="not the one the generation was measured with"):
        Collator.from_generation(m, tokenizer=str(other))


def test_a_collator_with_other_settings_fails_at_the_first_sample_unless_told(generation):
    """The silent mismatch of the issue: a plain Collator with another policy used to collate
    other lengths than the plan balanced without a word."""
    m = open_generation(generation)
    tok = m.raw["prep"]["tokenizer"]["path"]
    samples = _samples(generation)
    assert any(s.images for s in samples)
    with pytest.raises(ValueError, match="prep counted"):
        Collator(tokenizer=tok, vision_policy="fixed:56/14")(samples)
    Collator(tokenizer=tok, vision_policy="fixed:56/14", check_costs=False)(samples)


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("tokenizer", "sha256"), "zz", "sha256 hex digest"),
        # no digest: any tokenizer file would pass as the one prep counted with
        (("tokenizer", "sha256"), None, "sha256 hex digest"),
        (("tokenizer", "mode"), "magic", "tokenizer mode"),
        (("vision_policy", "spec"), 7, "non-empty string"),
        (("template", "name"), "", "non-empty string"),
        # a NUL would cut the name where a C library reads it; a megabyte is no name
        (("template", "name"), "chatml\x00", "non-empty string"),
        (("vision_policy", "spec"), "internvl" + " " * 5000, "non-empty string"),
        (("template",), ["chatml"], "must be objects"),
    ],
)
def test_hostile_recorded_settings_are_refused_where_they_enter(generation, path, value, message):
    m = open_generation(generation)
    raw = json.loads(json.dumps(m.raw))
    node = raw["prep"]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    bad = type(m)(**{**{f: getattr(m, f) for f in m.__dataclass_fields__}, "raw": raw})
    with pytest.raises(ValueError, match=message):
        PrepSettings.from_manifest(bad)


@pytest.mark.parametrize("ratio", [0, -4.0, float("inf"), True, "4", None])
def test_a_hostile_recorded_estimate_is_refused(generation, ratio):
    """An estimate-mode generation's chars_per_token must be a number > 0: 0 would count every
    sample's text as infinite (or, as a flag, 1 char a token)."""
    m = open_generation(generation)
    raw = json.loads(json.dumps(m.raw))
    raw["prep"]["tokenizer"] = {"mode": "estimate", "chars_per_token": ratio}
    bad = type(m)(**{**{f: getattr(m, f) for f in m.__dataclass_fields__}, "raw": raw})
    with pytest.raises(ValueError, match="chars_per_token must be a number > 0"):
        PrepSettings.from_manifest(bad)
    raw["prep"]["tokenizer"]["chars_per_token"] = 3.5
    assert PrepSettings.from_manifest(bad).tokenizer_estimate == 3.5


def test_a_generation_without_prep_settings_says_what_to_give(generation):
    m = open_generation(generation)
    bare = type(m)(**{**{f: getattr(m, f) for f in m.__dataclass_fields__}, "raw": {}})
    with pytest.raises(ValueError, match="records no prep settings"):
        Collator.from_generation(bare)
