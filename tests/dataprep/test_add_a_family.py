"""Adding a model family is one module and one registry line.

A toy family, written here into a temporary module (its vision policy, its image marker, its
processor checks, its packer rules), is registered by one entry beside the registry's modules;
then prep counts its samples, ``prep --help`` lists its policy, a template writing its marker is
told apart from the other families', and the Hugging Face packer builds its rows. Anchored to
an independent reference: a real ``transformers`` LLaVA processor told to use the toy's marker
and image size makes exactly the token ids the packer makes and prep counts; a processor with
another image size is refused, naming the setting.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from dataprep.families import registry
from dataprep.families.spec import PackerRules
from tests.dataprep.helpers import run, write_jsonl
from tests.dataprep.test_jinja_template import conversations, reference_messages
from tests.trainer_adapter.test_hf_inputs import _samples

transformers = pytest.importorskip("transformers")

TOY_MODULE = '''
"""A toy family: every image resized to SIDE x SIDE, one token a patch, <toy_image> markers."""

from dataclasses import dataclass

from dataprep.families.processor_settings import image_setting, llava_tokens
from dataprep.families.spec import FamilySpec, ImageTokens, PackerRules, policy
from dataprep.policies.base import ImageCost, VisionPolicy


@dataclass(frozen=True, kw_only=True)
class ToyPolicy(VisionPolicy):
    side: int = 224
    patch_size: int = 14

    def image_cost(self, width, height):
        n = (self.side // self.patch_size) ** 2
        return ImageCost((n,), n)

    def spec(self):
        return f"toy:side={self.side},patch_size={self.patch_size}"


SPEC = FamilySpec(
    name="toyvlm",
    models="a toy model",
    policies=("toy",),
    policy_specs={
        "toy": policy(ToyPolicy, ("side", "patch_size"), help="a toy: every image SIDE x SIDE")
    },
    template="toyvlm",
    image_tokens=ImageTokens("<toy_image>"),
    processor_checks=(
        ("side", image_setting("crop_size", "height")),
        (
            "tokens per image",
            lambda pk: llava_tokens(pk, image_setting("crop_size", "height")(pk)),
            lambda p: (p.side // p.patch_size) ** 2,
        ),
    ),
    packer=PackerRules(),
)
'''


@pytest.fixture
def toy_family(tmp_path, monkeypatch):
    """The toy module, registered by one line beside the registry's own."""
    (tmp_path / "toyvlm_family.py").write_text(textwrap.dedent(TOY_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.load((*registry.FAMILY_MODULES, "toyvlm_family"))
    yield registry.FAMILIES["toyvlm"]
    registry.load()


def _model_dir(root, tokenizer_path):
    """A checkpoint-like directory for the toy: LLaVA's template writing <toy_image>."""
    from pathlib import Path

    from tokenizers import AddedToken, Tokenizer

    model = root / "toy-model"
    model.mkdir()
    tok = Tokenizer.from_file(tokenizer_path)
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in ("<s>", "</s>", "<toy_image>")]
    )
    tok.save(str(model / "tokenizer.json"))
    llava = Path(__file__).resolve().parents[2] / "examples" / "chat_templates" / "llava.jinja"
    template = llava.read_text().replace("<image>", "<toy_image>")
    config = {"chat_template": template, "bos_token": "<s>", "eos_token": "</s>"}
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    return model


def _processor(model, side: int):
    """transformers' LLaVA processor with the toy's marker and image size (a CLS-free tower)."""
    from transformers import AutoTokenizer, CLIPImageProcessor, LlavaProcessor

    tok = AutoTokenizer.from_pretrained(str(model))
    ip = CLIPImageProcessor(size={"shortest_edge": side}, crop_size={"height": side, "width": side})
    return LlavaProcessor(
        image_processor=ip,
        tokenizer=tok,
        patch_size=14,
        vision_feature_select_strategy="full",
        num_additional_image_tokens=0,
        image_token="<toy_image>",
        chat_template=tok.chat_template,
    )


