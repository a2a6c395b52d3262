"""prep checks its template, vision policy and tokenizer against each other before measuring.

Anchors: the pairs of the exact-count tests (``test_jinja_template.FAMILIES``: each family's
template with the policy whose counts equal transformers' processor) must all pass; a template
of one family with another family's policy is refused naming both; a tokenizer of another model
(the demo tokenizer under Qwen's template, which it splits ``<|image_pad|>`` for) and a forgotten
``--template`` beside a tokenizer that ships one are warned about in the summary and ``--json``.

Planted bugs this catches: the family check dropped or inverted, a template's special tokens not
checked against the tokenizer, the shipped-template warning missing, the summary not echoing
the settings."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from dataprep.setting_checks import POLICY_TEMPLATE_FAMILIES, check_settings
from tests.dataprep.helpers import run, write_jsonl
from tests.dataprep.test_jinja_template import FAMILIES, TEMPLATES, make_model_dir, template_spec

pytest.importorskip("transformers")


def _records():
    return [{"id": "a", "conversations": [{"from": "human", "value": "hi"},
                                           {"from": "gpt", "value": "hello there"}]}]  # fmt: skip


def test_every_family_of_the_exact_count_tests_passes_with_its_policy(tmp_path, tokenizer_path):
    for family, spec in FAMILIES.items():
        model = make_model_dir(tmp_path, family, tokenizer_path)
        warned = check_settings(
            template_spec(model, family), spec["policy"], str(model / "tokenizer.json")
        )
        assert warned == [], (family, warned)
    assert {p.partition(":")[0] for p in (s["policy"] for s in FAMILIES.values())} <= set(
        POLICY_TEMPLATE_FAMILIES
    )


@pytest.mark.parametrize(
    "family,policy", [("qwen2vl", "internvl"), ("internvl", "qwen2vl"), ("llava", "gemma3")]
)
def test_a_template_and_a_policy_of_different_models_are_refused_before_measuring(
    family, policy, tmp_path, tokenizer_path
):
    model = make_model_dir(tmp_path, family, tokenizer_path)
    src = write_jsonl(tmp_path / "d.jsonl", _records())
    with pytest.raises(
        ValueError, match=rf"{family} family's image marker.*vision policy {policy}"
    ):
        run(
            tmp_path,
            [src],
            str(model / "tokenizer.json"),
            template=str(model),
            vision_policy=policy,
        )
    assert not (tmp_path / "out" / "cost.parquet").exists()  # nothing measured or written


def test_a_tokenizer_without_the_templates_tokens_and_a_forgotten_template_are_warned(
    tmp_path, tokenizer_path
):
    model = make_model_dir(tmp_path, "qwen2vl", tokenizer_path)
    src = write_jsonl(tmp_path / "d.jsonl", _records())
    # the demo tokenizer lacks Qwen's special tokens
    res, rows, _ = run(tmp_path / "a", [src], tokenizer_path, template=str(model),
                       vision_policy="qwen2vl")  # fmt: skip
    assert rows and any("'<|image_pad|>'" in w for w in res.warnings), res.warnings
    assert any("'<|vision_start|>'" in w for w in res.warnings)
    assert not any("'<|im_start|>'" in w for w in res.warnings)  # the demo tokenizer has it
    # the model's own tokenizer, no --template: its folder ships the template
    res, _, _ = run(tmp_path / "b", [src], str(model / "tokenizer.json"), vision_policy="qwen2vl")
    assert len(res.warnings) == 1 and "no --template given" in res.warnings[0]
    assert str(model) in res.warnings[0] and "chatml" in res.warnings[0]
    # both given right: nothing to say, and the summary names what was used
    res, _, _ = run(tmp_path / "c", [src], str(model / "tokenizer.json"), template=str(model),
                    vision_policy="qwen2vl")  # fmt: skip
    assert res.warnings == []
    assert res.settings["vision_policy"].startswith("qwen2vl:")
    assert "images: qwen2vl" in res.settings["template"]
    assert res.settings["tokenizer"] == str(model / "tokenizer.json")


def test_the_cli_summary_and_json_echo_the_settings_and_warnings(tmp_path, tokenizer_path):
    model = make_model_dir(tmp_path, "internvl", tokenizer_path)
    src = write_jsonl(tmp_path / "d.jsonl", _records())
    base = [sys.executable, "-m", "equishard", "prep", str(src), "--tokenizer", tokenizer_path,
            "--template", str(model), "--vision-policy", "internvl", "--no-progress"]  # fmt: skip
    out = subprocess.run([*base, "-o", str(tmp_path / "t.parquet")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert re.search(r"template: +.*internvl-model \(jinja, images: internvl", out.stdout)
    assert re.search(r"vision policy: +internvl:", out.stdout)
    assert "warning:" in out.stdout and "'<IMG_CONTEXT>'" in out.stdout
    got = subprocess.run([*base, "-o", str(tmp_path / "j.parquet"), "--json"], capture_output=True,
                         text=True)  # fmt: skip
    data = json.loads(got.stdout)
    assert data["settings"]["tokenizer"] == tokenizer_path and data["warnings"]


def test_shipped_templates_are_all_checked_for_their_tokens():
    """Every shipped template names its image marker (an audio-only family's: its recording
    marker) and its video and recording markers among the tokens it writes."""
    from dataprep.chat_template import load_template
    from dataprep.families.registry import MEDIA_TOKENS
    from dataprep.setting_checks import _template_tokens

    for path in sorted(TEMPLATES.glob("*.jinja")):
        named = "#images=janus" if path.stem in ("janus", "deepseek_vl") else ""
        t = load_template(f"{path}{named}")
        media = [m.marker for m in MEDIA_TOKENS.get(t.family, {}).values() if m.marker in t.source]
        assert t.images is not None or media, path.name
        for marker in ([t.images.marker] if t.images is not None else []) + media:
            assert marker in _template_tokens(t), (path.name, marker)


def test_the_collator_refuses_a_template_of_another_family_at_construction(
    tmp_path, tokenizer_path
):
    from shards.read.collate import Collator

    model = make_model_dir(tmp_path, "qwen2vl", tokenizer_path)
    tok = str(model / "tokenizer.json")
    with pytest.raises(ValueError, match=r"qwen2vl family's image marker.*vision policy internvl"):
        Collator(tokenizer=tok, template=str(model), vision_policy="internvl")
    Collator(tokenizer=tok, template=str(model), vision_policy="qwen2vl")


def test_tokenizer_takes_a_model_directory_as_template_does(tmp_path, tokenizer_path):
    model = make_model_dir(tmp_path, "qwen2vl", tokenizer_path)
    src = write_jsonl(tmp_path / "d.jsonl", _records())
    by_dir, rows_dir, _ = run(tmp_path / "a", [src], str(model), template=str(model),
                              vision_policy="qwen2vl")  # fmt: skip
    _, rows_file, _ = run(tmp_path / "b", [src], str(model / "tokenizer.json"),
                                template=str(model), vision_policy="qwen2vl")  # fmt: skip
    assert by_dir.warnings == [] and rows_dir == rows_file
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"has no tokenizer\.json"):
        run(tmp_path / "c", [src], str(empty))


@pytest.mark.parametrize(
    "template, video, audio, refused",
    [
        # a rule a family names as its processor's, beside another family's template
        ("qwen2_5_omni", "qwen3vl", None, "video-rule qwen3vl measures the qwen3vl processor"),
        ("qwen2_5_omni", "internvl", None, "video-rule internvl measures the internvl process"),
        ("qwen2_audio", None, "gemma4", "audio-rule gemma4 measures the gemma4 processor"),
        ("qwen2_5_omni", None, "gemma4", "template .* is the qwen2_5_omni family's"),
        # a family that names its own rules, given another (Gemma 4's recordings as Whisper's)
        ("gemma4", None, "qwen2audio", r"Whisper-style.*gemma4 family's \(its audio rules: gemma4"),
        ("gemma4", "qwen2vl", None, "its video rules: gemma4"),
        # Audio Flamingo 3's windows, and one window for it (a long recording counted as cut)
        ("qwen2_audio", None, "audioflamingo3", "measures the audioflamingo3 processor"),
        ("qwen2_audio", None, "whisper-windows", "measures the audioflamingo3 processor"),
        ("qwen2_5_omni", None, "audioflamingo3", "measures the audioflamingo3 processor"),
        ("audioflamingo3", None, "qwen2audio", r"its audio rules: audioflamingo3, whisper-w"),
        ("audioflamingo3", None, "whisper:chunk_length=30", r"its audio rules: audioflamingo3"),
        ("audioflamingo3", None, "audioflamingo3", None),
        ("audioflamingo3", None, "whisper-windows:max_windows=4", None),
        # each model's own: accepted
        ("qwen2_5_omni", None, "qwen2_5_omni", None),
        ("qwen2_5_omni", "qwen2vl", None, None),  # its video processor is Qwen2-VL's
        ("qwen2_audio", None, "qwen2audio", None),
        ("qwen2_audio", None, "whisper:chunk_length=30,n_window=0", None),
        ("gemma4", "gemma4", "gemma4", None),
        ("qwen2vl", "qwen2vl", None, None),
        ("qwen2vl", "qwen3vl", None, None),  # Qwen3-VL writes Qwen2-VL's markers
        ("internvl", "internvl", None, None),
    ],
)
def test_a_media_rule_of_another_model_than_the_template_is_refused(
    template, video, audio, refused
):
    """One prep measures one model's inputs: a video or audio rule is refused beside the
    template of a model whose processor it is not, before anything is measured. Bug caught:
    Qwen2.5-Omni's template with Qwen2-VL's video rule (counted as Qwen2-VL's video tokens, a
    video its processor makes otherwise), Qwen2-Audio's with Gemma 4's audio rule."""
    from dataprep.chat_template import load_template
    from dataprep.setting_checks import check_rules

    spec = str(TEMPLATES / f"{template}.jinja")
    t = load_template(spec)
    rules = {"video": video, "audio": audio}
    if refused is None:
        check_rules(t, spec, rules)
        return
    with pytest.raises(ValueError, match=refused):
        check_rules(t, spec, rules)
