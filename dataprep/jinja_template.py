"""The model's own chat template: Jinja source from the model's files, rendered as transformers does.

A Hugging Face model ships its chat template as ``chat_template.jinja``, as ``chat_template`` in
``chat_template.json`` (processors) or in ``tokenizer_config.json`` (tokenizers). ``--template``
takes any of those files or the model directory holding them. The template is rendered with
``jinja2`` in the environment ``apply_chat_template`` uses (sandboxed, ``trim_blocks``,
``lstrip_blocks``, loop controls, the ``generation`` tag, ``raise_exception``, ``strftime_now``
and a ``tojson`` that keeps non-ASCII), with the tokenizer's special tokens as variables, over
messages whose ``content`` is a list of ``{"type": "text", "text": ...}`` and ``{"type":
"image"}`` items in the order of the record's ``<image>`` placeholders (:func:`messages_from_turns`).

The processor then expands the image marker the template emitted, one per image; that is
reproduced per family (:data:`IMAGE_TOKENS`), each image counting its vision policy's LLM tokens:

* ``qwen2vl`` — ``<|image_pad|>`` becomes N ``<|image_pad|>`` (the template writes the
  ``<|vision_start|>``/``<|vision_end|>`` around it),
* ``internvl`` — ``<IMG_CONTEXT>`` becomes ``<img>`` + N ``<IMG_CONTEXT>`` + ``</img>``,
* ``llava`` — ``<image>`` becomes N ``<image>``,
* ``glm4v`` — ``<|image|>`` becomes N ``<|image|>`` (the template writes the
  ``<|begin_of_image|>``/``<|end_of_image|>`` around it),
* ``mistral3`` — ``[IMG]`` becomes N tokens: Pixtral's rows of ``[IMG]``, each closed by
  ``[IMG_BREAK]``, the last by ``[IMG_END]`` (every one a single special token, so N ``[IMG]``
  count the same),
* ``ernie45vl`` — ``<|IMAGE_PLACEHOLDER|>`` becomes N ``<|IMAGE_PLACEHOLDER|>`` (ERNIE 4.5-VL: the
  template writes ``Picture k:<|IMAGE_START|>`` before it and ``<|IMAGE_END|>`` after it),
* ``gemma3`` — ``<start_of_image>`` becomes ``\\n\\n<start_of_image>`` + N ``<image_soft_token>`` +
  ``<end_of_image>\\n\\n``,
* ``gemma4`` — ``<|image|>`` becomes ``<|image>`` + N ``<|image|>`` + ``<image|>`` (Gemma 4's
  processor; its template's turns open with ``<|turn>``, which tells it from GLM-4.1V's, whose
  marker is the same),
* ``deepseek_vl`` — ``<image_placeholder>`` becomes N ``<image_placeholder>`` (DeepSeek-VL),
* ``janus`` — ``<image_placeholder>`` becomes ``<begin_of_image>`` + N ``<image_placeholder>``
  + ``<end_of_image>`` (Janus / Janus-Pro),
* ``aria`` — ``<|img|>`` becomes N ``<|img|>`` (Aria: the template writes ``<fim_prefix>`` /
  ``<fim_suffix>`` around it).

The family is found from the marker in the template source (where two families share a marker,
the one whose template also writes its own token, as Gemma 4's ``<|turn>``);
``PATH#images=FAMILY`` chooses it, and must where the source cannot tell (DeepSeek-VL's and
Janus's templates write the same marker, their processors expand it differently).
"""

from __future__ import annotations

import hashlib
import json
import re
from functools import cached_property
from pathlib import Path

from dataprep.errors import SampleRejected
from dataprep.families.registry import IMAGE_TOKENS, MEDIA_TOKENS
from dataprep.families.spec import ImageTokens
from dataprep.jinja_environment import GEN_CLOSE, GEN_OPEN, jinja_environment
from dataprep.records import IMAGE_PLACEHOLDER, PLACEHOLDERS
from dataprep.template_limits import (
    RenderLimits,
    TemplateLimit,
    bounded,
    tick,
)
from equishard.common.errors import describe
from equishard.common.local_files import read_small

