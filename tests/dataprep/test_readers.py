"""Every reader on tiny real inputs made in tmp_path, through the prep stage."""

import json
import re
import tarfile

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import image_bytes, write_image
from tests.dataprep.helpers import add_member, llava, run, write_jsonl


def test_llava_json_list_with_string_and_list_images(tmp_path, tokenizer_path):
    write_image(tmp_path / "img" / "a.jpg", 448, 448)
    write_image(tmp_path / "img" / "b.png", 896, 448, "PNG")
    recs = [
        llava("s0", "a.jpg", question="<image>\nWhat is this?"),
        llava("s1", ["a.jpg", "b.png"], question="<image> and <image>: compare."),
        llava("s2"),  # text-only
        llava("s3", "b.png"),  # no placeholder: one is prepended
    ]
    (tmp_path / "d.json").write_text(json.dumps(recs))
    _res, rows, errors = run(
        tmp_path, [tmp_path / "d.json"], tokenizer_path, image_root=str(tmp_path / "img")
    )
    assert errors == [] and [r["sample_id"] for r in rows] == ["s0", "s1", "s2", "s3"]
    by = {r["sample_id"]: r for r in rows}
    assert by["s0"]["vit_seq_lens"] == [1024] and by["s0"]["num_images"] == 1
    assert by["s1"]["vit_tokens"] == 1024 + 3 * 1024 and by["s1"]["modality"] == "multi-image"
    assert by["s2"]["vit_tokens"] == 0 and by["s2"]["llm_tokens"] == by["s2"]["text_tokens"]
    assert by["s3"]["llm_tokens"] == by["s3"]["text_tokens"] + 3 * 256
    assert by["s1"]["image_widths"] == [448, 896] and by["s1"]["location"].endswith("d.json#1")


def test_a_null_image_field_gives_way_to_the_images_field(tmp_path, tokenizer_path):
    """Records exported from a table with both an ``image`` and an ``images`` column carry a
    null in the one they do not use: the images are in the other, and a null ``image`` must
    not hide them (a sample measured as text-only, its images never shipped)."""
    write_image(tmp_path / "a.jpg", 448, 448)
    write_image(tmp_path / "b.png", 896, 448, "PNG")
    recs = [
        {
            **llava("two", question="<image> and <image>?"),
            "image": None,
            "images": ["a.jpg", "b.png"],
        },
        {**llava("one"), "images": None, "image": "a.jpg"},
        {**llava("none"), "image": None, "images": None},
    ]
    _res, rows, errors = run(tmp_path, [write_jsonl(tmp_path / "d.jsonl", recs)], tokenizer_path)
    assert errors == []
    by = {r["sample_id"]: r for r in rows}
    assert by["two"]["num_images"] == 2 and by["two"]["image_widths"] == [448, 896]
    assert by["one"]["num_images"] == 1 and by["none"]["num_images"] == 0


def test_jsonl_malformed_line_reports_line_number(tmp_path, tokenizer_path):
    path = tmp_path / "d.jsonl"
    path.write_text(
        json.dumps(llava("a")) + "\n\n" + '{"id": "b", "conv' + "\n" + json.dumps(llava("c")) + "\n"
    )
    _res, rows, errors = run(tmp_path, [path], tokenizer_path)
    assert [r["sample_id"] for r in rows] == ["a", "c"]
    assert len(errors) == 1 and errors[0]["reason"] == "malformed_json" and errors[0]["line"] == 3
    assert "line 3" in errors[0]["detail"] and "d.jsonl" in errors[0]["detail"]


def test_chat_messages_with_content_parts(tmp_path, tokenizer_path):
    write_image(tmp_path / "x.jpg", 800, 600)
    rec = {
        "id": "m1",
        "images": ["x.jpg"],
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image"}, {"type": "text", "text": "Describe it."}],
            },
            {"role": "assistant", "content": "A wide blue field."},
        ],
    }
    _res, rows, errors = run(tmp_path, [write_jsonl(tmp_path / "m.jsonl", [rec])], tokenizer_path)
    assert errors == [] and rows[0]["vit_tokens"] == 13 * 1024


