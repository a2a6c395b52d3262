"""A generation read by the loaders users already have: Megatron-Energon's own loader (after
``write --energon``), Hugging Face ``datasets``' WebDataset builder and webdataset's ``wids``.
The reference for what a generation holds is Python's ``tarfile`` over the manifest's shards."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from PIL import Image, ImageOps

from equishard.cli import main
from shards import open_generation
from shards.nightly.rebalance import run_rebalance
from shards.store.publish import read_current
from shards.write.energon import has_energon_metadata
from tests.shards.night_helpers import _night


def tar_samples(gen) -> dict[str, list[dict]]:
    """Stream name -> its samples in order (record + image sizes as displayed: EXIF
    orientation applied, as prep counts them), read with tarfile."""
    m = open_generation(gen)
    out = {}
    for st in m.streams:
        samples = []
        for shard in st.shards:
            with tarfile.open(m.path / shard.file) as tf:
                for member in tf.getmembers():
                    data = tf.extractfile(member).read()
                    if member.name.endswith(".json"):
                        samples.append({"record": json.loads(data), "sizes": [], "stored": []})
                    else:
                        stored = Image.open(io.BytesIO(data))
                        samples[-1]["stored"].append(stored.size)
                        samples[-1]["sizes"].append(ImageOps.exif_transpose(stored).size)
        out[f"node-{st.node:03d}-rank-{st.local_rank:03d}"] = samples
    return out


@pytest.fixture(scope="module")
def energon_gen(gen_inputs, tmp_path_factory) -> Path:
    _, cost, plan_dir = gen_inputs
    root = tmp_path_factory.mktemp("energon")
    args = ["write", str(plan_dir), "--cost-table", str(cost), "--out", str(root)]
    assert main([*args, "--shard-size", "200KB", "--energon"]) == 0
    return root / read_current(root)


def _energon_read(gen: Path, split: str) -> list:
    from megatron.energon import (
        DefaultTaskEncoder,
        SampleDecoder,
        WorkerConfig,
        get_loader,
        get_val_dataset,
    )

    from shards.write.energon import equishard_cooker

    class Encoder(DefaultTaskEncoder):
        cookers = (equishard_cooker(),)
        decoder = SampleDecoder(image_decode="pil")

        def encode_sample(self, sample):
            return sample

        def batch(self, samples):
            return samples

    ds = get_val_dataset(
        gen,
        split_part=split,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        batch_size=1,
        task_encoder=Encoder(),
    )
    return [s for batch in get_loader(ds) for s in batch]


def test_energon_loader_reads_every_sample(energon_gen):
    pytest.importorskip("megatron.energon")
    assert has_energon_metadata(energon_gen)
    assert (energon_gen / ".nv-meta" / "index.sqlite").is_file()
    assert main(["verify", str(energon_gen)]) == 0  # the extra files do not disturb verify
    want = tar_samples(energon_gen)
    got = _energon_read(energon_gen, "train")
    every = [s for stream in want.values() for s in stream]
    assert sorted(s.record["sample_id"] for s in got) == sorted(
        s["record"]["sample_id"] for s in every
    )
    by_id = {s["record"]["sample_id"]: s for s in every}
    for s in got:
        ref = by_id[s.record["sample_id"]]
        assert s.record == ref["record"]
        # PIL images come turned by the cooker, as prep counted them
        assert [im.size for im in s.images] == ref["sizes"]
        cost = ref["record"]["cost"]
        assert ref["sizes"] == list(zip(cost["image_widths"], cost["image_heights"], strict=True))
    assert any(s["sizes"] != s["stored"] for s in every)  # the demo's photos include turned ones
    # each (node, rank) stream is its own split part, read in the stream's order
    for name, stream in want.items():
        ids = [s.record["sample_id"] for s in _energon_read(energon_gen, name)]
        assert ids == [s["record"]["sample_id"] for s in stream], name


def test_hf_datasets_webdataset_builder_reads_every_sample(generation):
    datasets = pytest.importorskip("datasets")
    from shards.read.hf_datasets import hf_webdataset_kwargs

    want = [s for stream in tar_samples(generation).values() for s in stream]
    ds = datasets.load_dataset("webdataset", **hf_webdataset_kwargs(generation), split="train")
    assert ds.num_rows == len(want)
    image_cols = [c for c in ds.column_names if c not in ("__key__", "__url__", "json")]
    for row, ref in zip(ds, want, strict=True):
        assert row["json"] == ref["record"]
        images = sorted((int(c.split(".")[0]), row[c]) for c in image_cols if row[c] is not None)
        assert [im.size for _, im in images] == ref["sizes"]


def test_wids_reads_every_sample(generation, tmp_path):
    """wids with a cache directory of its own, as its users give one for remote shards: it
    keeps each shard there under its base name. Planted bug this catches: shard names unique
    only inside their stream's folder (``node-000/rank-001/shard-000000.tar``), so every
    stream's first shard was one cache file and wids read rank 0's samples as rank 1's."""
    wids = pytest.importorskip("wids")
    m = open_generation(generation)
    files = [sh.file for st in m.streams for sh in st.shards]
    assert len({Path(f).name for f in files}) == len(files)
    want = [s for stream in tar_samples(generation).values() for s in stream]
    ds = wids.ShardListDataset(str(m.path / "wids-index.json"), cache_dir=str(tmp_path / "wids"))
    assert len(ds) == len(want)
    for i, ref in enumerate(want):
        sample = ds[i]
        assert sample[".json"] == ref["record"]  # wids decodes JSON itself
        images = sorted(
            (int(k[1:].split(".")[0]), v) for k, v in sample.items() if k[1:2].isdigit()
        )
        # wids decodes the stored pixels: its users apply the EXIF orientation themselves
        assert [im.size for _, im in images] == ref["stored"]
        assert [ImageOps.exif_transpose(im).size for _, im in images] == ref["sizes"]


