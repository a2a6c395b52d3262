"""Where a record's image is: one rule for prep (which measures it) and write (which copies it).

A record names an image by a path string, embedded bytes, or an HF image struct (``bytes`` and
``path``). Relative paths start at ``--image-root`` (default: the input's folder). A path that
resolves outside that root (``..``, an absolute path elsewhere, a symlink leading out) is
rejected unless the run allows it (``--allow-outside-image-root``): a dataset record must not be
able to make the pipeline read, and copy into shards, any file the job can read.
"""

from __future__ import annotations

import os

from dataprep.errors import SampleRejected
from dataprep.readers.base import ImageRef, ReadOptions

__all__ = ["image_ref"]


def _real_dir(path: str, dirs: dict[str, str]) -> str:
    real = dirs.get(path)
    if real is None:
        if len(dirs) > 65536:
            dirs.clear()
        real = dirs[path] = os.path.realpath(path)
    return real


def _realpath(path: str, dirs: dict[str, str]) -> str:
    """``os.path.realpath`` with the directories' real paths cached in ``dirs`` (one run's
    :class:`ReadOptions`: never across runs, where a directory may have become a link leading
    out of the root since): one ``lstat`` per image (is the file itself a link?) instead of one
    per path component."""
    head, tail = os.path.split(path)
    if not tail or tail in (".", "..") or os.path.islink(path):
        return os.path.realpath(path)
    return os.path.join(_real_dir(head or ".", dirs), tail)


def _inside(path: str, root: str, dirs: dict[str, str]) -> bool:
    real, top = _realpath(path, dirs), _real_dir(root, dirs)
    return real == top or real.startswith(top.rstrip(os.sep) + os.sep)


def image_ref(
    item, input_path: str, opts: ReadOptions, where: str, kind: str = "image"
) -> ImageRef:
    """The :class:`ImageRef` of one image item of a record read from ``input_path``; raises
    :class:`SampleRejected` for an item that is not an image reference or a path outside the
    root. ``where`` names the image in messages (``input#index/imageK``); ``kind``: what the
    item is, for the messages (a video or a recording is found by the same rule, under the
    same root)."""
    if isinstance(item, ImageRef):
        return item  # a tar member: it lies inside its tar
    if isinstance(item, dict):
        if item.get("bytes"):
            return ImageRef(where=where, data=bytes(item["bytes"]))
        item = item.get("path")
    if isinstance(item, (bytes, bytearray)):
        return ImageRef(where=where, data=bytes(item))
    if not isinstance(item, str) or not item:
        raise SampleRejected(
            "missing_image", f"{where}: {kind} reference {item!r:.80} is not a path"
        )
    root = opts.root_for(input_path) or os.path.dirname(input_path)
    path = os.path.join(root, item)
    if not opts.allow_outside_image_root and not _inside(path, root, opts.real_dirs):
        raise SampleRejected(
            "unsafe_path",
            f"{where}: {kind} path {item!r:.200} resolves to {os.path.realpath(path)!r:.200}, outside "
            f"the image root {root!r}; pass --allow-outside-image-root to read it anyway",
        )
    return ImageRef(where=path, path=path, root=None if opts.allow_outside_image_root else root)
