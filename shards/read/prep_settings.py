"""The settings a generation's costs were measured with, read back from its manifest, so a
consumer (the collator, the Hugging Face packer, ``equishard train``) builds what prep measured or
refuses at construction.

The manifest's ``prep`` section is what ``equishard prep`` recorded in the cost table: the vision
policy (its spec and every field), the template (built-in fields, or a Jinja template's spec,
source path and sha256) and the tokenizer (path and sha256). It comes from outside, so every
value is checked where it enters (:meth:`PrepSettings.from_manifest`). A consumer may name its
own tokenizer, template or policy (a copy on another machine, a directory instead of a file):
each is compared with the recorded one by what decides the counts (the tokenizer's and the
template's bytes, the policy's fields), and a difference is an error that names both values.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from equishard.common.errors import EquishardError
from equishard.common.local_files import regular_file

__all__ = ["PrepSettings", "SettingsMismatch"]

_SHA256 = re.compile(r"[0-9a-f]{64}")


class SettingsMismatch(EquishardError, ValueError):
    """A consumer's setting differs from the one the generation's costs were measured with."""


def _text(d: dict, key: str, where: str, *, required: bool = True) -> str | None:
    v = d.get(key)
    if v is None and not required:
        return None
    if not isinstance(v, str) or not v or len(v) > 4096 or "\x00" in v:
        raise ValueError(f"{where}: {key} must be a non-empty string, got {v!r:.80}")
    return v


def _digest(d: dict, key: str, where: str, *, required: bool = False) -> str | None:
    v = d.get(key)
    if v is None and not required:
        return None
    if not isinstance(v, str) or not _SHA256.fullmatch(v):
        raise ValueError(f"{where}: {key} must be a sha256 hex digest, got {v!r:.80}")
    return v


def _ratio(tok: dict, where: str) -> float:
    v = tok.get("chars_per_token")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
        raise ValueError(f"{where}: tokenizer chars_per_token must be a number > 0, got {v!r:.80}")
    return float(v)


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(regular_file(path, "tokenizer.json")).read_bytes()).hexdigest()


@dataclass(frozen=True, kw_only=True)
class PrepSettings:
    """What prep measured with: ``vision_policy`` (the recorded fields, ``spec`` among them),
    ``template`` (its spec: a built-in name or ``PATH[#options]``) with ``template_fields`` (a
    built-in's fields) or ``template_sha256`` (a Jinja template's source), and ``tokenizer``
    (a path, None for the estimate mode) with ``tokenizer_sha256``."""

    where: str
    vision_policy: dict
    template: str
    template_fields: dict
    template_sha256: str | None = None
    tokenizer: str | None = None
    tokenizer_sha256: str | None = None
    tokenizer_estimate: float | None = None  # chars per token, when prep estimated text tokens
    audio_rule: dict | None = None  # the audio rule's recorded fields (``spec`` among them)
    video_rule: dict | None = None

    @classmethod
    def from_manifest(cls, manifest) -> PrepSettings:
        """The recorded settings of an open generation (:func:`shards.open_generation`); an
        error naming the generation when it records none or records them malformed."""
        where = f"{manifest.path}: manifest prep settings"
        prep = manifest.raw.get("prep")
        if not isinstance(prep, dict) or not prep:
            raise ValueError(
                f"{manifest.path}: the manifest records no prep settings (written from a cost "
                "table another tool made?); give the tokenizer, template and vision policy "
                "prep used explicitly"
            )
        pol, tmpl, tok = (prep.get(k) for k in ("vision_policy", "template", "tokenizer"))
        if not isinstance(pol, dict) or not isinstance(tmpl, dict) or not isinstance(tok, dict):
            raise ValueError(f"{where}: vision_policy, template and tokenizer must be objects")
        _text(pol, "spec", f"{where} (vision_policy)")
        jinja = tmpl.get("kind") == "jinja"
        media = {}
        for key in ("audio_rule", "video_rule"):  # where prep measured recordings or videos
            rule = prep.get(key)
            if rule is not None:
                if not isinstance(rule, dict):
                    raise ValueError(f"{where}: {key} must be an object, got {rule!r:.80}")
                _text(rule, "spec", f"{where} ({key})")
                media[key] = rule
        tok_mode = tok.get("mode")
        if tok_mode not in ("tokenizer", "estimate"):
            raise ValueError(f"{where}: tokenizer mode must be tokenizer or estimate")
        return cls(
            where=str(manifest.path),
            vision_policy=pol,
            template=_text(tmpl, "name", f"{where} (template)"),
            template_fields=tmpl,
            # prep records both digests; without one, any file would pass as the one it counted
            template_sha256=(
                _digest(tmpl, "sha256", f"{where} (template)", required=True) if jinja else None
            ),
            tokenizer=_text(tok, "path", f"{where} (tokenizer)")
            if tok_mode == "tokenizer"
            else None,
            tokenizer_sha256=_digest(
                tok, "sha256", f"{where} (tokenizer)", required=tok_mode == "tokenizer"
            ),
            tokenizer_estimate=None if tok_mode == "tokenizer" else _ratio(tok, where),
            **media,
        )

    def tokenizer_spec(self) -> str:
        """What prep's ``--tokenizer`` was: the recorded path, or its estimate."""
        if self.tokenizer is not None:
            return self.tokenizer
        return f"estimate:chars_per_token={self.tokenizer_estimate!r}"

    def resolve_tokenizer(self, given: str | None = None) -> str:
        """The tokenizer file to use: ``given`` (a file or a model directory) or the recorded
        path, whose bytes must be the ones prep counted with."""
        from dataprep.text_tokens import TokenizerSpec

        if self.tokenizer is None:
            raise SettingsMismatch(
                f"{self.where}: prep estimated text tokens (no tokenizer), so no collator can "
                "build rows of the lengths it counted; prep again with --tokenizer"
            )
        path = Path(TokenizerSpec.parse(given).path if given else self.tokenizer)
        if not path.is_file():
            raise ValueError(
                f"tokenizer {path} (from {'the caller' if given else self.where}) not found; "
                "pass the tokenizer prep counted with (its file or model directory)"
            )
        if self.tokenizer_sha256 and _file_sha256(path) != self.tokenizer_sha256:
            raise SettingsMismatch(
                f"tokenizer {path} is not the one the generation was measured with "
                f"({self.tokenizer}, sha256 {self.tokenizer_sha256[:12]}...): its token "
                "counts, and so the balance, would not match"
            )
        return str(path)

    def resolve_template(self, given: str | None = None):
        """The template object: ``given`` (a spec) or the recorded one, which must render what
        prep rendered (same built-in fields, or same Jinja source and options)."""
        from dataprep.chat_template import load_template
        from dataprep.jinja_template import RENDERING_KEYS

        spec = given or self.template
        try:
            tmpl = load_template(spec)
        except (OSError, ValueError) as exc:
            raise ValueError(
                f"template {spec!r} (from {'the caller' if given else self.where}): {exc}"
            ) from None
        have = json.loads(json.dumps(tmpl.describe()))
        keys = RENDERING_KEYS if self.template_sha256 else tuple(self.template_fields)
        diff = [k for k in keys if have.get(k) != self.template_fields.get(k)]
        if diff:
            raise SettingsMismatch(
                f"template {spec!r} differs from the one the generation was measured with "
                f"({self.template!r}"
                + (f", sha256 {self.template_sha256[:12]}..." if self.template_sha256 else "")
                + f"; differing: {', '.join(diff)}): the rows would hold other text than prep "
                "counted"
            )
        return spec, tmpl

    def resolve_policy(self, given: str | None = None) -> str:
        """The vision policy spec: ``given`` or the recorded one; a given policy must have the
        recorded fields (``internvl`` and ``internvl:max_tiles=12`` are one policy)."""
        from dataprep.policies import parse_vision_policy

        spec = given or self.vision_policy["spec"]
        have = json.loads(json.dumps(parse_vision_policy(spec).describe()))
        if have != self.vision_policy:
            if have.get("kind") != self.vision_policy.get("kind"):
                diff = [f"the family, {have.get('kind')} vs {self.vision_policy.get('kind')}"]
            else:
                diff = sorted(
                    f"{k} {have.get(k)!r} vs {self.vision_policy.get(k)!r}"
                    for k in set(have) | set(self.vision_policy)
                    if k != "spec" and have.get(k) != self.vision_policy.get(k)
                )
            raise SettingsMismatch(
                f"vision policy {spec!r} differs from the generation's "
                f"{self.vision_policy['spec']!r} (measured with it; differing: "
                f"{', '.join(diff) or 'kind'}): images would become other token counts than "
                "the plan balanced"
            )
        return spec

    def resolve_rule(self, what: str) -> str | None:
        """The spec of the ``audio`` or ``video`` rule prep measured those items with (None: it
        measured none); the recorded fields must be the ones the spec gives, or the recorded
        rule is not one this version builds the same inputs and counts with."""
        from dataprep.media_rules import parse_audio_rule, parse_video_rule

        recorded = self.audio_rule if what == "audio" else self.video_rule
        if recorded is None:
            return None
        spec = recorded["spec"]
        where = f"{self.where}: manifest prep settings ({what}_rule)"
        parse = parse_audio_rule if what == "audio" else parse_video_rule
        try:
            have = json.loads(json.dumps(parse(spec).describe()))
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        if have != recorded:
            diff = sorted(k for k in set(have) | set(recorded) if have.get(k) != recorded.get(k))
            raise SettingsMismatch(
                f"{where}: the recorded rule {spec!r} differs from what this version makes of "
                f"it (differing: {', '.join(diff)}): its {what} counts would not be the ones "
                "measured; prep the generation again with this version"
            )
        return spec
