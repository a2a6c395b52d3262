"""A chat template is someone else's code: rendering it has a time and a size limit per sample
(issue #37 items 7 and 14). A template past a limit is that sample's errors row naming the
limit; the run goes on; nothing reaches the tokenizer larger than the limit; and an error never
says nothing (a MemoryError or an empty raise_exception)."""

from __future__ import annotations

import json
import time
import tracemalloc

import pyarrow.parquet as pq
import pytest

from dataprep import PrepConfig, run_prep
from dataprep.chat_template import load_template
from dataprep.errors import SampleRejected, describe
from equishard.contracts.cost_table import errors_path

TURNS = [("user", "<image>\nwhat is it?"), ("assistant", "a cat")]
BODY = (
    "{% for m in messages %}{{ m.role }}: {% for c in m.content %}{% if c.type == 'image' %}"
    "<|image_pad|>{% else %}{{ c.text }}{% endif %}{% endfor %}\n{% endfor %}"
)

HOSTILE = {
    "three nested ranges": "{% for a in range(99999) %}{% for b in range(99999) %}"
    "{% for c in range(99999) %}{% endfor %}{% endfor %}{% endfor %}",
    "range past the sandbox's size": "{% for a in range(10**9) %}{% endfor %}",
    "a loop over a long string": "{% set s = 'ab' * 1000000 %}{% for a in s %}{% for b in s %}"
    "{% endfor %}{% endfor %}",
    "strftime_now with a huge format": "{{ strftime_now('%Y' * 20000000) }}",
    "strftime_now with a long format": "{{ strftime_now('%Y' * 1000) }}",
    "300 MB of output": "{% for i in range(30000) %}{{ 'x' * 10000 }}{% endfor %}",
    "a huge power": "{{ 7 ** 100000000 }}",
    "doubling by +": "{% set ns = namespace(s='x') %}{% for i in range(40) %}"
    "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}",
}
# Values of gigabytes built in one step, before the time limit can see them (each rendered,
# or died of a MemoryError or the OOM killer, before these limits): the size of every value an
# operation, a filter or a method builds, and every number that sizes one, is checked first.
BUILT_HUGE = {
    "doubling by ~": "{% set ns = namespace(s='x') %}{% for i in range(40) %}"
    "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
    "a % format's width": "{{ ('%01000000000d' % 1) | length }}",
    "a % format's width taken from its arguments": "{{ ('%0*d' % (1000000000, 1)) | length }}",
    "str.format's width": "{{ '{:>1000000000}'.format('x') | length }}",
    "the replace filter multiplying": "{{ ('x' * 4000000) | replace('x', 'x' * 4000) | length }}",
    "str.replace multiplying": "{{ ('x' * 4000000).replace('x', 'x' * 4000) | length }}",
    "the center filter's width": "{{ 'x' | center(1000000000) | length }}",
    "str.zfill's width": "{{ 'x'.zfill(1000000000) | length }}",
    "indenting many lines": "{{ ('\\n' * 1000000) | indent(4000, true) | length }}",
    "joining a range with a long separator": "{{ range(99999) | join('x' * 1000) | length }}",
    "a list repeating a long string": "{{ (['x' * 1000000] * 1000) | length }}",
    "a long string printed many times": "{% set s = 'x' * 1000000 %}"
    "{{ [s, s, s, s, s] | string | length }}",
    "a tower of powers": "{{ ((2 ** 4096) ** 4096) ** 4096 > 1 }}",
}
HOSTILE |= BUILT_HUGE


def _template(tmp_path, body: str):
    path = tmp_path / "t.jinja"
    path.write_text(BODY + body)
    return load_template(f"{path}#images=qwen2vl")


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_template_past_a_limit_rejects_the_sample_naming_it(tmp_path, monkeypatch, case):
    """Bug: a template looped for hours, or rendered hundreds of MB that the tokenizer then
    aborted the whole process on (exit 134, no errors table)."""
    monkeypatch.setenv("EQUISHARD_TEMPLATE_SECONDS", "1")
    t = _template(tmp_path, HOSTILE[case])
    t0 = time.monotonic()
    with pytest.raises(SampleRejected) as e:
        t.render(TURNS)
    assert time.monotonic() - t0 < 10
    assert e.value.reason == "template_limit"
    assert "limit" in str(e.value) and str(tmp_path / "t.jinja") in str(e.value)


