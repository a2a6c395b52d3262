"""The generation contract: ``manifest.json`` as one type that both writes and reads.

:class:`GenerationManifest` is the manifest: the writer builds one and writes
:meth:`~GenerationManifest.to_json`; every reader gets one from
:meth:`~GenerationManifest.from_json`, which checks every field (types, counts, digests, names
that must never leave the generation, the streams' structure, the plan report and the fields
beside it) and raises a ``ManifestError`` naming the manifest and the field. What needs the
files themselves (their sizes, symlinks of a local directory) is
:func:`shards.store.manifest.load_manifest`'s part.

Every file name of a generation is in :mod:`equishard.contracts.generation_names`, re-exported
here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from equishard.contracts.generation_names import (
    COST_FILE,
    CURRENT,
    ENERGON_DATASET_YAML,
    ENERGON_DIR,
    FORMAT_VERSION,
    HISTORY,
    MANIFEST,
    PLAN_FILE,
    WIDS_INDEX,
    ManifestError,
    check_digest,
    check_generation_name,
    check_member_path,
    need_count,
    need_field,
    valid_generation_name,
)
from equishard.contracts.manifest_fields import extras_problem, report_problem
from equishard.contracts.streams import Group, Shard, Stream, structure_problem

__all__ = [
    "COST_FILE",
    "CURRENT",
    "ENERGON_DATASET_YAML",
    "ENERGON_DIR",
    "FORMAT_VERSION",
    "HISTORY",
    "MANIFEST",
    "PLAN_FILE",
    "WIDS_INDEX",
    "WRITER_KEYS",
    "GenerationManifest",
    "Group",
    "Layout",
    "ManifestError",
    "Shard",
    "Stream",
    "check_digest",
    "check_generation_name",
    "valid_generation_name",
]


@dataclass(frozen=True, slots=True)
class Layout:
    """The plan's layout: ``nodes`` x ``gpus_per_node`` DP ranks, ``steps`` global steps."""

    nodes: int
    gpus_per_node: int
    steps: int

    @property
    def dp(self) -> int:
        return self.nodes * self.gpus_per_node

    def to_json(self) -> dict:
        return {
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "dp": self.dp,
            "steps": self.steps,
        }

    @classmethod
    def from_json(cls, raw: dict, where: str) -> Layout:
        w = f"{where} layout"
        return cls(
            steps=need_field(raw, "steps", int, w),
            nodes=need_field(raw, "nodes", int, w),
            gpus_per_node=need_field(raw, "gpus_per_node", int, w),
        )


