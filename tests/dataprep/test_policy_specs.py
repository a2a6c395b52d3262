"""Every setting a vision policy takes survives the spec prep records (rule 2: the generation
describes itself completely). For every family of the registry and every option it accepts, a
policy with that option changed from its default is written with ``spec()`` and parsed back:
it must be the same policy. A consumer that rebuilds the policy from the manifest (the
loader's collator, ``HFPacker.from_generation``, ``equishard train``) otherwise measures with
the default where prep used the user's value.

Planted bug this catches: a ``spec()`` that leaves out an option (Aria's ``tokens`` was left
out when it was added: a generation prepped with 16 tokens a crop read back as 128)."""

from __future__ import annotations

import dataclasses

import pytest

from dataprep.policies import parse_vision_policy
from dataprep.policies.registry import POLICIES

# options a policy reads only under another (its spec leaves them out otherwise): changed with
# that one set, and checked to change no count without it
ONLY_WITH = {
    ("gemma3", "min_crop_size"): {"pan_and_scan": True},
    ("gemma3", "max_crops"): {"pan_and_scan": True},
    ("gemma3", "min_ratio"): {"pan_and_scan": True},
}
SIZES = [(w, h) for w in (8, 300, 901, 1999, 4000) for h in (8, 450, 1200, 3100)]


