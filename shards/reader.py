"""Read one group of a shard: its exact byte range, checked, parsed by ``webdataset``.

Before webdataset sees the bytes, every member header is checked with ``tarfile``: names that are
absolute or contain ``..``, links and other non-regular members are rejected (webdataset itself
would pass such names through and silently drop links), as is a member whose data runs past the
range (truncation). webdataset's ``tar_file_iterator`` and ``group_by_keys`` then split members
into samples (rejecting duplicate keys), and every sample must be complete: a ``.json`` whose
``images`` list names exactly the image members present. Only ``.json`` and image members are
accepted, and decoding is explicit (JSON, Pillow): nothing is ever unpickled.
"""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from dataprep.errors import describe
from shards.manifest import Group, Shard
from shards.storage import GenerationFiles, sha256_of

__all__ = ["IMAGE_EXTS", "ShardError", "ShardSample", "read_group", "sha256_of"]

IMAGE_EXTS = frozenset({"jpg", "jpeg", "png", "webp", "gif", "bmp"})


class ShardError(ValueError):
    """A shard or one of its samples is corrupt, truncated or unsafe. Names shard and member."""


@dataclass(slots=True)
class ShardSample:
    key: str
    meta: dict
    images: list[bytes]


def _check_members(data: bytes, where: str) -> None:
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
            for m in tf:
                p = PurePosixPath(m.name)
                if p.is_absolute() or ".." in p.parts:
                    raise ShardError(f"{where}: member {m.name!r} leaves the archive")
                if not m.isreg():
                    raise ShardError(f"{where}: member {m.name!r} is a link or not a regular file")
                if m.offset_data + m.size > len(data):
                    raise ShardError(f"{where}: member {m.name!r} is truncated")
    except tarfile.TarError as exc:
        raise ShardError(f"{where}: unreadable tar data ({describe(exc)})") from None


def read_group(
    gen_dir: Path | GenerationFiles, shard: Shard, group: Group, *, keep_going: bool = False
) -> tuple[list[ShardSample], list[str]]:
    """Samples of one group (its byte range only, also from an object store: ``gen_dir`` may
    be a :class:`~shards.storage.GenerationFiles`); with ``keep_going``, broken samples are
    skipped and their errors returned instead of raised (a partial sample is never returned)."""
    from webdataset.tariterators import group_by_keys, tar_file_iterator

    files = gen_dir if isinstance(gen_dir, GenerationFiles) else GenerationFiles(gen_dir)
    path = files.where(shard.file)
    where = f"{path} (step {group.step}, bytes {group.offset}+{group.length})"
    try:
        data = files.read_range(shard.file, group.offset, group.length, shard.sha256)
    except OSError as exc:  # missing, unreadable, or (object store) replaced since listed
        err = f"{where}: cannot read the shard ({type(exc).__name__}: {exc})"
        if keep_going:
            return [], [err] * max(group.samples, 1)
        raise ShardError(err) from None
    if len(data) != group.length:
        err = f"{where}: shard is truncated ({len(data)} of {group.length} bytes of this group)"
        if keep_going:
            return [], [err] * max(group.samples, 1)
        raise ShardError(err)
    try:
        _check_members(data, where)
        members = ({**m, "__url__": path} for m in tar_file_iterator(io.BytesIO(data)))
        raw = list(group_by_keys(members))
    except (ShardError, ValueError) as exc:
        if keep_going:
            return [], [str(exc)] * max(group.samples, 1)
        raise ShardError(str(exc)) from None
    out: list[ShardSample] = []
    errors: list[str] = []
    for r in raw:
        key = r["__key__"]
        try:
            if "json" not in r:
                raise ShardError(f"{where}: sample {key!r} has no .json member")
            meta = json.loads(r["json"])
            names = meta.get("images", [])
            present = {k for k in r if not k.startswith("__") and k != "json"}
            unknown = {k for k in present if k.rsplit(".", 1)[-1] not in IMAGE_EXTS}
            if unknown:
                raise ShardError(
                    f"{where}: sample {key!r} has members of unaccepted type {sorted(unknown)}"
                )
            if set(names) != present:
                raise ShardError(
                    f"{where}: sample {key!r} is incomplete: json lists {names}, tar holds {sorted(present)}"
                )
            out.append(ShardSample(key=key, meta=meta, images=[r[n] for n in names]))
        except (ShardError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            if not keep_going:
                raise ShardError(str(exc)) from None
            errors.append(str(exc))
    if len(out) + len(errors) != group.samples:
        msg = f"{where}: {len(out) + len(errors)} samples in the tar, the manifest says {group.samples}"
        if not keep_going:
            raise ShardError(msg)
        if len(out) + len(errors) > group.samples:
            # more samples than were written: which ones belong is unknowable, so none is
            # delivered (each of the group's samples is reported skipped)
            return [], [msg] * max(group.samples, 1)
        errors += [msg] * (group.samples - len(out) - len(errors))
    return out, errors