@dataclass(frozen=True, kw_only=True)
class GenerationManifest:
    """A generation's ``manifest.json``. ``files`` are the files carried beside the shards
    (name -> (bytes, sha256)); ``extra`` holds the keys a caller added beside the writer's own
    (a night's record under ``nightly``); the other fields are the writer's."""

    generation: str
    parent: str | None
    layout: Layout
    streams: tuple[Stream, ...]  # in rank order
    report: dict = field(default_factory=dict)
    files: dict[str, tuple[int, str]] = field(default_factory=dict)
    shard_size: int | None = None
    plan_sha256: str | None = None
    cost_table_sha256: str | None = None
    prep: dict | None = None  # the settings prep measured with (checked where consumed)
    loads: dict | None = None  # the largest loads, to size the trainer's buffers
    extra: dict = field(default_factory=dict)
    created_by: str = "equishard"
    cost_table: str = COST_FILE
    plan: str = PLAN_FILE

    @property
    def totals(self) -> dict:
        shards = [sh for st in self.streams for sh in st.shards]
        return {
            "samples": sum(sh.samples for sh in shards),
            "groups": sum(len(sh.groups) for sh in shards),
            "shards": len(shards),
            "bytes": sum(sh.bytes for sh in shards),
        }

    def to_json(self) -> dict:
        """The manifest as the writer writes it (keys in this order)."""
        out = {
            "format_version": FORMAT_VERSION,
            "generation": self.generation,
            "parent": self.parent,
            "created_by": self.created_by,
            "plan_sha256": self.plan_sha256,
            "cost_table_sha256": self.cost_table_sha256,
            "shard_size": self.shard_size,
            "layout": self.layout.to_json(),
            "streams": [st.to_json() for st in self.streams],
            "totals": self.totals,
            "report": self.report,
            "cost_table": self.cost_table,
            "plan": self.plan,
            "prep": self.prep,
            "loads": self.loads,
        }
        for key in ("shard_size", "loads"):  # left out when unknown (older manifests)
            if out[key] is None:
                del out[key]
        clash = sorted(WRITER_KEYS & set(self.extra))
        if clash:
            raise ValueError(f"manifest extra keys would replace the writer's own keys {clash}")
        out.update(self.extra)
        out["files"] = {n: {"bytes": b, "sha256": d} for n, (b, d) in self.files.items()}
        return out

    @classmethod
    def from_json(cls, raw, where: str | os.PathLike) -> GenerationManifest:
        """The manifest ``raw`` (parsed JSON) read from ``where``, every field checked."""
        path = str(where)
        if not isinstance(raw, dict):
            raise ManifestError(f"{path}: expected a JSON object")
        version = need_field(raw, "format_version", int, path)
        if version != FORMAT_VERSION:
            raise ManifestError(
                f"{path}: format version {version}, this equishard reads {FORMAT_VERSION}"
            )
        layout = Layout.from_json(need_field(raw, "layout", dict, path), path)
        streams = [
            Stream.from_json(st, f"{path} stream {k}")
            for k, st in enumerate(need_field(raw, "streams", list, path))
        ]
        totals = need_field(raw, "totals", dict, path)
        held = sum(st.samples for st in streams)
        if totals.get("samples") != held:
            raise ManifestError(
                f"{path}: totals.samples is {totals.get('samples')}, the shards hold {held}"
            )
        if len(streams) != layout.dp:
            raise ManifestError(
                f"{path}: {len(streams)} streams for a layout of {layout.nodes} x "
                f"{layout.gpus_per_node} ranks"
            )
        report = raw.get("report", {})
        why = report_problem(report) or structure_problem(
            path, streams, layout.steps, layout.nodes, layout.gpus_per_node, totals, report
        )
        if why:
            raise ManifestError(why if why.startswith(path) else f"{path}: {why}")
        files = _carried(raw, path, streams)
        why = extras_problem(raw)  # loads, shard_size, nightly
        if why:
            raise ManifestError(f"{path}: {why}")
        parent = raw.get("parent")
        if parent is not None:
            if not isinstance(parent, str):
                raise ManifestError(
                    f"{path}: field 'parent' is {type(parent).__name__}, expected str"
                )
            check_generation_name(parent, path, "parent")
        return cls(
            generation=check_generation_name(need_field(raw, "generation", str, path), path),
            parent=parent,
            layout=layout,
            streams=tuple(sorted(streams, key=lambda s: s.rank)),
            report=report,
            files=files,
            shard_size=raw.get("shard_size"),
            plan_sha256=raw.get("plan_sha256"),
            cost_table_sha256=raw.get("cost_table_sha256"),
            prep=raw.get("prep"),
            loads=raw.get("loads"),
            extra={k: v for k, v in raw.items() if k not in WRITER_KEYS},
            created_by=raw.get("created_by", "equishard"),
            cost_table=raw.get("cost_table", COST_FILE),
            plan=raw.get("plan", PLAN_FILE),
        )


def _carried(raw: dict, path: str, streams) -> dict[str, tuple[int, str]]:
    """The carried files: each a member of the generation, never the manifest, never a shard."""
    carried = {}
    for name, spec in need_field(raw, "files", dict, path).items() if "files" in raw else ():
        w = f"{path} files[{name!r}]"
        if not isinstance(spec, dict):
            raise ManifestError(f"{w}: expected an object with bytes and sha256")
        check_member_path(name, w)
        if os.path.normpath(name) == MANIFEST:
            # the manifest cannot carry itself: its digest would have to be inside it, and a
            # fetch or publish would write this entry's bytes over the real manifest
            raise ManifestError(f"{w}: the manifest itself is not a carried file; remove it")
        carried[name] = (
            need_count(spec, "bytes", w),
            check_digest(need_field(spec, "sha256", str, w), w),
        )
    shard_files = {os.path.normpath(sh.file) for st in streams for sh in st.shards}
    clash = sorted(n for n in carried if os.path.normpath(n) in shard_files)
    if clash:
        raise ManifestError(
            f"{path} files: {clash} also named as shard(s); a carried file is never a shard"
        )
    return carried


# the keys the writer itself writes: a caller's extra keys add others, never replace these
WRITER_KEYS = frozenset(
    "format_version generation parent created_by plan_sha256 cost_table_sha256 shard_size "
    "layout streams totals report cost_table plan prep loads files".split()
)
