"""``shards.hf_datasets``, as equishard 0.1 laid it out: the same names as :mod:`shards.read.hf_datasets`
(kept for code that imports them from here; new code imports that module)."""

from shards.read.hf_datasets import (
    hf_webdataset_kwargs,
)

__all__ = ["hf_webdataset_kwargs"]
