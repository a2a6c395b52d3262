"""A tokenizer whose post-processor adds a BOS token (Llama's, Mistral's, Gemma's tokenizer.json
do): the chat template writes every token of a row, so prep counts, the collator and the
Hugging Face packer build and the setting checks read the rendered text without the
post-processor's tokens, as Hugging Face's own chat path does: the peer reference here is
``apply_chat_template(tokenize=True)``, which encodes without them. Before, only tokenizers
without such a post-processor were tested: a count with the BOS added (one token more per
sample than the model sees) passed."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from tests.conftest import bos_post_processor
from tests.dataprep.test_jinja_template import (
    FAMILIES,
    conversations,
    make_model_dir,
    reference_messages,
    template_spec,
)

pytest.importorskip("transformers")

FAMILY = "llava"  # its template writes no BOS: the post-processor's would be one more token


@pytest.fixture()
def bos_model(tmp_path, tokenizer_path):
    """The family's model directory with a post-processor that prepends ``<s>``."""
    model = make_model_dir(tmp_path, FAMILY, tokenizer_path)
    data = json.loads((model / "tokenizer.json").read_text())
    bos = next(t["id"] for t in data["added_tokens"] if t["content"] == "<s>")
    data["post_processor"] = bos_post_processor("<s>", bos)
    (model / "tokenizer.json").write_text(json.dumps(data))
    return model


def _hf_lengths(model, records) -> dict[str, int]:
    """LLM tokens of each record as Hugging Face's chat path makes them: the template's ids,
    each image's placeholder expanded to the fixed policy's 576 tokens."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    assert tok("x")["input_ids"][0] == tok.convert_tokens_to_ids("<s>")  # the BOS is added
    out = {}
    for rec in records:
        ids = tok.apply_chat_template(reference_messages(rec), tokenize=True)["input_ids"]
        out[rec["id"]] = len(ids) + 575 * len(rec["image"])
    return out


def test_prep_and_the_collator_count_what_the_template_writes(bos_model, tmp_path):
    from shards import Collator, GroupDataset, RankInfo
    from tests.dataprep.helpers import run, write_jsonl, write_test_generation

    records = conversations(tmp_path, 24, seed=4)
    src = write_jsonl(tmp_path / "data.jsonl", records)
    run(
        tmp_path,
        [src],
        str(bos_model / "tokenizer.json"),
        template=template_spec(bos_model, FAMILY),
        vision_policy=FAMILIES[FAMILY]["policy"],
    )
    cost = tmp_path / "out" / "cost.parquet"
    table = pq.read_table(cost).to_pydict()
    counted = dict(zip(table["sample_id"], table["llm_tokens"], strict=True))
    assert counted == _hf_lengths(bos_model, records)
    # the collator builds those lengths (it refuses a row of another length than prep's)
    gen = write_test_generation(tmp_path, cost)
    built = {}
    for step in GroupDataset(
        gen, RankInfo(rank=0, world_size=1), transform=Collator.from_generation(gen)
    ):
        s = step["samples"]
        built |= dict(zip(s["sample_ids"], s["llm_lens"].tolist(), strict=True))
    assert built == counted
    # and the Hugging Face packer, from the model's processor (it checks every row's length)
    from tests.dataprep.test_jinja_template import processor_for
    from trainer_adapter.hf.inputs import HFPacker

    packer = HFPacker.from_generation(gen, processor_for(FAMILY, bos_model), family=FAMILY)
    rows = 0
    for step in GroupDataset(gen, RankInfo(rank=0, world_size=1), transform=packer):
        rows += int((step["samples"]["position_ids"][0].reshape(-1) == 0).sum())
    assert rows == len(records)


def test_the_template_check_reads_its_tokens_without_the_post_processor(bos_model):
    """Each token the template writes is one token of the tokenizer: no warning that it is
    split (with the BOS counted, every one would look like two)."""
    from dataprep.setting_checks import check_settings

    tokenizer = str(bos_model / "tokenizer.json")
    assert (
        check_settings(template_spec(bos_model, FAMILY), FAMILIES[FAMILY]["policy"], tokenizer)
        == []
    )
