"""Text-LLM chat templates (string message content, no image handling): prep renders each
message as one string with the family's image marker written in the text, as a user's training
code does with these templates (InternVL's and LLaVA's own training code among them).

Reference, per template and 200 conversations: transformers' ``apply_chat_template`` over the
string messages (the record's ``<image>`` written as the processor's ``image_token``), then the
real VLM processor's call, which expands each marker over real image files. Templates: a
Qwen2.5-style one with InternVL's processor (InternVL 2.5/3 build on Qwen2.5), a Llama-3-style
and a Mistral-style one with LLaVA's (the shipped files are in ``tests/data/text_templates``).
Text-only data needs no image family at all.

Planted bugs this catches: content passed as a list of parts to a string template (every sample
fails or counts a list's repr), the image marker left as ``<image>`` where the processor expects
another token, the form detected wrongly for a multimodal template, a text-only template refused
for text-only data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dataprep.chat_template import load_template
from tests.dataprep.helpers import run, write_jsonl
from tests.dataprep.test_jinja_template import TEMPLATES, conversations, processor_for

transformers = pytest.importorskip("transformers")

DATA = Path(__file__).resolve().parents[1] / "data" / "text_templates"
N = 200
ROLES = {"human": "user", "gpt": "assistant", "system": "system"}
# template file: (special tokens, tokenizer config, the VLM family whose processor expands images)
TEXT = {
    "qwen2_5": (
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<img>", "</img>", "<IMG_CONTEXT>",
         "<video>"],
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
         "extra_special_tokens": {"start_image_token": "<img>", "end_image_token": "</img>",
                                  "context_image_token": "<IMG_CONTEXT>", "video_token": "<video>"}},
        "internvl",
    ),
    "llama3": (
        ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<image>"],
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
        "llava",
    ),
    "mistral": (
        ["<s>", "</s>", "[INST]", "[/INST]", "<image>"],
        {"bos_token": "<s>", "eos_token": "</s>"},
        "llava",
    ),
}  # fmt: skip
POLICY = {"internvl": "internvl", "llava": "fixed:336/14"}


def _model_dir(root: Path, name: str, tokenizer_path: str) -> Path:
    from tokenizers import AddedToken, Tokenizer

    specials, config, _ = TEXT[name]
    model = root / f"{name}-model"
    model.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer.from_file(tokenizer_path)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tok.save(str(model / "tokenizer.json"))
    config = {"chat_template": (DATA / f"{name}.jinja").read_text(), "model_max_length": 10**6,
              **config}  # fmt: skip
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    return model


def _records(root: Path, name: str, seed: int) -> list[dict]:
    records = conversations(root, N, seed)
    for i, rec in enumerate(records):
        if name == "mistral":  # its template refuses a system turn (roles must alternate)
            rec["conversations"] = [t for t in rec["conversations"] if t["from"] != "system"]
        if i % 4 == 0:  # text-only samples among them
            rec["image"] = []
            for t in rec["conversations"]:
                t["value"] = t["value"].replace("<image>", "")
    return records


def _reference(processor, record: dict, root: Path) -> int:
    from transformers.image_utils import load_image

    messages = [
        {"role": ROLES[t["from"]], "content": t["value"].replace("<image>", processor.image_token)}
        for t in record["conversations"]
    ]
    text = processor.tokenizer.apply_chat_template(messages, tokenize=False)
    images = [load_image(str(root / name)) for name in record["image"]] or None
    # pixels unscaled and unnormalized: the length depends on the resized sizes only
    pixels = {"do_rescale": False, "do_normalize": False} if images else {}
    out = processor(text=[text], images=images, return_tensors="np", **pixels)
    return int(out["input_ids"].shape[1])


@pytest.mark.parametrize("name", list(TEXT))
def test_counts_equal_apply_chat_template_on_strings_and_the_processor(
    name, tmp_path, tokenizer_path
):
    family = TEXT[name][2]
    model = _model_dir(tmp_path, name, tokenizer_path)
    template = load_template(f"{model}#images={family}")
    assert template.content == "string" and template.family == family
    records = _records(tmp_path, name, seed=list(TEXT).index(name))
    src = write_jsonl(tmp_path / "data.jsonl", records)
    res, rows, errors = run(
        tmp_path, [src], str(model / "tokenizer.json"), template=f"{model}#images={family}",
        vision_policy=POLICY[family],
    )  # fmt: skip
    assert not errors, [(e["reason"], e["detail"]) for e in errors[:3]]
    assert res.n_written == N
    processor = processor_for(family, model)
    by_id = {r["sample_id"]: r for r in rows}
    wrong = [
        (rec["id"], by_id[rec["id"]]["llm_tokens"], want)
        for rec in records
        if by_id[rec["id"]]["llm_tokens"] != (want := _reference(processor, rec, tmp_path))
    ]
    assert not wrong, f"{len(wrong)} of {N} differ, e.g. {wrong[:3]}"
    assert sum(not r["image"] for r in records) >= N // 5  # text-only samples tried
    assert sum(len(r["image"]) > 1 for r in records) > N // 10  # and multi-image ones


def test_text_only_data_needs_no_image_family(tmp_path, tokenizer_path):
    """The template alone (no ``#images=``): text-only samples count as apply_chat_template
    does; a sample with an image is refused with the fix, the others still written."""
    from transformers import AutoTokenizer

    model = _model_dir(tmp_path, "llama3", tokenizer_path)
    records = _records(tmp_path, "llama3", seed=7)
    src = write_jsonl(tmp_path / "data.jsonl", records)
    _, rows, errors = run(tmp_path, [src], str(model / "tokenizer.json"), template=str(model))
    with_images = {r["id"] for r in records if r["image"]}
    assert {e["sample_id"] for e in errors} == with_images
    assert {e["reason"] for e in errors} == {"template_no_image_family"}
    tok = AutoTokenizer.from_pretrained(str(model))
    by_id = {r["id"]: r for r in records}
    assert len(rows) == N - len(with_images) > 0
    for row in rows:
        turns = by_id[row["sample_id"]]["conversations"]
        msgs = [{"role": ROLES[t["from"]], "content": t["value"]} for t in turns]
        out = tok.apply_chat_template(msgs, tokenize=True)
        ids = out["input_ids"] if hasattr(out, "keys") else out
        assert row["llm_tokens"] == len(ids), row["sample_id"]


def test_the_content_form_is_detected_by_rendering(tmp_path):
    """Every shipped multimodal template takes parts; the text templates take strings;
    ``#content=`` overrides."""
    for path in sorted(TEMPLATES.glob("*.jinja")):
        named = "#images=janus" if path.stem in ("janus", "deepseek_vl") else ""
        assert load_template(f"{path}{named}").content == "parts", path.name
    for name in TEXT:
        assert load_template(str(DATA / f"{name}.jinja")).content == "string", name
    forced = load_template(f"{DATA / 'llama3.jinja'}#content=parts")
    assert forced.content == "parts"


@pytest.mark.parametrize(
    "fields",
    [
        {"bos": 5},
        {"suffix": None},
        {"system_prompt": ["hi"]},
        {"prefix": {"system": "S", "user": 1, "assistant": "A"}},
        {"prefix": "SUA"},
        {"image_prefix": {"a": 1}},
    ],
)
def test_a_json_template_with_fields_that_are_not_text_is_refused(tmp_path, fields):
    """A template file is outside data: a field that is not text failed every sample at render
    time (prep rejected all of them, a TypeError per sample) instead of the template at load.
    Refused where it is loaded, naming the field."""
    base = {"prefix": {"system": "S", "user": "U", "assistant": "A"}}
    path = tmp_path / "t.json"
    path.write_text(json.dumps({**base, **fields}))
    with pytest.raises(ValueError, match=rf"\[{'|'.join(repr(k) for k in fields)}\] must be text"):
        load_template(str(path))
    path.write_text(json.dumps(base))
    assert load_template(str(path)).render([("user", "hi")]) == "Uhi"  # the same, all text