def test_energon_metadata_added_to_an_existing_generation_and_kept_by_rebalance(root):
    """``write --energon`` over a generation written without it adds the metadata; a nightly
    rebalance of a generation that has it makes a child that has it too."""
    pytest.importorskip("megatron.energon")
    gen = root / read_current(root)
    assert not has_energon_metadata(gen)
    plan, cost = root.parent / "plan", root.parent / "cost.parquet"
    args = [
        "write",
        str(plan),
        "--cost-table",
        str(cost),
        "--out",
        str(root),
        "--shard-size",
        "1MB",
    ]
    assert main(args) == 0  # the same write again, without --energon: nothing added
    assert read_current(root) == gen.name and not has_energon_metadata(gen)
    assert main([*args, "--energon"]) == 0
    assert read_current(root) == gen.name and has_energon_metadata(gen)
    r = run_rebalance(_night(root, 2))
    assert r.status == "published"
    child = root / read_current(root)
    assert child != gen and has_energon_metadata(child)
    ids = [s.record["sample_id"] for s in _energon_read(child, "train")]
    assert len(ids) == len(set(ids)) == open_generation(child).totals["samples"]


def test_group_sizes_count_each_balanced_groups_samples(generation, gen_inputs):
    """``group_sizes`` (what an Energon ``batch_group_criterion`` batches by) against the
    records in the tars, read with tarfile, and the plan's rows: (global rank, step) -> the
    samples of that group, on a generation of two nodes (a key by local rank merges the nodes'
    groups)."""
    from collections import Counter

    import pyarrow.parquet as pq

    from shards.write.energon import group_sizes

    _, _, plan_dir = gen_inputs
    records = [s["record"] for stream in tar_samples(generation).values() for s in stream]
    plan = pq.read_table(plan_dir / "plan.parquet").to_pydict()
    assert len(set(plan["node"])) == 2
    want = Counter((r["rank"], r["step"]) for r in records)
    assert want == Counter(zip(plan["rank"], plan["step"], strict=True))
    assert group_sizes(read_current_path(generation)) == dict(want)


def read_current_path(root: Path) -> Path:
    return root / read_current(root)