def test_parquet_with_image_bytes_and_paths(tmp_path, tokenizer_path):
    write_image(tmp_path / "p.png", 448, 448, "PNG")
    conv = [{"from": "human", "value": "<image>\nhi"}, {"from": "gpt", "value": "hello there"}]
    table = pa.table(
        {
            "id": ["p0", "p1"],
            "image": [image_bytes(896, 448), None],
            "conversations": [
                conv,
                [{"from": "human", "value": "text only"}, {"from": "gpt", "value": "ok"}],
            ],
        }
    )
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=1)
    paths = pa.table({"id": ["q0"], "images": [["p.png"]], "conversations": [conv]})
    pq.write_table(paths, tmp_path / "b.parquet")
    _res, rows, errors = run(
        tmp_path, [tmp_path / "a.parquet", tmp_path / "b.parquet"], tokenizer_path
    )
    assert errors == []
    assert [(r["sample_id"], r["vit_tokens"]) for r in rows] == [
        ("p0", 3 * 1024),
        ("p1", 0),
        ("q0", 1024),
    ]


def test_parquet_custom_columns(tmp_path, tokenizer_path):
    table = pa.table({"key": ["c0"], "jpg": [image_bytes(448, 448)], "caption": ["a caption here"]})
    pq.write_table(table, tmp_path / "c.parquet")
    _res, rows, errors = run(
        tmp_path, [tmp_path / "c.parquet"], tokenizer_path, text_column="caption"
    )
    assert errors == [] and rows[0]["num_images"] == 1 and rows[0]["sample_id"] == "c:0"


def test_hf_dataset_dict_saved_to_disk_reads_images_without_decoding(tmp_path, tokenizer_path):
    feats = datasets.Features(
        {
            "id": datasets.Value("string"),
            "image": datasets.Image(),
            "conversations": [
                {"from": datasets.Value("string"), "value": datasets.Value("string")}
            ],
        }
    )
    conv = [{"from": "human", "value": "<image>\nq"}, {"from": "gpt", "value": "a"}]
    rows = {
        "id": ["h0", "h1"],
        "image": [{"bytes": image_bytes(448, 448), "path": None}] * 2,
        "conversations": [conv, conv],
    }
    ds = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict(rows, features=feats),
            "test": datasets.Dataset.from_dict(
                {k: v[:1] for k, v in rows.items()} | {"id": ["t0"]}, features=feats
            ),
        }
    )
    ds.save_to_disk(str(tmp_path / "hf"))
    _res, out, errors = run(tmp_path, [tmp_path / "hf"], tokenizer_path)
    assert errors == [] and [r["sample_id"] for r in out] == ["t0", "h0", "h1"]
    assert {r["source"] for r in out} == {"hf/train", "hf/test"}
    assert all(r["vit_tokens"] == 1024 for r in out)
    # the dataset saved again at the same path, in the same process: read as it is now (the
    # loaded dataset was cached by path alone, and the old one's rows were measured again)
    import shutil

    shutil.rmtree(tmp_path / "hf")
    datasets.DatasetDict({"train": ds["train"].select([1])}).save_to_disk(str(tmp_path / "hf"))
    _res, out, errors = run(tmp_path, [tmp_path / "hf"], tokenizer_path)
    assert errors == [] and [r["sample_id"] for r in out] == ["h1"]


def _conv_json(sample_id=None, n_images=1):
    rec = {
        "conversations": [
            {"from": "human", "value": "<image>" * n_images + "q"},
            {"from": "gpt", "value": "a"},
        ]
    }
    if sample_id:
        rec["id"] = sample_id
    return json.dumps(rec).encode()


def test_webdataset_tar(tmp_path, tokenizer_path):
    with tarfile.open(tmp_path / "s.tar", "w") as tf:
        add_member(tf, "k0.json", _conv_json())
        add_member(tf, "k0.jpg", image_bytes(448, 448))
        add_member(tf, "dir/k1.json", _conv_json("given-id", 2))
        add_member(tf, "dir/k1.1.png", image_bytes(896, 448, "PNG"))
        add_member(tf, "dir/k1.0.jpg", image_bytes(448, 448))
    _res, rows, errors = run(tmp_path, [tmp_path / "s.tar"], tokenizer_path)
    assert errors == []
    assert [(r["sample_id"], r["vit_seq_lens"]) for r in rows] == [
        ("k0", [1024]),
        ("given-id", [1024] * 4),
    ]
    assert rows[1]["image_widths"] == [448, 896]  # members ordered by their index, not tar order


def test_hostile_tar_members_are_rejected(tmp_path, tokenizer_path):
    with tarfile.open(tmp_path / "h.tar", "w") as tf:
        add_member(tf, "../evil.json", _conv_json(n_images=0))
        add_member(tf, "/abs.json", _conv_json(n_images=0))
        add_member(tf, "ln.json", b"", type=tarfile.SYMTYPE, linkname="/etc/passwd")
        add_member(tf, "hard.json", b"", type=tarfile.LNKTYPE, linkname="ok.json")
        add_member(tf, "dup.json", _conv_json(n_images=0))
        add_member(tf, "dup.json", _conv_json(n_images=0))
        add_member(tf, "ok.json", _conv_json(n_images=0))
        add_member(tf, "nojson.jpg", image_bytes(20, 20))
    _res, rows, errors = run(tmp_path, [tmp_path / "h.tar"], tokenizer_path)
    assert [r["sample_id"] for r in rows] == ["ok"]
    reasons = [e["reason"] for e in errors]
    assert reasons == ["unsafe_member"] * 4 + ["duplicate_member", "missing_text"]


