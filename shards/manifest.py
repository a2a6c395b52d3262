"""The generation manifest (docs/concepts.md, Generation): what a generation holds and how to check it.

``manifest.json`` names the format version, generation id and parent, the plan's layout and
balance report, and for every stream ((node, local rank) = one DP rank of the plan) its shards:
file, bytes, sha256, samples, and its groups as ``[step, samples, offset, length]`` (the byte
range of the group's members inside the tar). :func:`load_manifest` validates all of it and the
files' sizes, and fails with a message that names the file and the field.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from equishard.common.errors import EquishardError
from shards.manifest_fields import extras_problem, report_problem
from shards.manifest_structure import structure_problem
from shards.publish import CURRENT, parse_current, read_current, valid_generation_name
from shards.storage import GenerationFiles, is_url

__all__ = [
    "FORMAT_VERSION",
    "Group",
    "Manifest",
    "ManifestError",
    "Shard",
    "Stream",
    "load_manifest",
    "open_generation",
]

FORMAT_VERSION = 1
MANIFEST = "manifest.json"


class ManifestError(EquishardError, ValueError):
    """A generation's manifest is missing, unreadable, or disagrees with its files."""


@dataclass(frozen=True, slots=True)
class Group:
    step: int
    samples: int
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class Shard:
    file: str
    bytes: int
    sha256: str
    samples: int
    groups: tuple[Group, ...]


@dataclass(frozen=True, slots=True)
class Stream:
    node: int
    local_rank: int
    rank: int
    shards: tuple[Shard, ...]

    @property
    def samples(self) -> int:
        return sum(s.samples for s in self.shards)


@dataclass(frozen=True, slots=True)
class Manifest:
    path: Path | str  # the generation directory (its URL for a generation in an object store)
    generation: str
    parent: str | None
    steps: int
    nodes: int
    gpus_per_node: int
    streams: tuple[Stream, ...]
    totals: dict
    report: dict
    raw: dict
    files: GenerationFiles | None = None  # how its shards are read (None: the local directory)
    carried: dict | None = (
        None  # files beside the shards (cost table, plan): name -> (bytes, sha256)
    )

    @property
    def storage(self) -> GenerationFiles:
        return self.files if self.files is not None else GenerationFiles(self.path)

    @property
    def dp(self) -> int:
        return self.nodes * self.gpus_per_node

    def group_index(self) -> dict[tuple[int, int], tuple[Shard, Group]]:
        """(rank, step) -> where that group is."""
        out = {}
        for st in self.streams:
            for sh in st.shards:
                for g in sh.groups:
                    out[(st.rank, g.step)] = (sh, g)
        return out


def _listing(files: GenerationFiles, raw: dict) -> dict[str, int]:
    """One listing of a remote generation's files, for as many files as its manifest names
    (shards, carried files): a store listing far more, or without end, is refused."""
    named = sum(
        len(st["shards"])
        for st in raw["streams"]
        if isinstance(st, dict) and isinstance(st.get("shards"), list)
    )
    carried = raw.get("carried")
    named += len(carried) if isinstance(carried, dict) else 0
    try:
        return files.sizes(named + 1)
    except OSError as exc:
        raise ManifestError(f"cannot list the generation's files: {exc}") from None


def _need(d: dict, key: str, typ, where: str):
    if key not in d:
        raise ManifestError(f"{where}: missing field {key!r}")
    v = d[key]
    if not isinstance(v, typ) or (isinstance(v, bool) and typ is not bool):
        raise ManifestError(
            f"{where}: field {key!r} is {type(v).__name__}, expected {typ.__name__}"
        )
    return v


_DIGEST = re.compile(r"[0-9a-f]{64}")


def check_digest(value: str, where: str) -> str:
    """A sha256 from a manifest, checked before it names a cache file: 64 lowercase hex."""
    if not (isinstance(value, str) and _DIGEST.fullmatch(value)):
        raise ManifestError(
            f"{where}: sha256 {str(value)[:80]!r} is not a sha256 digest (64 lowercase hex "
            "characters); the manifest is damaged or was not written by equishard"
        )
    return value


def check_generation_name(name: str, where: str, field: str = "generation") -> str:
    """A generation id from a manifest or CURRENT: one plain directory name, never a path."""
    if not valid_generation_name(name):
        raise ManifestError(
            f"{where}: {field} {name[:80]!r} is not a generation name (one directory name, no "
            "path separators, not hidden)"
        )
    return name


def _count(d: dict, key: str, where: str) -> int:
    v = _need(d, key, int, where)
    if v < 0:
        raise ManifestError(f"{where}: field {key!r} is {v}, it cannot be negative")
    return v


