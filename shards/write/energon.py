"""Megatron-Energon: a generation that Energon's own loader reads, and a cooker for its samples.

``write --energon`` runs Energon's own preparation over the generation's shards before it is
published (the files ``energon prepare`` writes: ``.nv-meta/index.sqlite``, ``index.uuid``,
``.info.json``, ``split.yaml``, a ``.tar.idx`` beside each shard) and adds ``dataset.yaml``,
which declares a crude WebDataset (a sample is ``KEY.json`` plus ``KEY.0.jpg``, ``KEY.1.png``,
…: a variable number of images, which no fixed field map describes).

``split.yaml`` holds the split part ``train`` (every shard, in the manifest's stream order) and
one split part per (node, rank) stream, ``node-000-rank-001``, for a job that wants each rank to
read its own balanced stream through Energon. In a task encoder, ``cookers =
[equishard_cooker()]`` turns each crude sample into an :class:`EquishardSample` (the JSON
record with turns and cost row, and the images in their order), and a
``batch_group_criterion`` keyed on the record's (rank, step) with :func:`group_sizes` makes
Energon's batches exactly the plan's balanced groups (read the stream's split in order, as
``get_val_dataset`` does).
"""

from __future__ import annotations

import contextlib
import io
import re
import shutil
from pathlib import Path

from equishard.contracts.generation_names import ENERGON_DATASET_YAML, ENERGON_DIR
from shards.errors import WriteError
from shards.store.manifest import Manifest, open_generation
from shards.store.publish import atomic_write_bytes

__all__ = [
    "ENERGON_DIR",
    "equishard_cooker",
    "group_sizes",
    "has_energon_metadata",
    "write_energon_metadata",
]

DATASET_YAML = ENERGON_DATASET_YAML


def has_energon_metadata(gen_dir: str | Path) -> bool:
    """Whether the generation carries complete Energon metadata (``dataset.yaml`` comes last)."""
    return (Path(gen_dir) / ENERGON_DIR / DATASET_YAML).is_file()


def _preparator():
    try:
        from megatron.energon.flavors.webdataset.prepare import WebdatasetPreparator
    except ImportError:
        raise WriteError(
            "--energon needs megatron-energon: pip install 'equishard[energon]'"
        ) from None
    return WebdatasetPreparator


def write_energon_metadata(m: Manifest, *, workers: int = 1) -> list[str]:
    """Prepare the generation of ``m`` (a loaded, checked local generation) for Energon;
    returns the split part names."""
    preparator = _preparator()
    gen_dir = Path(m.path)
    paths = [sh.file for st in m.streams for sh in st.shards]
    streams = [
        (f"node-{st.node:03d}-rank-{st.local_rank:03d}", st.shards[0].file)
        for st in m.streams
        if st.shards
    ]
    patterns = [("train", ".*")] + [
        (name, re.escape(first.rsplit("/", 1)[0] + "/")) for name, first in streams
    ]
    if not paths:
        raise WriteError(f"{gen_dir}: the generation has no shards for Energon to index")
    shutil.rmtree(gen_dir / ENERGON_DIR, ignore_errors=True)  # what a killed run left
    for stale in gen_dir.glob("node-*/rank-*/*.tar.idx.tmp"):
        stale.unlink()
    with contextlib.redirect_stdout(io.StringIO()):  # energon prints its progress
        preparator.prepare_dataset(
            gen_dir,
            paths,
            split_parts_patterns=patterns,
            shuffle_seed=None,
            workers=max(1, workers),
        )
    dataset_yaml = (
        "# written by equishard: a crude WebDataset; cook samples with\n"
        "# shards.write.energon.equishard_cooker() (KEY.json + KEY.0.jpg, KEY.1.png, ...)\n"
        "__module__: megatron.energon\n"
        "__class__: CrudeWebdataset\n"
        "subflavors:\n"
        "  equishard: true\n"
        f"  generation: {m.generation}\n"
    )
    atomic_write_bytes(gen_dir / ENERGON_DIR / DATASET_YAML, dataset_yaml.encode())
    return [name for name, _ in patterns]


def equishard_cooker():
    """An Energon ``Cooker`` that turns this generation's crude samples into
    :class:`~shards.format.energon_sample.EquishardSample` (needs megatron-energon)."""
    from megatron.energon import Cooker

    from shards.format.energon_sample import cook_equishard

    return Cooker(cook_equishard, has_subflavors={"equishard": True})


def group_sizes(generation) -> dict[tuple[int, int], int]:
    """(rank, step) -> number of samples in that balanced group, from the manifest."""

    m = open_generation(generation)
    return {
        (stream.rank, group.step): group.samples
        for stream in m.streams
        for shard in stream.shards
        for group in shard.groups
    }
