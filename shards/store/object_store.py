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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from equishard.contracts.generation_names import MANIFEST
from shards.errors import WriteError
from shards.store.manifest import ManifestError, load_manifest
from shards.store.publish import (
    CURRENT,
    atomic_write_bytes,
    fsync_dir,
    parse_current,
    set_current,
    valid_generation_name,
)
from shards.store.storage import GenerationFiles, check_writable, is_url, join_url, sha256_of

__all__ = [
    "STAGING_DEFAULT",
    "ConcurrentPublishError",
    "current_tag",
    "default_staging",
    "fetch_generation",
    "publish_generation",
    "read_remote_current",
    "remove_remote_generation",
]


# what --staging defaults to, as the write and rebalance commands' help says it
STAGING_DEFAULT = "$EQUISHARD_STAGING or ~/.cache/equishard/staging/<hash of the URL>"


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


class ConcurrentPublishError(WriteError):
    """Another writer moved ``CURRENT`` after this one read it: this publish did not happen."""


def _inside(root: Path, name: str) -> Path:
    """``root / name`` for a name read from a manifest or a listing, refused unless it stays
    inside ``root`` (the manifest loader checked it already; this guards every local write)."""
    top = os.path.realpath(root)
    path = os.path.realpath(os.path.join(top, name))
    if not path.startswith(top + os.sep):
        raise WriteError(f"{name!r} would be written outside {root}; refusing it")
    return Path(path)


def current_tag(root_url: str, *, storage_options: dict | None = None):
    """``(generation, tag)`` of ``root_url/CURRENT``: the name it holds and the store's ETag of
    that object (``(None, None)`` when there is none). Give it back to
    :func:`publish_generation` as ``expect_current`` to publish only if nobody moved it since."""
    root = GenerationFiles(root_url, storage_options=storage_options)
    for _ in range(5):
        try:
            root.fs.invalidate_cache()
            info = root.call("info", root.full_path(CURRENT), where=root.where(CURRENT))
            text = root.read_bytes(CURRENT, 4096).decode("utf-8", errors="replace")
        except FileNotFoundError:
            return None, None
        tag = _etag(info)
        name = parse_current(text, root_url)
        # the tag read with the name must still hold it (a move between the two reads)
        root.fs.invalidate_cache()
        again = root.call("info", root.full_path(CURRENT), where=root.where(CURRENT))
        if tag is None or _etag(again) == tag:
            return name, tag
    raise ConcurrentPublishError(f"{root.where(CURRENT)}: moves faster than it can be read")


def _etag(info: dict) -> str | None:
    return info.get("ETag") or info.get("etag")


def _move_current(root: GenerationFiles, generation: str, expect) -> None:
    """Point ``CURRENT`` at ``generation``. With ``expect=(name, tag)``: only while it still
    holds ``name`` (an S3 conditional PUT, ``If-Match`` its tag, or ``If-None-Match: *`` when
    there was none): of two nights published from one parent exactly one moves it."""
    data = (generation + "\n").encode()
    path, backend = root.full_path(CURRENT), root.backend
    if expect is None or not backend.conditional_put:
        # other stores (gs://, az://, memory://): one writer per root at a time (README)
        backend.put(path, data, root.where(CURRENT))
        return
    name, _ = expect
    try:
        backend.put(path, data, root.where(CURRENT), expect=expect)
        return
    except OSError as exc:
        now, _ = current_tag(root.location, storage_options=root.storage_options)
        if now == generation:
            return  # a retried PUT that had landed
        raise ConcurrentPublishError(
            f"{root.where(CURRENT)}: another writer moved CURRENT from {name} to {now} while "
            f"this run published {generation} (the store refused the conditional write: "
            f"{exc}); {generation} is not CURRENT. Run again: it starts from {now}"
        ) from None


