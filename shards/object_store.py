"""Publish generations to an object store (``s3://``, ``gs://``, any fsspec URL) and fetch them.

An object store has no rename, so the local writer's atomic publish (one directory rename)
becomes an order of uploads: a generation is written and checked locally first (in a staging
root, where killed runs resume as usual), then :func:`publish_generation` uploads

1. every file of the generation except its manifest (shards, cost table, plan, indexes),
   skipping objects already there with the right size (a re-run resumes an upload), then checks
   the listing against the local sizes;
2. ``manifest.json``, last of the generation;
3. ``ROOT/CURRENT``, last of all.

Readers open ``CURRENT``, then the manifest it names, then byte ranges of the shards, so what
they read was complete before it became reachable. This relies on what S3 (since December
2020), Google Cloud Storage and Azure Blob guarantee: a PUT is atomic (an object is visible whole
or not at all) and strongly consistent (a read or LIST after the PUT returns sees it). On a store
without read-after-write consistency a reader could find ``CURRENT`` before the manifest; the
loader then fails with a clear "no manifest" error rather than reading a partial generation.
Overwriting ``CURRENT`` is atomic too: readers see the old or the new name. Old generations are
removed only after ``CURRENT`` has moved on (``rebalance --keep``); a job still reading one of
them fails loudly, so keep at least two.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from shards.errors import WriteError
from shards.manifest import MANIFEST, load_manifest
from shards.publish import CURRENT, fsync_dir, parse_current, set_current
from shards.storage import GenerationFiles, is_url, join_url

__all__ = [
    "default_staging",
    "fetch_generation",
    "publish_generation",
    "read_remote_current",
    "remove_remote_generation",
]


def default_staging(url: str) -> Path:
    """The local root a URL's generations are written in before upload (kept for resuming):
    ``$EQUISHARD_STAGING`` or ``~/.cache/equishard/staging``, one directory per URL."""
    base = os.environ.get("EQUISHARD_STAGING") or Path.home() / ".cache" / "equishard" / "staging"
    return Path(base) / hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16]


def _files(local_gen: Path) -> list[str]:
    """The generation's files by relative name; lock and temporary files left out."""
    out = []
    for p in local_gen.rglob("*"):
        rel = p.relative_to(local_gen).as_posix()
        if p.is_file() and p.name != ".lock" and ".tmp-" not in p.name:
            out.append(rel)
    return sorted(out)


def publish_generation(
    local_gen: str | os.PathLike, root_url: str, *, storage_options: dict | None = None
) -> dict:
    """Upload the complete local generation ``local_gen`` to ``root_url/<its id>`` (manifest
    last) and point ``root_url/CURRENT`` at it. Returns ``{"uploaded", "skipped", "bytes"}``."""
    if not is_url(root_url):
        raise ValueError(f"{root_url!r} is not a URL (e.g. s3://bucket/prefix)")
    local_gen = Path(local_gen)
    m = load_manifest(local_gen)  # complete and consistent before anything leaves this machine
    root = GenerationFiles(root_url, storage_options=storage_options)
    gen = root.child(m.generation)
    names = _files(local_gen)
    if MANIFEST not in names:
        raise WriteError(f"{local_gen}: no manifest; publish only a complete generation")
    local = {n: (local_gen / n).stat().st_size for n in names if n != MANIFEST}
    have = gen.sizes() if gen.is_dir() else {}
    todo = [n for n, size in local.items() if have.get(n) != size]
    if todo:
        gen.fs.put([str(local_gen / n) for n in todo], [gen.full_path(n) for n in todo])
    after = gen.sizes()
    for n, size in local.items():
        if after.get(n) != size:
            raise WriteError(
                f"{gen.where(n)}: {after.get(n)} bytes in the store after upload, {size} here; "
                "nothing was published, run again"
            )
    gen.fs.pipe_file(gen.full_path(MANIFEST), (local_gen / MANIFEST).read_bytes())
    root.fs.pipe_file(root.full_path(CURRENT), (m.generation + "\n").encode())
    return {
        "uploaded": len(todo) + 1,
        "skipped": len(local) - len(todo),
        "bytes": sum(local[n] for n in todo),
    }


def read_remote_current(root_url: str, *, storage_options: dict | None = None) -> str | None:
    root = GenerationFiles(root_url, storage_options=storage_options)
    try:
        return parse_current(root.read_bytes(CURRENT).decode(), root_url)
    except FileNotFoundError:
        return None


def fetch_generation(
    root_url: str, generation: str, local_root: str | os.PathLike, *, storage_options=None
) -> Path:
    """A local copy of ``root_url/generation`` under ``local_root`` (kept if already there and
    complete), every shard checked against the manifest's sha256; CURRENT there names it."""
    local_root = Path(local_root)
    local_root.mkdir(parents=True, exist_ok=True)
    dest = local_root / generation
    if (dest / MANIFEST).exists():
        load_manifest(dest)
    else:
        src = GenerationFiles(join_url(root_url, generation), storage_options=storage_options)
        m = load_manifest(src)
        tmp = local_root / f".fetch-{generation}"
        shutil.rmtree(tmp, ignore_errors=True)
        names = [n for n in src.sizes() if n != MANIFEST]
        for n in names:
            (tmp / n).parent.mkdir(parents=True, exist_ok=True)
        src.fs.get([src.full_path(n) for n in names], [str(tmp / n) for n in names])
        (tmp / MANIFEST).write_bytes(src.read_bytes(MANIFEST))
        local = load_manifest(tmp)
        for st in local.streams:
            for sh in st.shards:
                digest = GenerationFiles(tmp).sha256(sh.file)
                if digest != sh.sha256:
                    raise WriteError(
                        f"{src.where(sh.file)}: sha256 {digest} != the manifest's {sh.sha256}"
                    )
        assert m.generation == local.generation
        os.replace(tmp, dest)
        fsync_dir(local_root)
    set_current(local_root, generation)
    return dest


def remove_remote_generation(root_url: str, generation: str, *, storage_options=None) -> None:
    """Delete ``root_url/generation``: the manifest first (it stops being a generation), then
    the rest."""
    gen = GenerationFiles(join_url(root_url, generation), storage_options=storage_options)
    if gen.exists(MANIFEST):
        gen.fs.rm_file(gen.full_path(MANIFEST))
    if gen.is_dir():
        gen.fs.rm(gen.full_path(""), recursive=True)
