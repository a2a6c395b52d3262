"""Chat templates: how a conversation is rendered into the text the LLM sees.

Role markers and per-turn template tokens differ between models and change the sequence length,
so they are counted. The exact choice is the model's own Jinja chat template
(:mod:`dataprep.jinja_template`: a ``chat_template.jinja``, ``chat_template.json`` or
``tokenizer_config.json``, or the model directory). The built-in fallbacks are keyword-only
dataclasses: ``chatml`` (Qwen, InternVL 2.5), ``vicuna`` (LLaVA-1.5) and ``plain``, and any other
such template is read from a JSON file with the same field names.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path

from dataprep.records import AUDIO_PLACEHOLDER, IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER
from equishard.common.local_files import read_small

__all__ = ["BUILTIN_TEMPLATES", "ChatTemplate", "load_template"]

_MEDIA = {"image": IMAGE_PLACEHOLDER, "video": VIDEO_PLACEHOLDER, "audio": AUDIO_PLACEHOLDER}
_ENDS = ("prefix", "suffix")


@dataclass(frozen=True, kw_only=True)
class ChatTemplate:
    """Text added around turns and media. ``{role}``-keyed prefixes; one suffix for every
    turn; text written before and after each image, video and recording."""

    name: str
    bos: str = ""
    system_prompt: str | None = None
    prefix: dict[str, str] = field(default_factory=dict)
    suffix: str = ""
    image_prefix: str = ""
    image_suffix: str = ""
    video_prefix: str = ""
    video_suffix: str = ""
    audio_prefix: str = ""
    audio_suffix: str = ""

    def __post_init__(self) -> None:
        # a template file is outside data: every field is checked here, not per sample
        texts = {
            k: getattr(self, k)
            for k in ("name", "bos", "suffix", *(f"{m}_{e}" for m in _MEDIA for e in _ENDS))
        }
        bad = [k for k, v in texts.items() if not isinstance(v, str)]
        if self.system_prompt is not None and not isinstance(self.system_prompt, str):
            bad.append("system_prompt")
        if not isinstance(self.prefix, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.prefix.items()
        ):
            bad.append("prefix")
        if bad:
            raise ValueError(
                f"template {self.name!r}: field(s) {bad} must be text (prefix: an object of "
                "role -> text, system_prompt: text or null)"
            )
        missing = {"system", "user", "assistant"} - set(self.prefix)
        if missing:
            raise ValueError(
                f"template {self.name!r} lacks a prefix for role(s) {sorted(missing)}; "
                "give 'prefix': {'system': ..., 'user': ..., 'assistant': ...}"
            )

    @cached_property
    def _wraps(self) -> tuple[tuple[str, str], ...]:
        """(placeholder, wrapped placeholder) of each medium this template writes text around."""
        out = []
        for modality, mark in _MEDIA.items():
            before, after = getattr(self, f"{modality}_prefix"), getattr(self, f"{modality}_suffix")
            if before or after:
                out.append((mark, before + mark + after))
        return tuple(out)

    def _wrap(self, text: str) -> str:
        """``text`` with each media placeholder between its prefix and suffix."""
        for mark, wrapped in self._wraps:
            text = text.replace(mark, wrapped)
        return text

    def render(self, turns: list[tuple[str, str]]) -> str:
        """The full text of a conversation; each ``<image>``, ``<video>`` and ``<audio>``
        stays as one placeholder token."""
        parts = [self.bos]
        if self.system_prompt is not None and (not turns or turns[0][0] != "system"):
            parts += [self.prefix["system"], self.system_prompt, self.suffix]
        for role, text in turns:
            parts += [self.prefix[role], text, self.suffix]
        return self._wrap("".join(parts))

    def render_spans(self, turns: list[tuple[str, str]]) -> tuple[str, list[tuple[int, int]]]:
        """Like :meth:`render`, plus the character spans of assistant contents (the training
        targets)."""
        parts: list[str] = [self.bos]
        spans: list[tuple[int, int]] = []
        pos = len(self.bos)

        def add(text: str, target: bool = False) -> None:
            nonlocal pos
            text = self._wrap(text)
            if target:
                spans.append((pos, pos + len(text)))
            parts.append(text)
            pos += len(text)

        if self.system_prompt is not None and (not turns or turns[0][0] != "system"):
            add(self.prefix["system"])
            add(self.system_prompt)
            add(self.suffix)
        for role, text in turns:
            add(self.prefix[role])
            add(text, target=role == "assistant")
            add(self.suffix)
        return "".join(parts), spans

    def describe(self) -> dict:
        return asdict(self)


BUILTIN_TEMPLATES: dict[str, ChatTemplate] = {
    "chatml": ChatTemplate(
        name="chatml",
        prefix={
            "system": "<|im_start|>system\n",
            "user": "<|im_start|>user\n",
            "assistant": "<|im_start|>assistant\n",
        },
        suffix="<|im_end|>\n",
        image_prefix="<img>",
        image_suffix="</img>",
    ),
    "vicuna": ChatTemplate(
        name="vicuna",
        bos="<s>",
        system_prompt=(
            "A chat between a curious human and an artificial intelligence assistant. The assistant "
            "gives helpful, detailed, and polite answers to the human's questions."
        ),
        prefix={"system": "", "user": " USER: ", "assistant": " ASSISTANT: "},
        suffix="",
    ),
    "plain": ChatTemplate(
        name="plain", prefix={"system": "", "user": "", "assistant": ""}, suffix="\n"
    ),
}


def load_template(name_or_path: str):
    """A built-in template by name, a JSON file of :class:`ChatTemplate` fields, or the model's
    Jinja template (:class:`~dataprep.jinja_template.JinjaChatTemplate`: a ``.jinja`` file, a
    JSON file with a ``chat_template`` key, or a model directory; ``PATH#images=FAMILY``)."""
    if name_or_path in BUILTIN_TEMPLATES:
        return BUILTIN_TEMPLATES[name_or_path]
    from dataprep.jinja_template import JinjaChatTemplate

    path = Path(name_or_path.partition("#")[0])
    if path.is_dir() or path.suffix == ".jinja" or "#" in name_or_path:
        return JinjaChatTemplate(name_or_path)
    if not path.is_file():
        raise ValueError(
            f"unknown template {name_or_path!r}: use one of {sorted(BUILTIN_TEMPLATES)}, the "
            "model's chat template (its directory, chat_template.jinja, chat_template.json or "
            "tokenizer_config.json), or a JSON file with fields name, bos, system_prompt, "
            "prefix, suffix, image_prefix, image_suffix (video_, audio_ likewise)"
        )
    try:
        fields = json.loads(read_small(path, 1 << 20).decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:  # JSON, UTF-8, a FIFO, a huge file
        raise ValueError(f"template file {path}: {exc}") from None
    if isinstance(fields, dict) and "chat_template" in fields:
        return JinjaChatTemplate(name_or_path)
    try:
        return ChatTemplate(**{"name": path.stem, **fields})
    except TypeError as exc:
        raise ValueError(f"template file {path}: {exc}") from None