def publish_generation(
    local_gen: str | os.PathLike,
    root_url: str,
    *,
    storage_options: dict | None = None,
    expect_current: tuple[str | None, str | None] | None = None,
) -> dict:
    """Upload the complete local generation ``local_gen`` to ``root_url/<its id>`` (manifest
    last) and point ``root_url/CURRENT`` at it. Returns ``{"uploaded", "skipped", "bytes"}``.

    An object already in the store (a resumed upload) is kept only when its sha256 equals the
    local file's, never for its size alone. With ``expect_current`` (from :func:`current_tag`),
    CURRENT moves only if it still names what it named then; otherwise
    :class:`ConcurrentPublishError` and CURRENT stays where the other writer put it."""
    if not is_url(root_url):
        raise ValueError(f"{root_url!r} is not a URL (e.g. s3://bucket/prefix)")
    check_writable(root_url, "publish to")
    local_gen = Path(local_gen)
    m = load_manifest(local_gen)  # complete and consistent before anything leaves this machine
    root = GenerationFiles(root_url, storage_options=storage_options)
    gen = root.child(m.generation)
    names = _files(local_gen)
    if MANIFEST not in names:
        raise WriteError(f"{local_gen}: no manifest; publish only a complete generation")
    local = {n: (local_gen / n).stat().st_size for n in names if n != MANIFEST}
    have = gen.sizes(len(names)) if gen.is_dir() else {}
    digests = {sh.file: sh.sha256 for st in m.streams for sh in st.shards}
    todo = []
    for n, size in local.items():
        if have.get(n) != size:
            todo.append(n)
        elif _remote_sha256(gen, n, size) != (digests.get(n) or sha256_of(local_gen / n)):
            todo.append(n)  # a leftover of the right size but other bytes: upload again
    for n in todo:  # a local file damaged since it was written is never published
        want = digests.get(n) or (m.carried or {}).get(n, (None, None))[1]
        got = sha256_of(local_gen / n) if want else None
        if got != want:
            raise WriteError(
                f"{local_gen / n}: sha256 {got} != the manifest's {want}; the local generation "
                "is damaged, nothing was published (write it again)"
            )
    if todo:
        gen.call(
            "put",
            [str(local_gen / n) for n in todo],
            [gen.full_path(n) for n in todo],
            where=gen.location,
            nbytes=sum(local[n] for n in todo),
        )
    after = gen.sizes(len(names))
    for n, size in local.items():
        if after.get(n) != size:
            raise WriteError(
                f"{gen.where(n)}: {after.get(n)} bytes in the store after upload, {size} here; "
                "nothing was published, run again"
            )
    data = (local_gen / MANIFEST).read_bytes()
    gen.call(
        "pipe_file", gen.full_path(MANIFEST), data, where=gen.where(MANIFEST), nbytes=len(data)
    )
    _move_current(root, m.generation, expect_current)
    return {
        "uploaded": len(todo) + 1,
        "skipped": len(local) - len(todo),
        "bytes": sum(local[n] for n in todo),
    }


def read_remote_current(root_url: str, *, storage_options: dict | None = None) -> str | None:
    root = GenerationFiles(root_url, storage_options=storage_options)
    try:
        text = root.read_bytes(CURRENT, 4096).decode("utf-8", errors="replace")
        return parse_current(text, root_url)
    except FileNotFoundError:
        return None


def _wanted(m) -> dict[str, str | None]:
    """What a local copy of a generation needs: its shards and the files carried beside them
    (cost table, plan, the nightly errors table), each with the digest the manifest gives."""
    from equishard.contracts.generation_names import (
        COST_FILE,
        ENERGON_DATASET_YAML,
        ENERGON_DIR,
        PLAN_FILE,
    )

    out: dict[str, str | None] = {sh.file: sh.sha256 for st in m.streams for sh in st.shards}
    if m.carried:
        out.update({n: digest for n, (_, digest) in m.carried.items()})
    else:  # a manifest from before carried files were listed: the two the nights read
        out.update({COST_FILE: None, PLAN_FILE: None})
    out[f"{ENERGON_DIR}/{ENERGON_DATASET_YAML}"] = (
        None  # only a marker: the parent had Energon's files
    )
    out.pop(MANIFEST, None)
    return out


def _remote_sha256(gen: GenerationFiles, name: str, size: int) -> str | None:
    """The sha256 of a file already in the store that was listed with ``size`` bytes, read to
    one byte past it (None: it holds more now, or went away)."""
    try:
        return gen.sha256(name, size=size)
    except OSError:
        return None


def _check_copy(dest: Path, manifest: bytes) -> bool:
    """Whether a local copy is the generation the store holds: the same manifest bytes, every
    shard and carried file with the manifest's sha256."""
    try:
        if (dest / MANIFEST).read_bytes() != manifest:
            return False
        m = load_manifest(dest)
    except (OSError, ValueError):
        return False
    for name, digest in _wanted(m).items():
        if digest is not None and (not (dest / name).is_file() or sha256_of(dest / name) != digest):
            return False
    return True


