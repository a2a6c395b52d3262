"""``ChatTemplate`` (the built-in fallbacks and JSON field templates) and ``load_template``.

References: the rendered text written out by hand for each case (an independent formula: role
prefix + content + suffix per turn, image markers around every ``<image>``); the file-size
limit (1 MiB) at, below and above it.

Bugs these catch (each survived the earlier selection under cosmic-ray): image markers added
only when both a prefix and a suffix are set (or when neither is); the default system prompt
added before a conversation that opens with its own; a prefix table with one non-text key or
value accepted; a prefix with an extra role refused; every file routed to the Jinja reader
(``suffix != ".jinja"``) or none; a model directory or a ``#images=`` suffix read as JSON; the
1 MiB limit off by any amount; an unreadable file raising its own ``OSError`` instead of the
one-line message; the fields positional."""

from __future__ import annotations

import json
import os
import re

import pytest

import dataprep.chat_template as ct
from dataprep.chat_template import BUILTIN_TEMPLATES, ChatTemplate, load_template
from dataprep.jinja_template import JinjaChatTemplate

PREFIX = {"system": "S:", "user": "U:", "assistant": "A:"}
TURNS = [("user", "look <image> here"), ("assistant", "a cat"), ("user", "<image>?")]


def hand_rendered(pre: str, suf: str, system: str | None = None, bos: str = "") -> str:
    img = f"{pre}<image>{suf}"
    head = f"S:{system}|" if system is not None else ""
    return f"{bos}{head}U:look {img} here|A:a cat|U:{img}?|"


@pytest.mark.parametrize(("pre", "suf"), [("", ""), ("<i>", ""), ("", "</i>"), ("<i>", "</i>")])
def test_image_markers_surround_every_image_whichever_is_set(pre, suf):
    t = ChatTemplate(name="t", prefix=PREFIX, suffix="|", image_prefix=pre, image_suffix=suf)
    assert t.render(TURNS) == hand_rendered(pre, suf)
    text, spans = t.render_spans(TURNS)
    assert text == t.render(TURNS)
    assert [text[a:b] for a, b in spans] == ["a cat"]


def test_the_system_prompt_is_added_only_when_the_conversation_has_none():
    t = ChatTemplate(name="t", bos="<s>", system_prompt="be kind", prefix=PREFIX, suffix="|")
    assert t.render(TURNS) == hand_rendered("", "", "be kind", "<s>")
    role = json.loads('"system"')  # a role as data gives it: equal to, not the literal
    own = [(role, "mine"), *TURNS]
    assert t.render(own) == "<s>S:mine|" + hand_rendered("", "")
    assert t.render([]) == "<s>S:be kind|"
    for turns in (TURNS, own, []):
        text, spans = t.render_spans(turns)
        assert text == t.render(turns)
        assert [text[a:b] for a, b in spans] == (["a cat"] if turns else [])


@pytest.mark.parametrize(
    "prefix",
    [
        {**PREFIX, "user": 1},
        {**PREFIX, 7: "x"},
        {**PREFIX, "assistant": None},
    ],
)
def test_a_prefix_with_one_entry_not_text_is_refused(prefix):
    with pytest.raises(ValueError, match=r"\['prefix'\] must be text"):
        ChatTemplate(name="t", prefix=prefix)


def test_a_prefix_needs_the_three_roles_and_may_have_more():
    with pytest.raises(ValueError, match=r"lacks a prefix for role\(s\) \['assistant'\]"):
        ChatTemplate(name="t", prefix={"system": "", "user": ""})
    tool = ChatTemplate(name="t", prefix={**PREFIX, "tool": "T:"}, suffix="|")
    assert tool.render([("tool", "x")]) == "T:x|"


def test_only_assistant_turns_are_targets_whatever_the_other_roles_are_called():
    """The training targets are the contents of turns whose role equals ``assistant``: a role
    given as data (not the interned literal) counts; roles sorting before or after it do not."""
    roles = json.loads('["agent", "assistant", "tool", "user", "assistant"]')
    t = ChatTemplate(
        name="t", prefix={**PREFIX, "agent": "G:", "tool": "T:"}, suffix="|", image_prefix="<i>"
    )
    turns = [(role, f"c{i}") for i, role in enumerate(roles)]
    text, spans = t.render_spans(turns)
    assert text == "G:c0|A:c1|T:c2|U:c3|A:c4|"
    assert [text[a:b] for a, b in spans] == ["c1", "c4"]


