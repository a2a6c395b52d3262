"""Types shared by the readers: work units (what a worker reads) and raw records (what it gets)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from dataprep.errors import SampleRejected

__all__ = ["MAX_RECORD_BYTES", "ImageRef", "RawRecord", "ReadOptions", "WorkUnit", "too_large"]

# the most bytes one JSONL line or one tar sample's .json may hold: far above any real record
# (a few images inlined as base64 included); a longer one is rejected without being read whole
# (a multi-gigabyte line was read, then parsed into many times its size: a worker out of memory)
MAX_RECORD_BYTES = 256 << 20


def too_large(where: str, size: int) -> SampleRejected:
    """The rejection of a record of ``size`` bytes, more than :data:`MAX_RECORD_BYTES`."""
    return SampleRejected(
        "record_too_large",
        f"{where}: {size} bytes, more than the {MAX_RECORD_BYTES} one record may hold",
    )


@dataclass(frozen=True, slots=True)
class ImageRef:
    """Where one image's bytes are: a file, a member inside a file, or memory."""

    where: str
    path: str | None = None
    offset: int = 0
    size: int | None = None  # set for a member inside ``path`` (tar), None for a whole file
    data: bytes | None = None
    # the image root ``path`` must lie in, checked again by the opened file wherever it is read
    # (a link swapped in after the path was checked is refused, not followed): None, no root
    root: str | None = None


@dataclass(slots=True)
class RawRecord:
    """One sample as a reader found it. ``error`` is set when it could not even be parsed."""

    index: int  # position of the record within its input (0-based)
    line: int | None = None  # 1-based line number, for line-oriented inputs
    record: Any = None
    raw: bytes | None = None  # the record's bytes when the input has them (for fingerprints)
    images: list | None = None  # images found by the reader itself (tar members), else None
    # and its videos and recordings ({"video": [...], "audio": [...]}: tar members), else None
    media: dict | None = None
    error: SampleRejected | None = None
    key: str | None = None  # the sample's id where the reader knows it though it cannot read it
    sample: bool = True  # False: a damaged byte range of a tar, reported but not a sample


@dataclass(frozen=True, kw_only=True, slots=True)
class ReadOptions:
    image_root: str | None = None
    image_column: str | None = None
    text_column: str | None = None
    # read image paths that resolve outside image_root (off by default: dataprep.image_refs)
    allow_outside_image_root: bool = False
    # (input path, image root) for inputs measured under another root than ``image_root``
    # (a nightly rebalance's new inputs with --image-root): their images are read from there
    image_roots: tuple[tuple[str, str], ...] = ()
    # directories' real paths as this run resolved them (dataprep.image_refs), this run's only
    real_dirs: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:  # from JSON metadata: lists of lists
        roots = tuple((str(p), str(r)) for p, r in self.image_roots)
        object.__setattr__(self, "image_roots", roots)

    def recorded(self) -> dict:
        """The options as a cost table's metadata records them (what ``ReadOptions(**d)``
        takes back; not this run's cache)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.init}

    def root_for(self, input_path: str) -> str | None:
        """The image root of one input's relative image paths (None: the input's directory)."""
        for path, root in self.image_roots:
            if path == input_path:
                return root
        return self.image_root


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkUnit:
    """A chunk of one input that one worker reads. Records ``first .. first+count`` are covered
    by ``payload``; only those with ``start <= index < stop`` are kept (shard splitting)."""

    reader: str
    path: str
    source: str
    first: int
    count: int
    payload: Any = field(default=None, repr=False)
    start: int = 0
    stop: int = 1 << 62
    global_first: int = 0

    def keeps(self, index: int) -> bool:
        return self.start <= index < self.stop

    @property
    def kept(self) -> int:
        return max(0, min(self.stop, self.first + self.count) - max(self.start, self.first))