def fetch_generation(
    root_url: str, generation: str, local_root: str | os.PathLike, *, storage_options=None
) -> Path:
    """A local copy of ``root_url/generation`` under ``local_root``, made of exactly what its
    manifest names (each shard and carried file checked against its sha256; any other key under
    the prefix is never fetched, so no key can choose a local path). A copy already there is kept
    only when it checks out the same way; a damaged one is dropped and fetched again. CURRENT
    there names it."""
    local_root = Path(local_root)
    local_root.mkdir(parents=True, exist_ok=True)
    if not valid_generation_name(generation):
        raise WriteError(f"{root_url}: {generation!r} is not a generation name")
    dest = local_root / generation
    src = GenerationFiles(join_url(root_url, generation), storage_options=storage_options)
    manifest = src.read_bytes(MANIFEST)
    if dest.exists() and not _check_copy(dest, manifest):
        trash = local_root / f".trash-{generation}"
        shutil.rmtree(trash, ignore_errors=True)
        os.replace(dest, trash)  # damaged or stale: fetched again below
        shutil.rmtree(trash, ignore_errors=True)
    if not dest.exists():
        m = load_manifest(src)
        tmp = local_root / f".fetch-{generation}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        wanted = _wanted(m)
        if src.listable():
            listing = src.sizes(len(wanted) + 1)
        else:  # plain HTTP: one HEAD per file the manifest names, never a crawl of its pages
            found = {n: src.size(n) for n in wanted}
            listing = {n: size for n, size in found.items() if size is not None}
        names = [n for n in wanted if n in listing]
        targets = [_inside(tmp, n) for n in names]
        for t in targets:
            t.parent.mkdir(parents=True, exist_ok=True)
        # each copy read to at most its listed size (load_manifest matched the shards' to the
        # manifest): fsspec's get wrote whatever a store sent, a stream without end included
        sizes = [listing[n] for n in names]
        try:
            with ThreadPoolExecutor(max_workers=8) as pool:
                copied = dict(zip(names, pool.map(src.copy_to, names, targets, sizes), strict=True))
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise WriteError(f"{exc}; the generation in the store is damaged") from None
        atomic_write_bytes(tmp / MANIFEST, manifest)
        for d in sorted({t.parent for t in targets}, key=lambda p: -len(p.parts)):
            fsync_dir(d)  # the copies' entries, before the directory is published
        load_manifest(tmp)
        for name, digest in wanted.items():
            if digest is None:
                continue
            got = copied.get(name, "missing")
            if got != digest:
                raise WriteError(
                    f"{src.where(name)}: sha256 {got} != the manifest's {digest}; the "
                    "generation in the store is damaged"
                )
        os.replace(tmp, dest)
        fsync_dir(local_root)
    set_current(local_root, generation)
    return dest


# a removal whose manifest is gone already (an interrupted earlier one) lists this many files
_UNKNOWN_FILES = 250_000


def remove_remote_generation(root_url: str, generation: str, *, storage_options=None) -> None:
    """Delete ``root_url/generation``: the manifest first (it stops being a generation), then
    each object the checked listing names under it (:meth:`GenerationFiles.sizes`: under the
    generation's prefix, in key order, no more than its manifest's files allow). fsspec's
    recursive ``rm`` deleted whatever a store's listing named, an object outside the
    generation included; names with glob characters are deleted one by one, never expanded."""
    if not valid_generation_name(generation):
        raise WriteError(f"{root_url}: {generation!r} is not a generation name")
    gen = GenerationFiles(join_url(root_url, generation), storage_options=storage_options)
    files = _UNKNOWN_FILES
    if gen.exists(MANIFEST):
        try:
            m = load_manifest(gen, check_files=False)
            files = len(_wanted(m)) + 1
        except ManifestError:  # damaged: removed all the same
            pass
        gen.call("rm_file", gen.full_path(MANIFEST), where=gen.where(MANIFEST))
    if not gen.is_dir():
        return
    names = sorted(gen.sizes(files))
    magic = {n for n in names if set(n) & set("*?[]")}  # fsspec's rm would expand these
    plain = [gen.full_path(n) for n in names if n not in magic]
    for i in range(0, len(plain), 1000):
        gen.call("rm", plain[i : i + 1000], where=gen.location)
    for n in sorted(magic):
        gen.call("rm_file", gen.full_path(n), where=gen.where(n))
