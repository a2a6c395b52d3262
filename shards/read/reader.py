"""Read one group of a shard: its exact byte range, checked, split into samples.

The member headers are parsed once, with ``tarfile``, and each is checked as it comes: names that
are absolute or contain ``..``, links and other non-regular members are rejected (webdataset itself
would pass such names through and silently drop links), as is a member whose data runs past the
range (truncation). Members become samples by webdataset's rules (``group_by_keys`` with
``base_plus_ext``: the key is the name up to the first dot of its last part, the suffix the rest,
lower-cased; a new key starts a new sample; a repeated suffix is an error; names with no suffix
and webdataset's ``__meta__`` members are skipped), so a sample reads as ``webdataset`` reads it
(a test compares the two on written shards and on hand-made tars). Each member's bytes are one
slice of the range read, with no second parse and no copy through a tar stream. Every sample must
be complete: a ``.json`` whose ``images`` (and ``videos``, ``audios``) lists name exactly the
members present. Only ``.json``, image members and the video and audio members the document
names are accepted, and decoding is explicit (JSON, Pillow): nothing is ever unpickled.
"""

from __future__ import annotations

import io
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from equishard.common.errors import EquishardError, describe
from equishard.contracts.media import IMAGE_SUFFIXES
from shards.format.sample_doc import SampleDocError, check_place, media_names, parse_sample_doc
from shards.store.manifest import Group, Shard
from shards.store.storage import GenerationFiles, sha256_of

__all__ = ["IMAGE_EXTS", "ShardError", "ShardSample", "group_samples", "read_group", "sha256_of"]

IMAGE_EXTS = frozenset(IMAGE_SUFFIXES)


class ShardError(EquishardError, ValueError):
    """A shard or one of its samples is corrupt, truncated or unsafe. Names shard and member."""


@dataclass(slots=True)
class ShardSample:
    """One sample as the loader yields it: its document (``meta``), its images' bytes in
    order, and its videos' and recordings' bytes (``meta["videos"]``/``["audios"]`` name
    them; ``meta["media"]`` holds each one's header: frames, rate, size, duration)."""

    key: str
    meta: dict
    images: list[bytes]
    videos: list[bytes] = field(default_factory=list)
    audios: list[bytes] = field(default_factory=list)


_WDS_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # webdataset's base_plus_ext
_WDS_META = re.compile(r"__[^/]*__($|/)")  # webdataset's tar_file_iterator skip_meta


def _members(data: bytes, where: str) -> list[tuple[str, bytes]]:
    """(name, bytes) of every member of a group's tar bytes, each checked as its header is read."""
    out = []
    view = memoryview(data)
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
            for m in tf:
                p = PurePosixPath(m.name)
                if p.is_absolute() or ".." in p.parts:
                    raise ShardError(f"{where}: member {m.name!r} leaves the archive")
                if not m.isreg():
                    raise ShardError(f"{where}: member {m.name!r} is a link or not a regular file")
                if m.issparse():  # its stored bytes are not its content; the writer never makes one
                    raise ShardError(f"{where}: member {m.name!r} is a sparse file")
                if m.offset_data + m.size > len(data):
                    raise ShardError(f"{where}: member {m.name!r} is truncated")
                out.append((m.name, bytes(view[m.offset_data : m.offset_data + m.size])))
    except tarfile.TarError as exc:
        raise ShardError(f"{where}: unreadable tar data ({describe(exc)})") from None
    return out


def split_samples(members: list[tuple[str, bytes]], url: str) -> list[dict]:
    """Members -> samples ``{"__key__", "__url__", suffix: bytes, ...}``, as webdataset's
    ``tar_file_iterator`` + ``group_by_keys`` make them (see the module's note)."""
    samples: list[dict] = []
    current: dict | None = None
    for name, payload in members:
        if ("/" not in name and name.startswith("__") and name.endswith("__")) or (
            _WDS_META.match(name)
        ):
            continue
        found = _WDS_KEY.match(name)
        if not found:
            continue
        prefix, suffix = found.group(1), found.group(2).lower()
        if current is None or prefix != current["__key__"]:
            if current is not None:
                samples.append(current)
            current = {"__key__": prefix, "__url__": url}
        if suffix in current:
            raise ValueError(f"{name}: duplicate file name in tar file {suffix} {current.keys()}")
        current[suffix] = payload
    if current is not None:
        samples.append(current)
    return samples


def read_group(
    gen_dir: Path | GenerationFiles, shard: Shard, group: Group, *, keep_going: bool = False
) -> tuple[list[ShardSample], list[str]]:
    """Samples of one group (its byte range only, also from an object store: ``gen_dir`` may
    be a :class:`~shards.store.storage.GenerationFiles`); with ``keep_going``, broken samples are
    skipped and their errors returned instead of raised (a partial sample is never returned)."""
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
    return group_samples(data, where, str(path), group.step, group.samples, keep_going)


def group_samples(
    data: bytes, where: str, url: str, step: int, count: int, keep_going: bool = False
) -> tuple[list[ShardSample], list[str]]:
    """The samples in one group's tar bytes (``count`` of them, the group of ``step``), each
    checked: its members, its document (:mod:`shards.format.sample_doc`) and its place in the group;
    with ``keep_going``, broken samples are returned as errors instead of raised."""
    try:
        raw = split_samples(_members(data, where), url)
    except (ShardError, ValueError) as exc:
        if keep_going:
            return [], [str(exc)] * max(count, 1)
        raise ShardError(str(exc)) from None
    out: list[ShardSample] = []
    errors: list[str] = []
    for pos, r in enumerate(raw):
        key = r["__key__"]
        try:
            if "json" not in r:
                raise ShardError(f"{where}: sample {key!r} has no .json member")
            present = {k for k in r if not k.startswith("__") and k != "json"}
            meta = parse_sample_doc(
                r["json"], f"{where}: sample {key!r}"
            )  # shards/format/sample_doc.py
            media = set(media_names(meta))  # a video's or recording's: named by its document
            unknown = {k for k in present - media if k.rsplit(".", 1)[-1] not in IMAGE_EXTS}
            if unknown:
                raise ShardError(
                    f"{where}: sample {key!r} has members of unaccepted type {sorted(unknown)}"
                )
            names = meta["images"]
            if set(names) | media != present:
                raise ShardError(
                    f"{where}: sample {key!r} is incomplete: json lists "
                    f"{names + sorted(media)}, tar holds {sorted(present)}"
                )
            check_place(meta, key, step, pos, where)
            out.append(
                ShardSample(
                    key=key,
                    meta=meta,
                    images=[r[n] for n in names],
                    videos=[r[n] for n in meta.get("videos", ())],
                    audios=[r[n] for n in meta.get("audios", ())],
                )
            )
        except (ShardError, SampleDocError) as exc:
            if not keep_going:
                raise ShardError(str(exc)) from None
            errors.append(str(exc))
    if len(out) + len(errors) != count:
        msg = f"{where}: {len(out) + len(errors)} samples in the tar, the manifest says {count}"
        if not keep_going:
            raise ShardError(msg)
        if len(out) + len(errors) > count:
            # more samples than were written: which ones belong is unknowable, so none is
            # delivered (each of the group's samples is reported skipped)
            return [], [msg] * max(count, 1)
        errors += [msg] * (count - len(out) - len(errors))
    return out, errors
