"""A processor's tokenizer checked against the tokenizer prep counted the text with, when the
packer is built (:meth:`HFPacker.from_generation`): another vocabulary, other merges or another
normalizer / pre-tokenizer make other ids, and often other lengths, than prep measured and the
plan balanced; before, only a length that differed was found, at the first sample it changes.

The tokenizer file prep recorded (its path, or one given in its place, whose bytes must be the
ones prep counted with) is compared with the processor's fast tokenizer section by section:
its model (vocabulary and merges), normalizer and pre-tokenizer must be equal, and every added
token of prep's must have the same id in the processor's (the processor may add tokens of its
own; its post-processor, which only the processor's own call uses, is not compared). Where the
recorded file is not at hand the check is skipped with a warning; each sample's length is still
checked (``check_costs``)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from shards.read.prep_settings import SettingsMismatch

__all__ = ["check_processor_tokenizer"]

SECTIONS = ("model", "normalizer", "pre_tokenizer")


def _first_difference(have, want, path: str = "") -> str:
    """Where two JSON values first differ, e.g. ``vocab['hello']: 17 vs 18``."""
    if isinstance(have, dict) and isinstance(want, dict):
        for key in sorted(set(have) | set(want), key=str):
            if have.get(key) != want.get(key):
                return _first_difference(have.get(key), want.get(key), f"{path}[{key!r}]")
    if isinstance(have, list) and isinstance(want, list) and len(have) == len(want):
        for i, (a, b) in enumerate(zip(have, want, strict=True)):
            if a != b:
                return _first_difference(a, b, f"{path}[{i}]")
    if isinstance(have, list) and isinstance(want, list):
        return f"{path}: {len(have)} vs {len(want)} entries"
    return f"{path}: {str(have)[:60]} (processor) vs {str(want)[:60]} (prep)"


def _differences(processor_tokenizer, path: str) -> list[str]:
    from tokenizers import Tokenizer

    prep = Tokenizer.from_file(path)
    backend = getattr(processor_tokenizer, "backend_tokenizer", None)
    diff = []
    if backend is not None:
        have, want = json.loads(backend.to_str()), json.loads(prep.to_str())
        diff += [
            f"its {s} differs at {_first_difference(have.get(s), want.get(s), s)}"
            for s in SECTIONS
            if have.get(s) != want.get(s)
        ]
        ids = {t["content"]: t["id"] for t in have.get("added_tokens") or []}
        ids = {**processor_tokenizer.get_vocab(), **ids}
        added = [(t["content"], t["id"]) for t in want.get("added_tokens") or []]
    else:  # a slow tokenizer: its vocabulary is what can be compared
        ids = processor_tokenizer.get_vocab()
        added = list(prep.get_vocab(with_added_tokens=True).items())
    moved = [(tok, ids.get(tok), i) for tok, i in added if ids.get(tok) != i]
    if moved:
        tok, have_id, want_id = moved[0]
        diff.append(
            f"{len(moved)} of prep's tokens have other ids, e.g. {tok!r}: {have_id} "
            f"(processor) vs {want_id} (prep)"
        )
    return diff


def check_processor_tokenizer(processor, recorded, given: str | None = None) -> None:
    """Raise :class:`SettingsMismatch` when ``processor``'s tokenizer is not the one prep
    counted with (``recorded``: the generation's :class:`~shards.read.prep_settings.PrepSettings`;
    ``given``: the tokenizer file or model directory prep used, where the recorded path is not
    at hand)."""
    if recorded.tokenizer is None:  # prep estimated text tokens: nothing to compare with
        return
    if given is None and not Path(recorded.tokenizer).is_file():
        warnings.warn(
            f"{recorded.where}: the tokenizer prep counted with ({recorded.tokenizer}) is not "
            "at hand, so the processor's tokenizer is not compared with it (each sample's length "
            "still is); pass tokenizer= (its file or model directory) to compare them",
            stacklevel=3,
        )
        return
    path = recorded.resolve_tokenizer(given)  # the bytes prep counted with, or refused
    diff = _differences(processor.tokenizer, path)
    if diff:
        raise SettingsMismatch(
            f"the processor's tokenizer is not the one the generation was measured with "
            f"({path}): {'; '.join(diff)}; build the processor from the checkpoint prep "
            "counted with, or prep again with this processor's tokenizer"
        )