def test_a_family_in_one_module_is_prepped_checked_and_packed(toy_family, tmp_path, tokenizer_path):
    from dataprep.policies import POLICIES, parse_vision_policy
    from equishard.cli import build_parser
    from trainer_adapter.hf.inputs import HFPacker
    from trainer_adapter.hf.policy_check import check_processor_policy

    assert "toy" in POLICIES and parse_vision_policy("toy:side=224").spec().startswith("toy:")
    # the tables every stage reads are derived from the spec
    assert registry.IMAGE_TOKENS["toyvlm"].marker == "<toy_image>"
    assert registry.POLICY_TEMPLATE_FAMILIES["toy"] == ("toyvlm",)
    assert registry.FAMILY_POLICIES["toyvlm"] == ("toy",)
    sub = next(a for a in build_parser()._actions if hasattr(a, "choices") and a.choices)
    assert "a toy: every image SIDE x SIDE" in sub.choices["prep"].format_help()

    model = _model_dir(tmp_path, tokenizer_path)
    records = conversations(tmp_path, 10, seed=3)
    src = write_jsonl(tmp_path / "data.jsonl", records)
    res, rows, errors = run(
        tmp_path, [src], str(model / "tokenizer.json"), template=str(model), vision_policy="toy"
    )
    assert not errors and res.n_written == len(records)

    processor = _processor(model, 224)
    packer = HFPacker(family="toyvlm", processor=processor, template=str(model))
    check_processor_policy(packer, {"spec": parse_vision_policy("toy").spec()})
    samples = _samples(tmp_path, records)
    by_id = {r["sample_id"]: r for r in rows}
    from transformers.image_utils import load_image

    for rec, sample in zip(records, samples, strict=True):
        part = packer.sample(sample.meta["turns"], list(sample.images))
        text = processor.apply_chat_template(reference_messages(rec), tokenize=False)
        images = [load_image(str(tmp_path / n)) for n in rec["image"]]
        want = processor(text=[text], images=images or None, return_tensors="pt")
        assert part["input_ids"].tolist() == want["input_ids"][0].tolist(), rec["id"]
        assert by_id[rec["id"]]["llm_tokens"] == len(part["input_ids"]), rec["id"]
    assert sum(len(r["image"]) for r in records) > 5  # images were counted, not only text

    other = HFPacker(family="toyvlm", processor=_processor(model, 336), template=str(model))
    from shards.read.prep_settings import SettingsMismatch

    with pytest.raises(SettingsMismatch, match=r"side 336 \(processor\) vs 224 \(prep\)"):
        check_processor_policy(other, {"spec": parse_vision_policy("toy").spec()})


def test_without_its_registry_line_the_family_is_unknown(tmp_path):
    from dataprep.policies import parse_vision_policy

    with pytest.raises(ValueError, match="unknown vision policy 'toy'"):
        parse_vision_policy("toy")
    with pytest.raises(ValueError, match="family must be one of"):
        registry.family_spec("toyvlm")


def test_two_families_that_disagree_are_refused_at_load(tmp_path, monkeypatch):
    """A policy defined twice, or one template family's marker written two ways, is refused
    when the registry loads (not found later as a wrong count)."""
    clash = TOY_MODULE.replace('name="toyvlm"', 'name="toyvlm2"').replace(
        'template="toyvlm"', 'template="llava"'
    )
    (tmp_path / "toy_clash.py").write_text(textwrap.dedent(clash))
    (tmp_path / "toy_twice.py").write_text(textwrap.dedent(TOY_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(ValueError, match="template family llava's marker"):
            registry.load((*registry.FAMILY_MODULES, "toy_clash"))
        with pytest.raises(ValueError, match="registered twice"):
            registry.load((*registry.FAMILY_MODULES, "toy_twice", "toy_twice"))
    finally:
        registry.load()
    assert "toyvlm2" not in registry.FAMILIES


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"video_policies": ("other",)}, "video_policies \\['other'\\] must be among"),
        ({"video_policies": ("a",)}, "beside video rules"),
        ({"video_rules": ("qwen2vl",)}, "no video marker"),
        ({"audio_rules": ("gemma4",)}, "no audio marker"),
    ],
)
def test_a_family_that_names_video_wrongly_is_refused(fields, match):
    """Video policies outside the family's own, or without a video rule, and video or audio
    rules without the template's marker for them: each refused where the family is declared."""
    from dataprep.families.spec import FamilySpec, ImageTokens

    with pytest.raises(ValueError, match=match):
        FamilySpec(
            name="fam",
            models="m",
            policies=("a", "b"),
            template="llava",
            image_tokens=ImageTokens("<image>"),
            **fields,
        )


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"audio": "chunks"}, r"PackerRules.audio must be '', 'packed', 'window' or 'windows'"),
        ({"videos_with_images": True}, r"videos_with_images needs videos=True"),
    ],
)
def test_packer_rules_refuse_what_no_packer_builds(kw, message):
    """A family's packer rules name a form the packer builds, or are refused at import."""
    with pytest.raises(ValueError, match=message):
        PackerRules(**kw)
    assert PackerRules(videos=True, videos_with_images=True).videos_with_images
