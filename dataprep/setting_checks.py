"""Prep's settings checked against each other before anything is measured.

A cost table is only as good as the agreement of its three settings with the model that will
train on it: the chat template (the text around each turn and the image marker its processor
expands), the vision policy (how many tokens each image becomes) and the tokenizer. Each of these
mismatches passes silently through a whole prep, balance and write, and shows only as lengths
that differ from the model's at training time:

* the template writes one family's image marker and the policy is another family's (a Qwen
  template with InternVL tiling): refused, naming both;
* the tokenizer splits a token the template writes as one (the template's ``<|im_start|>`` or its
  image marker missing from the tokenizer: a tokenizer of another model): a warning per token;
* no ``--template`` while the tokenizer's own directory ships a chat template (the built-in
  ``chatml`` fallback is 9 tokens off Qwen's template on every sample): a warning naming it.
"""

from __future__ import annotations

import re
from pathlib import Path

from dataprep.families.registry import POLICY_TEMPLATE_FAMILIES  # policy -> its templates

__all__ = [
    "POLICY_TEMPLATE_FAMILIES",
    "check_family",
    "check_rules",
    "check_settings",
    "settings_summary",
]

_SPECIAL_LITERAL = re.compile(r"<\|[A-Za-z0-9_]+\|>")


def _policy_name(spec: str) -> str:
    return spec.partition(":")[0]


def _template_tokens(template) -> list[str]:
    """Strings the template writes that its model's tokenizer holds as single tokens: its
    special-token variables, the image, video and recording markers and their wrapper tokens,
    ``<|...|>`` literals."""
    from dataprep.families.registry import MEDIA_TOKENS

    found = [t for t in getattr(template, "special_tokens", {}).values() if t]
    images = getattr(template, "images", None)
    source = getattr(template, "source", "")
    media = MEDIA_TOKENS.get(getattr(template, "family", None) or "", {})
    written = [m for m in media.values() if m.marker in source]  # a family's: where it writes one
    for marks in ([images] if images is not None else []) + written:
        found += [marks.marker, *marks.prefix.split(), *marks.suffix.split()]
    found += _SPECIAL_LITERAL.findall(source)
    return list(dict.fromkeys(t for t in found if t))


def _shipped_template(tokenizer_path: str) -> Path | None:
    """The chat template shipped beside a tokenizer.json, if any."""
    from dataprep.jinja_template import _FILES, _load

    folder = Path(tokenizer_path).parent
    for name in _FILES:
        f = folder / name
        if f.is_file() and (f.suffix == ".jinja" or "chat_template" in _load(f)):
            return f
    return None


def check_family(template, template_spec: str, policy_spec: str) -> None:
    """Refuses a template whose image marker is another model family's than the vision
    policy's (prep and every consumer that renders with a template and counts images)."""
    family = getattr(template, "family", None)
    if getattr(template, "images", None) is None:  # no image marker: it counts no images
        return
    name = _policy_name(policy_spec)
    expected = POLICY_TEMPLATE_FAMILIES.get(name)
    if family is not None and expected is not None and family not in expected:
        raise ValueError(
            f"template {template_spec} writes the {family} family's image marker, but "
            f"vision policy {policy_spec} counts images as {name} does (its templates are "
            f"{' or '.join(expected)}): the lengths would mix one model's text with another's "
            "images. Use the template and the vision policy of the model you train"
        )


def check_rules(template, template_spec: str, rules: dict[str, str | None]) -> None:
    """Refuses a video or audio rule (``rules``: modality -> spec) that is not the processor of
    the model whose template writes that medium's marker: a rule some families name as their
    processor's (``FamilySpec.video_rules`` / ``audio_rules``) beside another family's
    template, or a rule none of the template's families name where they name theirs (Gemma 4's
    recordings counted by a Whisper rule). Rules no family names (the Whisper-style ones, whose
    features several processors make) go with any template that writes the marker."""
    from dataprep.families.registry import FAMILIES, rule_owners

    family = getattr(template, "family", None)
    if family is None:
        return
    mine = [f for f in FAMILIES.values() if f.template == family]
    for modality, spec in rules.items():
        if not spec:
            continue
        name = spec.partition(":")[0]
        owners = [f.name for f in rule_owners(modality, name)]
        theirs = sorted({r for f in mine for r in getattr(f, f"{modality}_rules")})
        wrong = (owners and not {f.name for f in mine} & set(owners)) or (
            theirs and name not in theirs
        )
        if wrong:
            raise ValueError(
                f"--{modality}-rule {name} measures "
                f"{'the ' + ' and '.join(owners) + ' processor' if owners else 'Whisper-style features'}"
                f", but template {template_spec} is the {family} family's"
                f"{' (its ' + modality + ' rules: ' + ', '.join(theirs) + ')' if theirs else ''}:"
                " one prep measures one model's inputs; use the rule and the template of the "
                "model you train"
            )


def check_settings(
    template_spec: str,
    policy_spec: str,
    tokenizer: str | None,
    video_rule: str | None = None,
    audio_rule: str | None = None,
) -> list[str]:
    """Refuses (``ValueError``) a template and vision policy of different model families, and
    a video or audio rule of another model than the template's; returns the warnings about the
    tokenizer and a forgotten ``--template``."""
    from dataprep.chat_template import BUILTIN_TEMPLATES, load_template

    template = load_template(template_spec)
    check_family(template, template_spec, policy_spec)
    check_rules(template, template_spec, {"video": video_rule, "audio": audio_rule})
    warnings: list[str] = []
    if not tokenizer or tokenizer.startswith("estimate"):
        return warnings
    from tokenizers import Tokenizer

    from dataprep.text_tokens import TokenizerSpec

    tokenizer = TokenizerSpec.parse(tokenizer).path  # a model directory: its tokenizer.json
    tok = Tokenizer.from_file(tokenizer)
    for text in _template_tokens(template):
        n = len(tok.encode(text, add_special_tokens=False).ids)
        if n != 1:
            warnings.append(
                f"the tokenizer {tokenizer} splits {text!r}, which the template writes, into "
                f"{n} tokens: it is not the tokenizer of the template's model (every sample's "
                "count is off); pass that model's tokenizer.json"
            )
    shipped = _shipped_template(tokenizer)
    if template_spec in BUILTIN_TEMPLATES and shipped is not None:
        warnings.append(
            f"no --template given, but the tokenizer's folder ships its model's chat template "
            f"({shipped}); the built-in {template_spec!r} renders other text around each turn. "
            f"Pass --template {shipped.parent}"
        )
    return warnings


def settings_summary(template_spec: str, policy_spec: str, tokenizer: str | None) -> dict:
    """What prep measured with, in a line each for the summary (and ``--json``)."""
    from dataprep.chat_template import load_template
    from dataprep.policies import parse_vision_policy

    t = load_template(template_spec).describe()
    kind = t.get("kind", "builtin")
    template = f"{t.get('name', template_spec)} ({kind}"
    if t.get("image_tokens"):
        template += f", images: {t['image_tokens']}"
    if t.get("content"):
        template += f", content: {t['content']}"
    template += ")"
    return {
        "template": template,
        "vision_policy": parse_vision_policy(policy_spec).describe()["spec"],
        "tokenizer": tokenizer or "",
    }