@pytest.mark.parametrize("case", sorted(BUILT_HUGE))
def test_a_value_past_the_size_limit_is_refused_before_it_is_built(tmp_path, monkeypatch, case):
    """Bug: such a value was built (a gigabyte, or until memory ran out) and refused, if at all,
    only afterwards, by the time limit or the size of the output. Python's allocations while
    the sample renders stay within a few times the limit (4 M characters)."""
    monkeypatch.setenv("EQUISHARD_TEMPLATE_SECONDS", "5")
    t = _template(tmp_path, BUILT_HUGE[case])
    tracemalloc.start()
    try:
        with pytest.raises(SampleRejected) as e:
            t.render(TURNS)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert e.value.reason == "template_limit"
    assert "took longer" not in str(e.value)  # refused for its size, not timed out
    assert peak < 64 << 20, f"{peak / 2**20:.0f} MiB allocated"


def test_the_limits_leave_a_normal_template_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("EQUISHARD_TEMPLATE_SECONDS", "1")
    t = _template(tmp_path, "{% for i in range(50) %}{{ 'ab' * 20 }}{% endfor %}")
    assert t.render(TURNS).startswith("user: <image>")
    # values up to the limit (4,194,304 characters) are built and measured as ever
    near = "{{ ('x' * 4000000) | replace('x', 'y') | length }} {{ '%05d' % 7 }} {{ 'a' ~ 'b' }}"
    assert _template(tmp_path, near).render(TURNS).endswith("4000000 00007 ab")


def test_a_template_too_large_to_compile_is_refused_at_load(tmp_path):
    path = tmp_path / "big.jinja"
    path.write_text(BODY + "x" * (2 << 20))
    with pytest.raises(ValueError, match="more than the"):
        load_template(f"{path}#images=qwen2vl")


def test_errors_never_say_nothing(tmp_path):
    """Bug: a MemoryError became ``chat template X: `` with nothing after the colon."""
    assert describe(MemoryError()) == "MemoryError"
    assert describe(KeyError("k")) == "KeyError: 'k'"
    assert describe(ValueError("why")) == "why"
    t = _template(tmp_path, "{{ raise_exception('') }}")
    with pytest.raises(SampleRejected) as e:
        t.render(TURNS)
    detail = str(e.value)
    assert e.value.reason == "template_error"
    assert detail.rstrip().endswith("TemplateError") and str(tmp_path / "t.jinja") in detail


def test_prep_goes_on_past_a_hostile_sample(tmp_path, monkeypatch, tokenizer_path):
    """In prep, the sample whose conversation makes the template loop is its errors row with the
    limit named; every other sample is measured (in = written + rejected)."""
    monkeypatch.setenv("EQUISHARD_TEMPLATE_SECONDS", "1")
    path = tmp_path / "t.jinja"
    path.write_text(
        "{% for m in messages %}{% if m.role == 'user' and 'LOOP' in m.content[0].text %}"
        "{% for a in range(99999) %}{% for b in range(99999) %}{% endfor %}{% endfor %}"
        "{% endif %}{{ m.role }}: {% for c in m.content %}{% if c.type == 'image' %}"
        "<|image_pad|>{% else %}{{ c.text }}{% endif %}{% endfor %}\n{% endfor %}"
    )
    data = tmp_path / "d.jsonl"
    rows = [
        {"id": f"s{i}", "conversations": [
            {"from": "human", "value": "LOOP please" if i == 3 else f"question {i}"},
            {"from": "gpt", "value": "answer"}]}
        for i in range(6)
    ]  # fmt: skip
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "c.parquet"
    res = run_prep(PrepConfig(inputs=(str(data),), output=str(out), tokenizer=tokenizer_path,
                              template=f"{path}#images=qwen2vl", vision_policy="qwen2vl",
                              max_error_rate=0.5))  # fmt: skip
    assert (res.n_in, res.n_written, res.n_rejected) == (6, 5, 1)
    errs = pq.read_table(errors_path(out)).to_pylist()
    assert [(e["sample_id"], e["reason"]) for e in errs] == [("s3", "template_limit")]
    assert "1 s limit" in errs[0]["detail"]
