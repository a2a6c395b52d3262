"""Count the text tokens of rendered conversations with a real tokenizer (``tokenizers``).

``<image>`` is registered as a special token, so each placeholder is exactly one token whatever
the vocabulary, and the text count is the encoding length minus the placeholders. Without a
tokenizer a run fails, unless the caller asks for the named estimate mode
``estimate:chars_per_token=F``, which the cost table's metadata then records.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

from dataprep.records import PLACEHOLDERS
from equishard.common.local_files import regular_file

__all__ = ["TokenCounter", "TokenizerSpec"]


@dataclass(frozen=True, kw_only=True)
class TokenizerSpec:
    """Which tokenizer counts text: a ``tokenizer.json`` path, or an explicit estimate."""

    path: str | None = None
    estimate_chars_per_token: float | None = None

    def __post_init__(self) -> None:
        if (self.path is None) == (self.estimate_chars_per_token is None):
            raise ValueError(
                "give exactly one of a tokenizer path (--tokenizer path/to/tokenizer.json) or an "
                "estimate (--tokenizer estimate:chars_per_token=4)"
            )
        if self.path is not None and not Path(self.path).is_file():
            raise ValueError(
                f"tokenizer file {self.path} does not exist: pass the tokenizer.json of the model "
                "you train (from its Hugging Face repository) or use the demo's tokenizer.json"
            )
        cpt = self.estimate_chars_per_token
        if cpt is not None and not (0 < cpt < float("inf")):
            raise ValueError(
                f"chars_per_token must be a finite number > 0 (e.g. 4), got {cpt}: with it every "
                "sample would count 0 text tokens"
            )

    @classmethod
    def parse(cls, value: str | None) -> TokenizerSpec:
        if not value:
            raise ValueError(
                "no tokenizer given: pass --tokenizer path/to/tokenizer.json (exact counts), or "
                "--tokenizer estimate:chars_per_token=4 to estimate and record that in the table"
            )
        if value.startswith("estimate"):
            _, _, opt = value.partition(":")
            key, _, num = opt.partition("=")
            if key != "chars_per_token":
                raise ValueError(f"bad estimate mode {value!r}: write estimate:chars_per_token=4")
            try:
                cpt = float(num)
            except ValueError:
                raise ValueError(
                    f"bad estimate mode {value!r}: chars_per_token must be a number"
                ) from None
            return cls(estimate_chars_per_token=cpt)
        if Path(value).is_dir():  # a model directory, as --template takes: its tokenizer.json
            inner = Path(value) / "tokenizer.json"
            if not inner.is_file():
                raise ValueError(
                    f"tokenizer directory {value} has no tokenizer.json: pass the model's "
                    "directory as downloaded from its Hugging Face repository, or the file"
                )
            return cls(path=str(inner))
        if Path(value).exists():  # a FIFO or device would block Tokenizer.from_file forever
            regular_file(value, "tokenizer.json")
        return cls(path=value)

    def describe(self) -> dict:
        if self.path is None:
            return {"mode": "estimate", "chars_per_token": self.estimate_chars_per_token}
        digest = hashlib.sha256(Path(regular_file(self.path)).read_bytes()).hexdigest()
        return {"mode": "tokenizer", "path": str(Path(self.path).resolve()), "sha256": digest}


class TokenCounter:
    """Counts text tokens of many rendered texts at once (batch-encoded)."""

    def __init__(self, spec: TokenizerSpec, modalities: tuple[str, ...] = ("image",)) -> None:
        """``modalities``: whose placeholders the texts may hold (a run without video or audio
        rules refuses ``<video>`` and ``<audio>`` before counting, so it need not look for
        them)."""
        self.spec = spec
        self._marks = tuple(PLACEHOLDERS[m] for m in modalities)
        self._tok = None
        if spec.path is not None:
            from tokenizers import AddedToken, Tokenizer

            tok = Tokenizer.from_file(spec.path)
            tok.add_special_tokens(
                [AddedToken(p, special=True, normalized=False) for p in self._marks]
            )
            self._tok = tok
            self._encode = getattr(tok, "encode_batch_fast", tok.encode_batch)

    def count(self, texts: list[str]) -> list[int]:
        """Tokens of each text, with every ``<image>``, ``<video>`` and ``<audio>`` placeholder
        excluded (the media's own tokens are counted by its policy or rule)."""
        if not texts:
            return []
        marks = self._marks
        if len(marks) == 1:  # images only: one count a text
            counts = [t.count(marks[0]) for t in texts]
            chars = [n * len(marks[0]) for n in counts]
        else:
            per = [[t.count(m) for m in marks] for t in texts]
            counts = [sum(c) for c in per]
            chars = [sum(n * len(m) for n, m in zip(c, marks, strict=True)) for c in per]
        if self._tok is None:
            cpt = self.spec.estimate_chars_per_token
            return [math.ceil((len(t) - k) / cpt) for t, k in zip(texts, chars, strict=True)]
        encodings = self._encode(texts, add_special_tokens=False)
        return [len(e) - n for e, n in zip(encodings, counts, strict=True)]