def test_truncated_tar_keeps_complete_samples_and_rejects_the_cut_one(tmp_path, tokenizer_path):
    with tarfile.open(tmp_path / "t.tar", "w") as tf:
        for i in range(3):
            add_member(tf, f"k{i}.json", _conv_json())
            add_member(tf, f"k{i}.jpg", image_bytes(300, 300))
    data = (tmp_path / "t.tar").read_bytes()
    with tarfile.open(tmp_path / "t.tar") as tf:
        cut = tf.getmember("k2.jpg").offset_data + 100
    (tmp_path / "cut.tar").write_bytes(data[:cut])
    _res, rows, errors = run(tmp_path, [tmp_path / "cut.tar"], tokenizer_path)
    assert [r["sample_id"] for r in rows] == ["k0", "k1"]
    assert [e["reason"] for e in errors] == ["truncated_archive"]


@pytest.mark.parametrize(
    "members, why",
    [
        (("k.json", "k.JSON"), r"'k.JSON' and 'k.json' differ only in case"),
        (("k.json", "k.jpg", "k.JPG"), r"'k.JPG' and 'k.jpg' differ only in case"),
        (("k.json", "k.0.jpg", "k.0.png"), r"'k.0.png' and 'k.0.jpg' are both numbered 0 images"),
        (("k.json", "k.jpg", "k.png"), r"'k.png' and 'k.jpg' are both unnumbered images"),
    ],
    ids=["json-case", "image-case", "same-number", "two-unnumbered"],
)
def test_a_member_another_would_shadow_rejects_its_sample(tmp_path, tokenizer_path, members, why):
    """Bug: members are read by lower-case suffix, so ``k.JPG`` beside ``k.jpg`` (or
    ``k.JSON`` beside ``k.json``) dropped one unseen, and two images at one place had no
    order; the sample is rejected naming both members, the other samples are read."""
    with tarfile.open(tmp_path / "s.tar", "w") as tf:
        for name in members:
            data = _conv_json() if name.lower().endswith("json") else image_bytes(64, 48)
            add_member(tf, name, data)
        add_member(tf, "ok.json", _conv_json())
        add_member(tf, "ok.0.jpg", image_bytes(64, 48))
    _res, rows, errors = run(tmp_path, [tmp_path / "s.tar"], tokenizer_path)
    assert [r["sample_id"] for r in rows] == ["ok"]
    assert [e["reason"] for e in errors] == ["duplicate_member"]
    assert re.search(why, errors[0]["detail"]), errors[0]["detail"]


def test_an_upper_case_suffix_picks_the_same_reader(tmp_path, tokenizer_path):
    """Files exported by other tools come as DATA.JSONL or SHARD.TAR: the suffix is read
    case-insensitively, as each reader's own format, not refused as an unknown one."""
    path = tmp_path / "DATA.JSONL"
    path.write_text(json.dumps(llava("a")) + "\n" + json.dumps(llava("b")) + "\n")
    _res, rows, errors = run(tmp_path, [path], tokenizer_path)
    assert [r["sample_id"] for r in rows] == ["a", "b"] and errors == []


def test_a_directory_that_is_not_a_saved_hf_dataset_is_refused_naming_it(tmp_path):
    """A directory is an input only as a saved HF dataset (one of datasets' own marker files:
    ``dataset_info.json``, ``state.json``, ``dataset_dict.json``); a folder of JSONL or Parquet
    files is refused at once, saying to pass its files (bug: any folder went to the HF reader,
    whose error named neither the folder nor the fix). Reference: what ``datasets`` itself
    writes, ``save_to_disk`` of a tiny dataset, is taken."""
    from dataprep.errors import DataprepError
    from dataprep.readers import detect_reader

    folder = tmp_path / "parts"
    folder.mkdir()
    write_jsonl(folder / "a.jsonl", [llava("a", None)])
    with pytest.raises(DataprepError, match="parts: a directory that is not a saved HF dataset"):
        detect_reader(folder)
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"id": ["a"]}).save_to_disk(str(saved))
    assert detect_reader(saved) == "hf"