__all__ = [
    "IMAGE_TOKENS",
    "RENDERING_KEYS",
    "ImageTokens",
    "JinjaChatTemplate",
    "messages_from_turns",
]

# a turn's text split at its media placeholders (kept, in a group)
_SPLIT = re.compile("(" + "|".join(re.escape(p) for p in PLACEHOLDERS.values()) + ")")
_MODALITY = {p: m for m, p in PLACEHOLDERS.items()}
TEMPLATE_FILE_LIMIT = 64 << 20  # a template or a tokenizer_config.json is read whole

# the fields of ``JinjaChatTemplate.describe()`` that decide what it renders (its name and source
# path may differ from machine to machine): two templates count alike when these are equal
RENDERING_KEYS = ("kind", "sha256", "image_tokens", "content", "special_tokens")

# what `ChatTemplate.render` marks: the start and end of a generation block (private use chars)
_FILES = ("chat_template.jinja", "chat_template.json", "tokenizer_config.json")
_SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token")


def _detect_family(source: str, where: str, path_text: str) -> str | None:
    """The family whose image marker the template source writes (None: no family's; the first
    in :data:`IMAGE_TOKENS` where it writes several families' markers). A marker two families
    share goes to the one whose own token (``also``) is in the source too; where none or
    several are, the source cannot tell and the user names the family."""
    found = [f for f, t in IMAGE_TOKENS.items() if t.marker in source and t.also in source]
    found = [f for f in found if IMAGE_TOKENS[f].also] or found
    if not found:  # an audio-only family's (Qwen2-Audio's): its recording marker
        only = [
            f
            for f, media in MEDIA_TOKENS.items()
            if f not in IMAGE_TOKENS and "audio" in media and media["audio"].marker in source
        ]
        return only[0] if only else None
    # markers of different families in one source: the first family's, in the table's order
    marker = IMAGE_TOKENS[found[0]].marker
    same = [f for f in found if IMAGE_TOKENS[f].marker == marker]
    if len(same) > 1:
        raise ValueError(
            f"{where} writes {marker}, the image marker of {' and '.join(same)}, whose "
            f"processors expand it differently: name the family with "
            f"'{path_text}#images=FAMILY' ({' or '.join(same)})"
        )
    return found[0]


_CONTENT_FORMS = ("parts", "string")
_PROBE = ("Q7pr0be question", "A7pr0be answer")


def _detect_content(render) -> str:
    """The content form a template takes, found by rendering a probe conversation both ways:
    ``parts`` where a list of content items renders its text as text (multimodal templates),
    else ``string`` where plain strings do (text LLM templates: Qwen2.5, Llama 3, Mistral,
    InternLM2 write the content as it is, and print a list's repr or fail on it). ``render``
    takes messages and returns the text, raising where the template refuses them."""
    q, a = _PROBE
    for form in _CONTENT_FORMS:
        try:
            text = render(messages_from_turns([("user", q), ("assistant", a)], form))
        except Exception:  # this form is refused: try the other one
            continue
        if q in text and a in text and "'type'" not in text and '"type"' not in text:
            return form
    return "parts"  # neither renders cleanly: samples will say why, one by one


