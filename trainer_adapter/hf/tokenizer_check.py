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
# the model's keys whose values decide the ids a text gets: the vocabulary and merges first, then
# the settings that change how they apply; other keys are listed after them
VOCABULARY = ("vocab", "merges")
ID_SETTINGS = (
    "type",
    "ignore_merges",
    "byte_fallback",
    "unk_token",
    "fuse_unk",
    "dropout",
    "continuing_subword_prefix",
    "end_of_word_suffix",
)
_NONE = (None, "")  # a continuing_subword_prefix of "" and of None are the same tokenizer
_MAX_LEAVES = 12
# texts both tokenizers encode, to show a difference in ids (words, case, digits, spacing,
# accents, CJK, emoji, markup); prep's added tokens are appended
PROBES = (
    "The quick brown fox jumps over the lazy dog.",
    "HELLO World hello world, 12345 67.89 2026-12-05",
    "  indented\n\tline  with   spaces",
    "naïve café résumé Ångström",
    "东京是日本的首都。 こんにちは 안녕하세요",
    "emoji 😀👍🏽 and symbols <>[]{}()#@!",
    "def f(x):\n    return x ** 2  # code",
)


def _leaves(have, want, path: str, out: list) -> None:
    """Every place two JSON values differ, as ``(path, processor's, prep's)``, at most
    ``_MAX_LEAVES``; a dict of many keys (a vocabulary) gives one entry counting them."""
    if len(out) >= _MAX_LEAVES or have == want or (have in _NONE and want in _NONE):
        return
    if isinstance(have, dict) and isinstance(want, dict):
        keys = [k for k in sorted(set(have) | set(want), key=str) if have.get(k) != want.get(k)]
        if len(keys) > _MAX_LEAVES:  # a vocabulary: how many entries, and the first
            k = keys[0]
            out.append(
                (f"{path}: {len(keys)} entries differ, e.g. [{k!r}]", have.get(k), want.get(k))
            )
            return
        for k in keys:
            _leaves(have.get(k), want.get(k), f"{path}[{k!r}]", out)
        return
    if isinstance(have, list) and isinstance(want, list) and len(have) == len(want):
        bad = [k for k, (a, b) in enumerate(zip(have, want, strict=True)) if a != b]
        if len(bad) > _MAX_LEAVES:
            out.append(
                (f"{path}: {len(bad)} entries differ, e.g. [{bad[0]}]", have[bad[0]], want[bad[0]])
            )
            return
        for k in bad:
            _leaves(have[k], want[k], f"{path}[{k}]", out)
        return
    if isinstance(have, list) and isinstance(want, list):
        out.append((f"{path}: {len(have)} vs {len(want)} entries", None, None))
        return
    out.append((path, have, want))


def _rank(path: str) -> int:
    """0: the vocabulary or merges; 1: a setting that changes ids (the normalizer, the
    pre-tokenizer, the model's ID_SETTINGS); 2: another key of the model."""
    if any(path.startswith(f"model[{k!r}]") for k in VOCABULARY):
        return 0
    if not path.startswith("model") or any(path.startswith(f"model[{k!r}]") for k in ID_SETTINGS):
        return 1
    return 2


def _shown(path: str, have, want) -> str:
    if have is None and want is None and "entries" in path:
        return path
    return f"{path}: {str(have)[:60]} (processor) vs {str(want)[:60]} (prep)"


def _probe(backend, prep, extra: list[str]) -> str:
    """The first probe text the two tokenizers give other ids, with both ids ('' if none)."""
    for text in (*PROBES, " ".join(extra)):
        a = backend.encode(text, add_special_tokens=False).ids
        b = prep.encode(text, add_special_tokens=False).ids
        if a != b:
            k = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
            k = min(len(a), len(b)) if k is None else k
            return (
                f"on {text[:48]!r} the ids from token {k} are {a[k : k + 4]} (processor) vs "
                f"{b[k : k + 4]} (prep)"
            )
    return ""


def _differences(processor_tokenizer, path: str) -> tuple[list[str], str, str]:
    """(the differences, those that change ids first; the kind of difference: ``vocabulary``,
    ``added`` or ``settings``; a probe text the ids differ on, or '')."""
    from tokenizers import Tokenizer

    prep = Tokenizer.from_file(path)
    backend = getattr(processor_tokenizer, "backend_tokenizer", None)
    leaves: list[tuple[str, object, object]] = []
    if backend is not None:
        have, want = json.loads(backend.to_str()), json.loads(prep.to_str())
        for section in SECTIONS:
            _leaves(have.get(section), want.get(section), section, leaves)
        ids = {t["content"]: t["id"] for t in have.get("added_tokens") or []}
        ids = {**processor_tokenizer.get_vocab(), **ids}
        added = [(t["content"], t["id"]) for t in want.get("added_tokens") or []]
    else:  # a slow tokenizer: its vocabulary is what can be compared
        ids = processor_tokenizer.get_vocab()
        added = list(prep.get_vocab(with_added_tokens=True).items())
    leaves.sort(key=lambda leaf: _rank(leaf[0]))  # stable: each section's order kept
    diff = [_shown(*leaf) for leaf in leaves]
    moved = [(tok, ids.get(tok), i) for tok, i in added if ids.get(tok) != i]
    if moved:
        tok, have_id, want_id = moved[0]
        diff.insert(
            sum(_rank(leaf[0]) == 0 for leaf in leaves),
            f"{len(moved)} of prep's tokens have other ids, e.g. {tok!r}: {have_id} "
            f"(processor) vs {want_id} (prep)",
        )
    kind = (
        "vocabulary"
        if any(_rank(leaf[0]) == 0 for leaf in leaves)
        else "added"
        if moved
        else "settings"
    )
    probe = _probe(backend, prep, [t for t, _ in added]) if backend is not None and diff else ""
    return diff, kind, probe


_FIX = {
    "vocabulary": "Another vocabulary or merges: build the processor from the checkpoint prep "
    "counted with, or prep again with this processor's tokenizer "
    "(processor.tokenizer.save_pretrained(DIR); equishard prep --tokenizer DIR/tokenizer.json)",
    "added": "Prep's added tokens have other ids in the processor: build it from the checkpoint "
    "prep counted with, or prep again with this processor's tokenizer "
    "(processor.tokenizer.save_pretrained(DIR); equishard prep --tokenizer DIR/tokenizer.json)",
    "settings": "The same vocabulary and merges with other settings, as when another "
    "transformers release converts a checkpoint's tokenizer again: give the processor the "
    "file prep counted with (PreTrainedTokenizerFast(tokenizer_file=PATH) as its tokenizer), or "
    "prep again with the tokenizer this release builds "
    "(processor.tokenizer.save_pretrained(DIR); equishard prep --tokenizer DIR/tokenizer.json)",
}


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
    diff, kind, probe = _differences(processor.tokenizer, path)
    if diff:
        ids = f" ({probe})" if probe else " (the same ids on the probe texts)"
        raise SettingsMismatch(
            f"the processor's tokenizer is not the one the generation was measured with "
            f"({path}): {'; '.join(diff)}{ids}. {_FIX[kind]}"
        )
