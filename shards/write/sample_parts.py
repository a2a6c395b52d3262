"""What a planned sample is written from: :class:`SampleParts` (turns, images, and its videos
and recordings as :class:`MediaPart`), whether it is read from the raw inputs
(:func:`shards.write.stream_writer.read_sample`) or from the parent generation
(:func:`shards.write.parent.parent_sample`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import BinaryIO

__all__ = ["MediaPart", "SampleParts"]


@dataclass(slots=True)
class MediaPart:
    """One video or recording of a sample being written: its member name, its header (the
    document's ``media`` entry), and its bytes (embedded, or a parent shard's) or the open
    file they are streamed from, with that file's status when it was opened."""

    name: str
    info: dict
    data: bytes | None = None
    f: BinaryIO | None = None
    size: int = 0
    stat: os.stat_result | None = None

    def close(self) -> None:
        if self.f is not None:
            self.f.close()


@dataclass(slots=True)
class SampleParts:
    """What a planned sample is written from: its turns, its image names and bytes, and its
    videos and recordings (:class:`MediaPart`)."""

    turns: list
    names: list[str]
    images: list[bytes]
    media: list[MediaPart] = field(default_factory=list)

    def close(self) -> None:
        for m in self.media:
            m.close()
