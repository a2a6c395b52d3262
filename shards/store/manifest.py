"""A generation as equishard reads it: its manifest (the contract,
:class:`equishard.contracts.generation.GenerationManifest`) with where its files are.

:func:`load_manifest` reads ``manifest.json`` (a directory, a URL, or its
:class:`~shards.store.storage.GenerationFiles`), checks it through the contract, then checks what needs
the files: no shard path resolves outside a local generation (symlinks), and every shard exists
with the manifest's size. :func:`open_generation` takes a generation or a root (then the one
``CURRENT`` names).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from equishard.contracts.generation import (
    FORMAT_VERSION,
    MANIFEST,
    GenerationManifest,
    Group,
    ManifestError,
    Shard,
    Stream,
    check_digest,
    check_generation_name,
)
from shards.store.publish import CURRENT, parse_current, read_current
from shards.store.storage import GenerationFiles, is_url, sha256_of

__all__ = [
    "FORMAT_VERSION",
    "Group",
    "Manifest",
    "ManifestError",
    "Shard",
    "Stream",
    "carried_bytes",
    "check_digest",
    "check_generation_name",
    "checked_carried",
    "load_manifest",
    "open_generation",
]


@dataclass(frozen=True, slots=True)
class Manifest:
    """A loaded generation: its checked manifest (``doc``), the JSON it was read from, and where
    its files are."""

    path: Path | str  # the generation directory (its URL for a generation in an object store)
    doc: GenerationManifest
    raw: dict
    files: GenerationFiles | None = None  # how its shards are read (None: the local directory)

    generation = property(lambda self: self.doc.generation)
    parent = property(lambda self: self.doc.parent)
    steps = property(lambda self: self.doc.layout.steps)
    nodes = property(lambda self: self.doc.layout.nodes)
    gpus_per_node = property(lambda self: self.doc.layout.gpus_per_node)
    streams = property(lambda self: self.doc.streams)
    totals = property(lambda self: self.doc.totals)
    report = property(lambda self: self.doc.report)
    # files beside the shards (cost table, plan): name -> (bytes, sha256)
    carried = property(lambda self: self.doc.files)

    @property
    def storage(self) -> GenerationFiles:
        return self.files if self.files is not None else GenerationFiles(self.path)

    @property
    def dp(self) -> int:
        return self.doc.layout.dp

    def group_index(self) -> dict[tuple[int, int], tuple[Shard, Group]]:
        """(rank, step) -> where that group is."""
        out = {}
        for st in self.streams:
            for sh in st.shards:
                for g in sh.groups:
                    out[(st.rank, g.step)] = (sh, g)
        return out


def _listing(files: GenerationFiles, doc: GenerationManifest) -> dict[str, int]:
    """One listing of a remote generation's files, for as many files as its manifest names
    (shards, carried files): a store listing far more, or without end, is refused."""
    named = sum(len(st.shards) for st in doc.streams) + len(doc.files)
    try:
        return files.sizes(named + 1)
    except OSError as exc:
        raise ManifestError(f"cannot list the generation's files: {exc}") from None


def _inside(name: str, gen_dir: Path, where: str, dirs: dict) -> None:
    """A member of a local generation (already a relative path without ``..``: the contract
    checked it) must not resolve outside it through a symlink."""
    path = gen_dir / name
    # the real path of the file's directory (cached: a generation has one per stream) and a
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
    :class:`~shards.store.storage.GenerationFiles`); with ``check_files``, every shard must exist
    with the manifest's byte size (a cheap check; checksums are :func:`shards.read.verify`'s job)."""
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
    doc = GenerationManifest.from_json(raw, path)
    real_dirs: dict = {}  # directory -> real path, for this manifest's member paths
    listing: dict[str, int] | None = None
    for st in doc.streams:
        for j, shard in enumerate(st.shards):
            w = f"{path} stream of rank {st.rank} shard {j}"
            if gen_dir is not None:
                _inside(shard.file, gen_dir, w, real_dirs)
            if not check_files:
                continue
            fp = files.where(shard.file)
            if gen_dir is None and files.listable():  # one listing for all shards
                if listing is None:
                    listing = _listing(files, doc)
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
    if gen_dir is not None:
        for name in doc.files:
            _inside(name, gen_dir, f"{path} files[{name!r}]", real_dirs)
    return Manifest(
        path=gen_dir if gen_dir is not None else files.location,
        doc=doc,
        raw=raw,
        files=files if files.remote or files.cache_dir else None,
    )


def checked_carried(m, name: str) -> Path:
    """The file ``name`` (cost table, plan) carried in generation ``m``, checked against the
    sha256 its manifest records: a copy damaged or edited after the write would lend a night
    other fingerprints (samples taken as unchanged), costs or groups. A manifest from before
    carried files were listed records none, and its files are taken as they are."""
    path = Path(m.path) / name
    if not m.carried or name not in m.carried:
        return path
    digest = m.carried[name][1]
    got = sha256_of(path) if path.is_file() else "missing"
    if got != digest:
        raise ManifestError(
            f"{path}: sha256 {got} != the manifest's {digest}: the generation's {name} changed "
            "after it was written; restore it (or the generation) before a night reuses it"
        )
    return path


def carried_bytes(m, name: str) -> bytes:
    """The bytes of the file ``name`` carried in generation ``m``, local or in an object store,
    checked against the size and sha256 its manifest records (as :func:`checked_carried`)."""
    files = m.storage
    if not m.carried or name not in m.carried:  # a manifest from before they were recorded
        return files.read_bytes(name, limit=1 << 40)
    size, digest = m.carried[name]
    try:
        data = files.read_bytes(name, limit=size)
    except ValueError as exc:  # larger than recorded
        raise ManifestError(
            f"{exc}: the generation's {name} changed after it was written"
        ) from None
    got = hashlib.sha256(data).hexdigest()
    if got != digest:
        raise ManifestError(
            f"{files.where(name)}: sha256 {got} != the manifest's {digest}: the generation's "
            f"{name} changed after it was written; restore it (or the generation)"
        )
    return data


def open_generation(
    path: str | os.PathLike,
    *,
    storage_options: dict | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> Manifest:
    """A generation directory, or a generation root (then the one ``CURRENT`` names); local, or
    at an fsspec URL (``s3://bucket/root``: ``storage_options`` go to fsspec, ``cache_dir``
    keeps what was read, see :mod:`shards.store.storage`)."""
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