def messages_from_turns(
    turns: list[tuple[str, str]],
    content: str = "parts",
    marker: str | None = None,
    markers: dict[str, str] | None = None,
) -> list[dict]:
    """The messages a template renders. ``parts``: each turn's text split at ``<image>``,
    ``<video>`` and ``<audio>`` into text and media content items (empty text pieces left
    out). ``string``: each turn's text as one string, every ``<image>`` written as the family's
    image ``marker``, every ``<video>``/``<audio>`` as its marker in ``markers`` (what a user's
    training code puts in the text for a template that takes string content)."""
    if content == "string":
        out = []
        for role, text in turns:
            if marker is not None:
                text = text.replace(IMAGE_PLACEHOLDER, marker)
            for modality, mark in (markers or {}).items():
                text = text.replace(PLACEHOLDERS[modality], mark)
            out.append({"role": role, "content": text})
        return out
    messages = []
    for role, text in turns:
        content: list[dict] = []
        for piece in _SPLIT.split(text):
            if piece in _MODALITY:
                content.append({"type": _MODALITY[piece]})
            elif piece:
                content.append({"type": "text", "text": piece})
        messages.append({"role": role, "content": content})
    return messages


def _token_text(value) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_source(path: Path) -> tuple[str, dict[str, str], Path]:
    """(template source, special tokens, file it came from) for a file or model directory."""
    if path.is_dir():
        found = [path / f for f in _FILES if (path / f).exists()]  # a FIFO there: refused
        candidates = [f for f in found if f.suffix == ".jinja" or "chat_template" in _load(f)]
        if not candidates:
            raise ValueError(
                f"{path}: no chat template in the directory (looked for {', '.join(_FILES)} "
                "with a 'chat_template')"
            )
        source, _, origin = _read_source(candidates[0])
        config = path / "tokenizer_config.json"
        special = _specials(_load(config)) if config.exists() else {}
        return source, special, origin
    if path.suffix == ".jinja":
        try:
            return read_small(path, TEMPLATE_FILE_LIMIT).decode("utf-8"), {}, path
        except (OSError, ValueError) as exc:  # also a FIFO, a huge file, not UTF-8
            raise ValueError(f"chat template file {path}: {exc}") from None
    data = _load(path)
    if "chat_template" not in data:
        raise ValueError(f"{path}: no 'chat_template' key")
    tmpl = data["chat_template"]
    if isinstance(tmpl, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in tmpl if isinstance(t, dict)}
        tmpl = named.get("default")
    if not isinstance(tmpl, str):
        raise ValueError(f"{path}: 'chat_template' is not a template string (or a 'default' one)")
    return tmpl, _specials(data), path


