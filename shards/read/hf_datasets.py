"""Read a generation with Hugging Face ``datasets``' own WebDataset builder.

That builder infers one fixed set of fields from the first five samples and refuses a dataset
whose samples differ; an equishard sample has as many image members as images, in their own
formats (``KEY.0.jpg``, ``KEY.1.png``, …). :func:`hf_webdataset_kwargs` gives the builder the
generation's shards in stream order and the union of the fields (found from the tar headers):
``json`` as a JSON value, every image field as an ``Image``, every video and audio field
(``video0.mp4``, ``audio0.flac``) as its bytes (``Value("binary")``: decode them with the
decoder your model's processor uses); a sample lacking a field gets ``None`` there::

    ds = datasets.load_dataset("webdataset", **hf_webdataset_kwargs("build/shards"), split="train")
"""

from __future__ import annotations

import tarfile

from equishard.contracts.media import suffix_modality
from shards.store.manifest import open_generation

__all__ = ["hf_webdataset_kwargs"]


def _fields(path) -> set[str]:
    with tarfile.open(path) as tf:  # headers only: the data is seeked over
        return {name.split(".", 1)[1] for name in tf.getnames() if "." in name.rsplit("/", 1)[-1]}


def hf_webdataset_kwargs(generation) -> dict:
    """``data_files`` and ``features`` for ``datasets.load_dataset("webdataset", ...)`` over a
    generation directory or root (the ``CURRENT`` one)."""
    import datasets

    m = open_generation(generation)
    if m.files is not None and m.files.remote:
        raise ValueError(
            f"{m.path}: hf_webdataset_kwargs reads local generations (it scans each tar's "
            "members); read one in an object store with shards.GroupDataset, or copy it locally"
        )
    files = [str(m.path / shard.file) for stream in m.streams for shard in stream.shards]
    fields = set().union(*map(_fields, files)) if files else {"json"}
    json_type = datasets.Json() if hasattr(datasets, "Json") else datasets.Value("string")
    features = {"__key__": datasets.Value("string"), "__url__": datasets.Value("string")}
    features["json"] = json_type
    for f in sorted(fields - {"json"}):  # images decoded; videos and recordings as bytes
        media = suffix_modality(f)
        image = media is None or media.name == "image"
        features[f] = datasets.Image() if image else datasets.Value("binary")
    return {"data_files": {"train": files}, "features": datasets.Features(features)}