def test_a_template_is_frozen():
    """The built-ins are shared by every caller: none may change one in place."""
    import dataclasses

    with pytest.raises(dataclasses.FrozenInstanceError):
        BUILTIN_TEMPLATES["chatml"].suffix = "x"  # type: ignore[misc]


def test_the_fields_are_keyword_only():
    with pytest.raises(TypeError):
        ChatTemplate("t")  # type: ignore[misc]


def test_builtins_by_name_are_the_same_objects():
    for name, tmpl in BUILTIN_TEMPLATES.items():
        assert load_template(name) is tmpl and tmpl.name == name


def _fields_file(path, size: int | None = None):
    text = json.dumps({"prefix": PREFIX, "suffix": "|"})
    if size is not None:
        text += " " * (size - len(text))  # JSON allows trailing white space
    path.write_text(text)
    return path


@pytest.mark.parametrize("name", ["tmpl.json", "tmpl.txt", "tmpl", "tmpl.jinja2"])
def test_a_fields_file_is_a_chat_template_named_by_its_stem(tmp_path, name):
    got = load_template(str(_fields_file(tmp_path / name)))
    assert type(got) is ChatTemplate and got.name == "tmpl"
    assert got.render([("user", "hi")]) == "U:hi|"


JINJA = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"


def test_jinja_templates_by_suffix_key_directory_or_settings(tmp_path):
    jinja = tmp_path / "chat_template.jinja"
    jinja.write_text(JINJA)
    keyed = tmp_path / "keyed.json"
    keyed.write_text(json.dumps({"chat_template": JINJA}))
    model = tmp_path / "model"
    model.mkdir()
    (model / "chat_template.jinja").write_text(JINJA)
    for spec in (str(jinja), str(keyed), str(model), f"{jinja}#content=string"):
        got = load_template(spec)
        assert isinstance(got, JinjaChatTemplate), spec
        assert got.render([("user", "hi")]) == "[user]hi", spec


def test_a_settings_suffix_names_the_file_before_it(tmp_path):
    """``PATH#...``: the file is PATH (a missing PATH is refused by the Jinja reader, naming
    it), never the text after ``#``."""
    with pytest.raises(ValueError, match="nowhere"):
        load_template(f"{tmp_path / 'nowhere.jinja'}#content=string")


@pytest.mark.parametrize("size", [(1 << 20) - 1, 1 << 20])
def test_a_fields_file_up_to_one_mib_loads(tmp_path, size):
    path = _fields_file(tmp_path / "big.json", size)
    assert os.path.getsize(path) == size
    assert load_template(str(path)).render([("user", "hi")]) == "U:hi|"


def test_a_fields_file_past_one_mib_is_refused_naming_it(tmp_path):
    path = _fields_file(tmp_path / "big.json", (1 << 20) + 1)
    with pytest.raises(ValueError, match=r"template file .*big\.json: .*1048577 bytes"):
        load_template(str(path))


def test_an_unknown_name_or_path_is_refused_with_the_choices(tmp_path):
    with pytest.raises(ValueError, match=r"unknown template .*'chatml'"):
        load_template(str(tmp_path / "absent.json"))


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"{not json", "Expecting"),
        (b'{"prefix": "\xff"}', "utf-8"),
        (b"[" * 100_000 + b"]" * 100_000, "recursion|depth|nest"),
        (json.dumps({"prefix": PREFIX, "colour": "red"}).encode(), "colour"),
    ],
)
def test_a_bad_fields_file_gets_one_line_naming_it(tmp_path, content, why):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=r"template file .*bad\.json") as err:
        load_template(str(path))
    assert "\n" not in str(err.value)
    assert re.search(why, str(err.value), flags=re.IGNORECASE), str(err.value)


def test_a_file_that_cannot_be_read_gets_the_one_line_message(tmp_path, monkeypatch):
    path = _fields_file(tmp_path / "t.json")

    def fail(*_a, **_k):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(ct, "read_small", fail)
    with pytest.raises(ValueError, match=r"template file .*t\.json: .*Permission denied"):
        load_template(str(path))


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "t.json"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match=r"unknown template .*t\.json"):
        load_template(str(fifo))  # not a regular file: never opened