def _safe_path(name: str, gen_dir: Path | None, where: str, dirs: dict) -> None:
    """A shard path must stay inside its generation: relative, no ``..``, no symlink out."""
    p = PurePosixPath(name)
    parts = name.split("/")
    if (
        not name
        or p.is_absolute()
        or {"", ".", ".."} & set(parts)
        or "\\" in name
        or "\x00" in name
    ):
        raise ManifestError(f"{where}: shard path {name!r} leaves the generation directory")
    if gen_dir is None:  # an object store: no symlinks, a key is what it names
        return
    path = gen_dir / name
    # the real path of the shard's directory (cached: a generation has one per stream) and a
    # look at the file itself, instead of a realpath (an lstat per component) per shard
    for d in (path.parent, gen_dir):
        if d not in dirs:
            dirs[d] = os.path.realpath(d)
    real = (
        os.path.realpath(path) if path.is_symlink() else os.path.join(dirs[path.parent], path.name)
    )
    if not real.startswith(dirs[gen_dir] + os.sep):
        raise ManifestError(f"{where}: shard path {name!r} resolves outside {gen_dir}")


def load_manifest(
    gen_dir: str | os.PathLike | GenerationFiles,
    *,
    check_files: bool = True,
    storage_options: dict | None = None,
) -> Manifest:
    """Parse and validate ``gen_dir/manifest.json`` (a directory, a URL, or its
    :class:`~shards.storage.GenerationFiles`); with ``check_files``, every shard must exist
    with the manifest's byte size (a cheap check; checksums are :func:`shards.verify`'s job)."""
    files = (
        gen_dir
        if isinstance(gen_dir, GenerationFiles)
        else GenerationFiles(gen_dir, storage_options=storage_options)
    )
    gen_dir = files.path  # None for an object store
    path = files.where(MANIFEST)
    try:
        text = files.read_bytes(MANIFEST).decode()
    except FileNotFoundError:
        raise ManifestError(
            f"{path}: no manifest; {files.location} is not a complete generation"
        ) from None
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{path}: not UTF-8 text ({exc})") from None
    except ValueError as exc:  # not a regular file, or far too large
        raise ManifestError(str(exc)) from None
    if not text.strip():
        raise ManifestError(f"{path}: empty manifest")
    try:
        raw = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:  # also JSON nested too deep
        raise ManifestError(f"{path}: invalid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ManifestError(f"{path}: expected a JSON object")
    version = _need(raw, "format_version", int, str(path))
    if version != FORMAT_VERSION:
        raise ManifestError(
            f"{path}: format version {version}, this equishard reads {FORMAT_VERSION}"
        )
    layout = _need(raw, "layout", dict, str(path))
    steps = _need(layout, "steps", int, f"{path} layout")
    nodes = _need(layout, "nodes", int, f"{path} layout")
    per = _need(layout, "gpus_per_node", int, f"{path} layout")
    streams = []
    total_samples = 0
    real_dirs: dict = {}  # directory -> real path, for this manifest's shard paths
    listing: dict[str, int] | None = None
    for k, st in enumerate(_need(raw, "streams", list, str(path))):
        where = f"{path} stream {k}"
        shards = []
        for j, sh in enumerate(_need(st, "shards", list, where)):
            w = f"{where} shard {j}"
            groups = []
            for g in _need(sh, "groups", list, w):
                if not (isinstance(g, list) and len(g) == 4 and all(isinstance(x, int) for x in g)):
                    raise ManifestError(
                        f"{w}: a group must be [step, samples, offset, length], got {g!r}"
                    )
                groups.append(Group(*g))
            _safe_path(_need(sh, "file", str, w), gen_dir, w, real_dirs)
            shard = Shard(
                file=_need(sh, "file", str, w),
                bytes=_count(sh, "bytes", w),
                sha256=check_digest(_need(sh, "sha256", str, w), w),
                samples=_count(sh, "samples", w),
                groups=tuple(groups),
            )
            if sum(g.samples for g in groups) != shard.samples:
                raise ManifestError(
                    f"{w} ({shard.file}): group sample counts add to "
                    f"{sum(g.samples for g in groups)}, the shard says {shard.samples}"
                )
            if check_files:
                fp = files.where(shard.file)
                if gen_dir is None and files.listable():  # one listing for all shards
                    if listing is None:
                        listing = _listing(files, raw)
                    size = listing.get(shard.file)
                elif gen_dir is None:  # plain HTTP: no listing, a HEAD per shard
                    size = files.size(shard.file)
                else:
                    try:
                        size = (gen_dir / shard.file).stat().st_size
                    except FileNotFoundError:
                        size = None
                if size is None:
                    raise ManifestError(f"{fp}: shard listed in the manifest is missing")
                if size != shard.bytes:
                    raise ManifestError(f"{fp}: {size} bytes on disk, manifest says {shard.bytes}")
            shards.append(shard)
            total_samples += shard.samples
        streams.append(
            Stream(
                node=_need(st, "node", int, where),
                local_rank=_need(st, "local_rank", int, where),
                rank=_need(st, "rank", int, where),
                shards=tuple(shards),
            )
        )
    totals = _need(raw, "totals", dict, str(path))
    if totals.get("samples") != total_samples:
        raise ManifestError(
            f"{path}: totals.samples is {totals.get('samples')}, the shards hold {total_samples}"
        )
    if len(streams) != nodes * per:
        raise ManifestError(f"{path}: {len(streams)} streams for a layout of {nodes} x {per} ranks")
    report = raw.get("report", {})
    why = report_problem(report)
    if why:
        raise ManifestError(f"{path}: {why}")
    why = structure_problem(path, streams, steps, nodes, per, totals, report)
    if why:
        raise ManifestError(why)
    carried = {}
    for name, spec in _need(raw, "files", dict, str(path)).items() if "files" in raw else ():
        w = f"{path} files[{name!r}]"
        if not isinstance(spec, dict):
            raise ManifestError(f"{w}: expected an object with bytes and sha256")
        _safe_path(name, gen_dir, w, real_dirs)
        if os.path.normpath(name) == MANIFEST:
            # the manifest cannot carry itself: its digest would have to be inside it, and a
            # fetch or publish would write this entry's bytes over the real manifest
            raise ManifestError(f"{w}: the manifest itself is not a carried file; remove it")
        carried[name] = (_count(spec, "bytes", w), check_digest(_need(spec, "sha256", str, w), w))
    shard_files = {os.path.normpath(sh.file) for st in streams for sh in st.shards}
    clash = sorted(n for n in carried if os.path.normpath(n) in shard_files)
    if clash:
        raise ManifestError(
            f"{path} files: {clash} also named as shard(s); a carried file is never a shard"
        )
    why = extras_problem(raw)  # loads, shard_size, nightly: shards/manifest_fields.py
    if why:
        raise ManifestError(f"{path}: {why}")
    parent = raw.get("parent")
    if parent is not None:
        if not isinstance(parent, str):
            raise ManifestError(f"{path}: field 'parent' is {type(parent).__name__}, expected str")
        check_generation_name(parent, str(path), "parent")
    return Manifest(
        path=gen_dir if gen_dir is not None else files.location,
        generation=check_generation_name(_need(raw, "generation", str, str(path)), str(path)),
        parent=parent,
        steps=steps,
        nodes=nodes,
        gpus_per_node=per,
        streams=tuple(sorted(streams, key=lambda s: s.rank)),
        totals=totals,
        report=report,
        raw=raw,
        files=files if files.remote or files.cache_dir else None,
        carried=carried,
    )


def open_generation(
    path: str | os.PathLike,
    *,
    storage_options: dict | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> Manifest:
    """A generation directory, or a generation root (then the one ``CURRENT`` names); local, or
    at an fsspec URL (``s3://bucket/root``: ``storage_options`` go to fsspec, ``cache_dir``
    keeps what was read, see :mod:`shards.storage`)."""
    if is_url(path):
        return _open_remote(os.fspath(path), storage_options, cache_dir)
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ManifestError(
            f"{p}: a file, not a generation; give a generation directory or a root with CURRENT"
        )
    if not p.exists():
        raise ManifestError(f"{p}: no such generation or generation root")
    root = GenerationFiles(p, cache_dir=cache_dir)
    if (p / MANIFEST).exists():
        return load_manifest(root)
    try:
        current = read_current(p)
    except ValueError as exc:
        raise ManifestError(str(exc)) from None
    if current is None:
        raise ManifestError(
            f"{p}: neither a generation (no manifest.json) nor a root with a CURRENT generation"
        )
    return load_manifest(root.child(current))


def _open_remote(url: str, storage_options: dict | None, cache_dir) -> Manifest:
    root = GenerationFiles(url, storage_options=storage_options, cache_dir=cache_dir)
    try:
        if root.exists(MANIFEST):
            return load_manifest(root)
        try:
            text = root.read_bytes(CURRENT, 4096).decode("utf-8", errors="replace")
        except FileNotFoundError:
            raise ManifestError(
                f"{url}: neither a generation (no manifest.json) nor a root with a CURRENT "
                "generation"
            ) from None
        try:
            current = parse_current(text, url)
        except ValueError as exc:
            raise ManifestError(str(exc)) from None
        if current is None:
            raise ManifestError(f"{url}/{CURRENT} is empty")
        return load_manifest(root.child(current))
    except ManifestError:
        raise
    except ValueError as exc:  # CURRENT or the manifest is not a small regular object
        raise ManifestError(str(exc)) from None
    except (OSError, PermissionError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise ManifestError(f"{url}: not found ({exc})") from None
        raise ManifestError(f"{url}: cannot read ({type(exc).__name__}: {exc})") from None