def _changed(value):
    """Candidate values other than ``value``, likeliest valid first."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [v for v in (value * 2, value + 1, value // 2, 16, 4, 2, 1, 490, 980) if v != value]
    if isinstance(value, float):
        return [v for v in (value + 0.5, value * 2, 1.5, 0.5) if v != value]
    return []


def _options(name: str) -> list[str]:
    fam = POLICIES[name]
    return sorted(fam.ints | fam.flags | fam.floats | set(fam.strings))


@pytest.mark.parametrize(
    ("name", "option"), [(n, o) for n in POLICIES for o in _options(n)], ids=lambda x: str(x)
)
def test_every_option_round_trips_through_the_spec(name, option):
    base = parse_vision_policy(name)
    assert parse_vision_policy(base.spec()) == base
    fam = POLICIES[name]
    if (name, option) in ONLY_WITH:
        for value in _changed(getattr(base, option))[:2]:  # inert without the other option
            inert = dataclasses.replace(base, **{option: value})
            assert all(inert.image_cost(w, h) == base.image_cost(w, h) for w, h in SIZES)
        base = dataclasses.replace(base, **ONLY_WITH[(name, option)])
    if option in fam.strings:  # named choices: each one
        choices = fam.strings[option] or ()
        values = [c for c in choices if c != getattr(base, option)]
    else:
        values = _changed(getattr(base, option))
    tried = 0
    for value in values:
        try:
            policy = dataclasses.replace(base, **{option: value})
        except (ValueError, TypeError):
            continue  # not a valid value for this family
        tried += 1
        back = parse_vision_policy(policy.spec())
        assert back == policy, f"{name}: {option}={value!r} is lost in {policy.spec()!r}"
    if option not in fam.strings or fam.strings[option]:
        assert tried, f"no valid changed value of {option} tried for {name}"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("gemma3:pan_and_scan=1,min_ratio=nan", r"min_ratio takes a finite number"),
        ("gemma3:pan_and_scan=1,min_ratio=inf", r"min_ratio takes a finite number"),
        ("granite-docling:dense_max_scale=nan", r"dense_max_scale takes a finite number"),
        ("gemma3:pan_and_scan=2", r"pan_and_scan is a switch, 0 or 1"),
        ("internvl:thumbnail=7", r"thumbnail is a switch, 0 or 1"),
        ("internvl:max_tiles=6,max_tiles=12", r"option max_tiles is given twice"),
        ("qwen2vl:max_pixels=50176,max_pixels=1003520", r"option max_pixels is given twice"),
    ],
)
def test_a_spec_whose_numbers_would_be_misread_is_refused(spec, message):
    """Bug: ``nan`` or ``inf`` passed as a threshold (every comparison with them is false, so
    Gemma 3's pan-and-scan or Granite Docling's spread rule silently changed), a switch given 2
    read as on, and an option given twice kept its last value unseen."""
    with pytest.raises(ValueError, match=message):
        parse_vision_policy(spec)
    # the well-formed spellings of the same options are taken
    ok = spec.replace("nan", "1.5").replace("inf", "1.5").replace("=2", "=1").replace("=7", "=0")
    if "twice" not in message:
        parse_vision_policy(ok)


# whole-number options where 0 is a setting of its own, not a mistake
ZERO_MEANS = {
    ("aria", "tokens"): "the tokens of the model's own image size",
    ("granite-docling", "dense_max_tiles"): "no dense tiling",
}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_whole_number_option_out_of_range_is_refused_as_a_value_error(name):
    """Rule 1 for a user's numbers: every whole-number option (switches aside) of every family given as -1, 0
    or 2**31 in a spec is refused with a ``ValueError`` (the message the CLI and the manifest
    reader show), except 0 where it is a setting of its own (``ZERO_MEANS``), which must then
    give counts that are whole numbers >= 0. Planted bugs this catches: ``gemma3:llm_tokens=0``
    raised ``ZeroDivisionError`` (the side of a square of 0 tokens divided the patch grid)
    instead of saying what llm_tokens must be; a family's check of one option dropped
    (SmolVLM's ``tokens_per_tile=0`` taken, every image costing no tokens)."""
    fam = POLICIES[name]
    for option in sorted(set(fam.ints) - set(fam.flags)):  # switches: the spec parser's test
        for value in (-1, 0, 2**31):
            spec = f"{name}:{option}={value}"
            if value == 0 and (name, option) in ZERO_MEANS:
                policy = parse_vision_policy(spec)
                for w, h in SIZES:
                    cost = policy.image_cost(w, h)
                    assert cost.llm_tokens >= 0, (spec, w, h, cost)
                    assert all(n >= 0 for n in cost.vit_seq_lens), (spec, w, h, cost)
                continue
            with pytest.raises(ValueError):
                parse_vision_policy(spec)


@pytest.mark.parametrize(
    "field,value,ok",
    [
        ("n", -1, False),
        ("n", 0, True),
        ("n", (1 << 31) - 1, True),  # MAX_OPTION: at the limit
        ("n", 1 << 31, False),
        ("n", True, False),  # a bool is not a count
        ("n", 2.0, False),
        ("flag", True, True),
        ("flag", 1, False),
        ("x", -1e308, True),
        ("x", float("-inf"), False),
        ("x", float("inf"), False),
        ("x", float("nan"), False),
        ("x", True, False),
        ("s", "ok", True),
        ("s", 3, False),
    ],
)
def test_every_option_has_its_declared_type_at_and_around_the_limits(field, value, ok):
    """``check_field_types`` (every policy's and rule's first check): whole numbers in
    0..MAX_OPTION, switches only bools, reals finite and not NaN, strings strings."""
    from dataclasses import dataclass, replace

    from dataprep.policies.base import MAX_OPTION, check_field_types

    assert MAX_OPTION == (1 << 31) - 1

    @dataclass(frozen=True)
    class Rule:
        n: int = 1
        flag: bool = False
        x: float = 0.5
        s: str = "a"

    rule = replace(Rule(), **{field: value})
    if ok:
        check_field_types(rule)
    else:
        with pytest.raises(ValueError, match=f"Rule.{field} "):
            check_field_types(rule)


@pytest.mark.parametrize("lo,hi", [(1, 1), (1, 6), (1, 12), (2, 12), (5, 5), (3, 40)])
def test_tile_grids_are_the_hf_image_processors_in_its_order(lo, hi):
    """Anchor: transformers' GOT-OCR2 image processor (InternVL, Aya Vision) tries the grids
    of lo..hi tiles in this order; the order breaks ties between equally close grids."""
    got = pytest.importorskip("transformers.models.got_ocr2.image_processing_pil_got_ocr2")
    from dataprep.policies.base import tile_grids

    assert list(tile_grids(lo, hi, hi)) == got.get_all_supported_aspect_ratios(lo, hi)
    # a side limit drops the grids with a longer side, keeping the order of the rest
    assert list(tile_grids(lo, hi, 3)) == [
        g for g in got.get_all_supported_aspect_ratios(lo, hi) if max(g) <= 3
    ]


@pytest.mark.parametrize(
    "spec,ok",
    [
        ("fixed:336/14", True),
        ("FIXED: 448/16", False),  # a space in the size is not a digit
        (" Fixed:448/16", True),  # the name is matched in any case, spaces around it dropped
        ("fixed:336", False),
        ("fixed:336/", False),
        ("fixed:/14", False),
        ("fixed:x/14", False),
        ("fixed:336/x", False),
        ("fixed:-336/14", False),
    ],
)
def test_fixed_specs_parse_only_as_size_slash_patch(spec, ok):
    from dataprep.policies import FixedPolicy

    if ok:
        size, patch = spec.split(":")[1].split("/")
        assert parse_vision_policy(spec) == FixedPolicy(image_size=int(size), patch_size=int(patch))
        return
    with pytest.raises(ValueError, match=r"write fixed:SIZE/PATCH, e\.g\. fixed:336/14"):
        parse_vision_policy(spec)


def test_an_unknown_policy_name_lists_every_choice():
    names = list(POLICIES)
    with pytest.raises(ValueError) as e:
        parse_vision_policy("nope:max_tiles=2")
    assert str(e.value) == (
        f"unknown vision policy 'nope:max_tiles=2': choose fixed:S/P, "
        f"{', '.join(names[:-1])} or {names[-1]}"
    )


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_bad_option_names_every_option_the_family_takes(name):
    """The message lists the family's options of every kind (whole numbers, strings, reals),
    and only a Qwen family's adds its resize choices."""
    fam = POLICIES[name]
    allowed = ", ".join(sorted(fam.ints | set(fam.strings) | fam.floats))
    with pytest.raises(ValueError) as e:
        parse_vision_policy(f"{name}:no_such_option=1")
    tail = " (or resize=transformers|qwen-vl-utils)" if name.startswith("qwen") else ""
    assert str(e.value) == (
        f"bad option 'no_such_option=1' in vision policy '{name}:no_such_option=1': use "
        f"KEY=INT with KEY in {allowed}{tail}"
    )


def test_options_of_every_kind_apply_in_any_order():
    """A string or real option does not end the parse: the options after it apply too."""
    p = parse_vision_policy("qwen2vl:resize=qwen-vl-utils,min_pixels=6272,max_pixels=12544")
    assert (p.resize, p.min_pixels, p.max_pixels) == ("qwen-vl-utils", 6272, 12544)
    g = parse_vision_policy("gemma3:min_ratio=1.5,max_crops=3,pan_and_scan=1")
    assert (g.min_ratio, g.max_crops, g.pan_and_scan) == (1.5, 3, True)


@pytest.mark.parametrize("value", ["abc", "nan", "inf", "-inf", ""])
def test_a_real_option_that_is_not_a_finite_number_is_refused(value):
    with pytest.raises(ValueError, match=r"min_ratio takes a finite number, e\.g\. min_ratio=1\.5"):
        parse_vision_policy(f"gemma3:min_ratio={value}")


@pytest.mark.parametrize(
    "kw",
    [
        {"ints": frozenset({"a"}), "floats": frozenset({"a"})},
        {"ints": frozenset({"a"}), "strings": {"a": ()}},
        {"floats": frozenset({"b"}), "strings": {"b": ()}},
        {"flags": frozenset({"c"})},  # a switch is a whole-number option too
    ],
)
def test_an_option_of_two_kinds_is_refused_when_a_family_is_declared(kw):
    """The parser reads an option as the first kind that names it: one kind each, so that the
    kinds' union (the options a message lists) is their disjoint sum."""
    from dataprep.families.spec import PolicySpec
    from dataprep.policies import FixedPolicy

    with pytest.raises(ValueError, match="more than one kind"):
        PolicySpec(cls=FixedPolicy, **kw)
    for fam in POLICIES.values():  # every family as declared: one kind an option
        assert not fam.ints & fam.floats and not (fam.ints | fam.floats) & set(fam.strings)