def _load(path: Path) -> dict:
    try:
        data = json.loads(read_small(path, TEMPLATE_FILE_LIMIT).decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:  # JSON, UTF-8, a FIFO, a huge file
        raise ValueError(f"chat template file {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"chat template file {path}: expected a JSON object")
    return data


def _specials(config: dict) -> dict[str, str]:
    return {k: t for k in _SPECIAL if (t := _token_text(config.get(k))) is not None}


def _options(spec: str, fragment: str) -> dict[str, str]:
    """``PATH#images=FAMILY&content=string``: the family whose processor expands the image
    marker, and the form the template takes a message's content in (``parts``, ``string``)."""
    out: dict[str, str] = {}
    usage = (
        f"template {spec!r}: write PATH#images=FAMILY (one of {', '.join(IMAGE_TOKENS)}) and/or "
        f"PATH#content=FORM (one of {', '.join(_CONTENT_FORMS)}), joined by '&'"
    )
    for item in filter(None, fragment.split("&")):
        key, _, value = item.partition("=")
        allowed = {"images": IMAGE_TOKENS, "content": _CONTENT_FORMS}.get(key)
        if allowed is None or value not in allowed or key in out:
            raise ValueError(usage)
        out[key] = value
    return out


class JinjaChatTemplate:
    """A model's Jinja chat template, with the family's image expansion; same interface as
    :class:`~dataprep.chat_template.ChatTemplate` (``render``, ``render_spans``, ``describe``)."""

    def __init__(self, spec: str) -> None:
        path_text, _, fragment = spec.partition("#")
        self.name = spec
        self.path = Path(path_text)
        self.source, self.special_tokens, self.origin = _read_source(self.path)
        options = _options(spec, fragment)
        family = options.get("images")
        if family is None:
            family = _detect_family(self.source, f"template {self.origin}", path_text)
        # None: the template writes no image marker; text-only samples render, a sample with
        # images is refused with the fix (name the family)
        self.family = family
        self.images = IMAGE_TOKENS.get(family) if family else None  # None: audio only
        self._path_text = path_text
        self.limits = RenderLimits.from_env()
        if len(self.source) > self.limits.source_chars:
            raise ValueError(
                f"chat template {self.origin}: {len(self.source)} characters, more than the "
                f"{self.limits.source_chars} a chat template may have"
            )
        try:
            with bounded(self.limits):
                self._template = jinja_environment().from_string(self.source)
        except (Exception, TemplateLimit) as exc:  # a syntax error in the model's template
            raise ValueError(f"chat template {self.origin}: {describe(exc)}") from None
        self.content = options.get("content") or _detect_content(self._probe)

    def _probe(self, messages: list[dict]) -> str:
        with bounded(self.limits):
            # special tokens a template file alone does not define render as empty here
            tokens = {**dict.fromkeys(_SPECIAL, ""), **self.special_tokens}
            return self._template.render(messages=messages, add_generation_prompt=False, **tokens)

    @property
    def image_prefix(self) -> str:
        """What the family's processor writes before each image's tokens, as the rendered text
        has it before each placeholder."""
        return self.images.prefix if self.images else ""

    @cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()

    def _render_marked(self, turns: list[tuple[str, str]]) -> str:
        n_images = sum(text.count(IMAGE_PLACEHOLDER) for _, text in turns)
        if n_images and self.images is None and self.family is not None:
            raise SampleRejected(
                "template_no_image_family",
                f"the sample has {n_images} image(s) but chat template {self.origin} is the "
                f"{self.family} family's, whose models take no images: prep images with their "
                "model's template",
            )
        if n_images and self.images is None:
            raise SampleRejected(
                "template_no_image_family",
                f"the sample has {n_images} image(s) but chat template {self.origin} writes no "
                f"image marker: name the model family with '{self._path_text}#images=FAMILY' "
                f"({', '.join(IMAGE_TOKENS)})",
            )
        marker = self.images.marker if self.images else None
        media = MEDIA_TOKENS.get(self.family or "", {})
        wanted = {m: sum(t.count(PLACEHOLDERS[m]) for _, t in turns) for m in ("video", "audio")}
        for modality, n in wanted.items():
            if n and modality not in media:
                raise SampleRejected(
                    "template_no_media_marker",
                    f"the sample has {n} {modality}(s) but no family known to write "
                    f"{self.origin}'s {modality} marker ({self.family or 'no image family'}): "
                    f"prep counts {modality} in the templates of "
                    f"{', '.join(f for f, m in MEDIA_TOKENS.items() if modality in m) or 'none'}",
                )
        try:
            with bounded(self.limits):
                pieces, size = [], 0
                for piece in self._template.generate(
                    messages=messages_from_turns(
                        turns, self.content, marker, {m: t.marker for m, t in media.items()}
                    ),
                    add_generation_prompt=False,
                    **self.special_tokens,
                ):
                    size += len(piece)
                    if size > self.limits.chars:
                        raise TemplateLimit(
                            f"the rendered text passed the {self.limits.chars}-character limit "
                            "per sample"
                        )
                    pieces.append(piece)
                    tick()
                text = "".join(pieces)
        except TemplateLimit as exc:
            raise SampleRejected(
                "template_limit", f"chat template {self.origin}: {describe(exc)}"
            ) from None
        except Exception as exc:
            raise SampleRejected(
                "template_error",
                f"chat template {self.origin} refuses the conversation: {describe(exc)}",
            ) from None
        for modality, n in wanted.items():
            if n:
                text = self._placed(text, media[modality], PLACEHOLDERS[modality], n, modality)
        if self.images is None:
            return text
        found = text.count(self.images.marker)
        if found != n_images:
            raise SampleRejected(
                "template_image_mismatch",
                f"the chat template wrote {found} {self.images.marker} for {n_images} image(s) "
                "(an image marker in the text, or a template that drops images)",
            )
        wrapped = self.images.prefix + IMAGE_PLACEHOLDER + self.images.suffix
        return text.replace(self.images.marker, wrapped) if wrapped != self.images.marker else text

    @staticmethod
    def _placed(text: str, tokens: ImageTokens, mark: str, n: int, modality: str) -> str:
        """``text`` with each of the ``n`` markers the template wrote for a video or recording
        as prep's placeholder, within the family's wrapper."""
        found = text.count(tokens.marker)
        if found != n:
            raise SampleRejected(
                "template_image_mismatch",
                f"the chat template wrote {found} {tokens.marker} for {n} {modality}(s) (a "
                "marker in the text, or a template that drops them)",
            )
        return text.replace(tokens.marker, tokens.prefix + mark + tokens.suffix)

    def render(self, turns: list[tuple[str, str]]) -> str:
        """The text the model sees, each image one ``<image>`` placeholder with the family's
        wrapper tokens around it (:class:`SampleRejected` if, without generation blocks, an
        answer cannot be found in it: see :meth:`render_spans`)."""
        marked = self._render_marked(turns)
        if GEN_OPEN not in marked:
            self._find_spans(marked, turns)
            return marked
        return marked.replace(GEN_OPEN, "").replace(GEN_CLOSE, "")

    def render_spans(self, turns: list[tuple[str, str]]) -> tuple[str, list[tuple[int, int]]]:
        """Like :meth:`render`, plus the character spans of the trained text: the template's
        ``generation`` blocks, or else each assistant turn's text where it was rendered
        (:class:`SampleRejected` if it was not)."""
        marked = self._render_marked(turns)
        if GEN_OPEN in marked:
            spans, out, pos = [], [], 0
            for piece in re.split(f"([{GEN_OPEN}{GEN_CLOSE}])", marked):
                if piece == GEN_OPEN:
                    start = pos
                elif piece == GEN_CLOSE:
                    spans.append((start, pos))
                else:
                    out.append(piece)
                    pos += len(piece)
            return "".join(out), spans
        return marked, self._find_spans(marked, turns)

    def _find_spans(self, text: str, turns: list[tuple[str, str]]) -> list[tuple[int, int]]:
        """Each assistant turn's text where the template rendered it, searched after the
        previous turns' texts (so a short answer is not found inside the question). Each piece
        between images is looked for as written, else stripped (templates that ``trim`` a text
        item: Gemma, Llama). A user or system text the template changed is skipped; an assistant text
        that is not found is an error: its tokens would silently not be trained."""
        spans, at = [], 0
        for index, (role, content) in enumerate(turns):
            pos, found = at, []
            for piece in _SPLIT.split(content):
                if piece in _MODALITY:
                    continue
                core = piece.strip()
                if not core:
                    continue
                start = text.find(core, pos)  # the earliest place, as a trimming template has it
                if start < 0:
                    break
                lead = len(piece) - len(piece.lstrip())
                if start - lead >= pos and text.startswith(piece, start - lead):
                    start, core = start - lead, piece  # there as written, whitespace and all
                pos = start + len(core)
                found.append((start, pos))
            else:
                at = pos
                if role == "assistant":  # each text piece, not the images between them
                    spans += found
                continue
            if role == "assistant":
                raise SampleRejected(
                    "assistant_not_rendered",
                    f"turn {index}: the chat template changes or drops the assistant's text, "
                    "so its trained tokens cannot be found; give the template "
                    "{% generation %} blocks around the assistant's text",
                )
        return spans

    def describe(self) -> dict:
        return {
            "name": self.name,
            "kind": "jinja",
            "source": str(self.origin.resolve()),
            "sha256": self.sha256,
            "image_tokens": self.family,
            "content": self.content,
            "special_tokens": self.special_tokens,
        }
