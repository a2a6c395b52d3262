"""The README and the docs site (``docs/``): every Python block is a named snippet that a test
below runs as written on tiny data (only paths, and sizes a CPU cannot train, swapped); every
``equishard`` command line in a shell block parses with the CLI's own argparse definitions;
JSON blocks parse; the site builds with ``mkdocs build --strict`` (no broken link or reference);
the vision-policy table names every registered policy; the README stays a front page."""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from equishard.cli import build_parser, main
from shards import GroupDataset, RankInfo, open_generation
from tests.shards.conftest import build_inputs, s3_env

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
MARKER = re.compile(r"<!-- snippet: ([\w-]+) -->")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    name: str | None
    code: str

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(pages=PAGES) -> list[Block]:
    """Every fenced code block of the pages, with the snippet name written just above it."""
    out = []
    for page in pages:
        lines = page.read_text().splitlines()
        i = 0
        while i < len(lines):
            fence = lines[i].lstrip()
            if not fence.startswith("```"):
                i += 1
                continue
            indent = len(lines[i]) - len(fence)
            prev = next((ln for ln in reversed(lines[:i]) if ln.strip()), "")
            m = MARKER.fullmatch(prev.strip())
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            code = "\n".join(ln[indent:] for ln in lines[i + 1 : end]) + "\n"
            out.append(Block(page, i + 1, fence[3:].strip(), m and m.group(1), code))
            i = end + 1
    return out


def snippet(name: str) -> str:
    found = [b for b in blocks() if b.name == name]
    assert found, f"no page has the snippet {name!r}"
    return found[0].code


# the snippets the tests below run; every Python block must be one of them
RUN = {
    "hf-trainer",
    "torchtitan",
    "energon",
    "loader-loop",
    "loader-raw",
    "quickstart-loop",
    "s3-loader",
}
RUN_SHELL = {"quickstart-cli"}


def test_every_python_block_is_a_snippet_a_test_runs():
    bad = [
        f"{b.where()} ({b.name or 'no snippet marker'})"
        for b in blocks()
        if b.lang == "python" and b.name not in RUN
    ]
    assert not bad, "Python blocks no test runs: " + ", ".join(bad)
    named = {b.name for b in blocks() if b.name}
    assert named >= RUN | RUN_SHELL, f"snippets the tests expect but no page has: {RUN - named}"


def test_blocks_of_one_name_are_the_same_code():
    by_name: dict[str, set[str]] = {}
    for b in blocks():
        if b.name:
            by_name.setdefault(b.name, set()).add(b.code)
    assert all(len(codes) == 1 for codes in by_name.values()), [
        n for n, c in by_name.items() if len(c) > 1
    ]


def _commands(code: str) -> list[list[str]]:
    """The ``equishard ...`` command lines of a shell block, continuation lines joined, each
    cut at a shell operator or comment."""
    out = []
    for line in code.replace("\\\n", " ").splitlines():
        m = re.search(r"(?:^|[\s/])(equishard [a-z])", line)
        if m is None or line.lstrip().startswith("#"):
            continue
        cmd = re.sub(r"\$\([^)]*\)", "X", line[m.start(1) :])  # $(date +%F) is one word
        words = shlex.split(cmd, comments=True)
        stop = next(
            (i for i, w in enumerate(words) if w in {"|", "||", "&&", ";", ">", ">>", "2>&1"}),
            len(words),
        )
        out.append(words[1:stop])
    return out


def test_every_equishard_command_in_the_docs_parses():
    parser = build_parser()
    seen = 0
    for b in blocks():
        if b.lang not in ("bash", "sh", "cron", "console"):
            continue
        for args in _commands(b.code):
            seen += 1
            try:
                parser.parse_args(args)
            except SystemExit:
                pytest.fail(f"{b.where()}: 'equishard {' '.join(args)}' does not parse")
    assert seen >= 10


def test_json_blocks_parse():
    for b in blocks():
        if b.lang == "json":
            json.loads(b.code)


def test_the_vision_policy_table_names_every_policy():
    from dataprep.policies.registry import POLICIES

    text = (ROOT / "docs/preparing/vision-policies.md").read_text()
    rows = set(re.findall(r"^\| `([\w-]+)(?::[^`]*)?` \|", text, re.M))
    assert set(POLICIES) | {"fixed"} <= rows, set(POLICIES) - rows


def test_the_readme_is_a_front_page_whose_links_resolve():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if "://" not in target:
            assert (ROOT / target).exists(), f"README links to a missing {target}"
    # the quick start is the docs' quick start
    for name in ("quickstart-cli", "quickstart-loop"):
        assert f"<!-- snippet: {name} -->" in text


def test_the_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    cli = (tmp_path / "site/reference/cli/index.html").read_text()
    sub = next(a for a in build_parser()._actions if hasattr(a, "choices") and a.choices)
    for name in sub.choices:  # the CLI page is generated from every subcommand's parser
        assert f"equishard {name}" in cli
    api = (tmp_path / "site/reference/api/index.html").read_text()
    for name in ("GroupDataset", "post_balance", "run_prep", "redistribute"):
        assert name in api


@pytest.mark.slow
def test_the_site_renders_in_chromium(tmp_path):
    """``make docs-check``: navigation, code blocks and the report picture as a browser shows
    them (needs Debian's chromium; skipped without it)."""
    pytest.importorskip("mkdocs")
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import docs_render_check
    finally:
        sys.path.remove(str(ROOT / "tools"))
    if docs_render_check.chromium() is None:
        pytest.skip("no chromium on PATH")
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    cmd = [sys.executable, "-m", "mkdocs", "build", "-d", str(site)]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, env=env, timeout=600)
    assert docs_render_check.check(site, tmp_path / "shots") == []


# ------------------------------------------------------------------ running the snippets
@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("snippets")
    # one 448-px tile an image: the snippets' models train on rows of hundreds of tokens, not
    # thousands (a toy LLM's attention over 10k-token rows took seconds a step on a CPU)
    demo, cost, plan = build_inputs(root, samples=48, vision_policy="internvl:max_tiles=1")
    gen = root / "shards"
    args = ["write", str(plan), "--cost-table", str(cost), "--out", str(gen), "--energon"]
    assert main(args) == 0
    return {
        "build/shards": str(gen),
        "build/raw/tokenizer.json": str(demo / "tokenizer.json"),
        "build/tt-ckpt": str(root / "ckpt"),
        "build/hf-trainer": str(root / "hf-out"),
        "root": str(root),
        "demo": str(demo),
        "plan": str(plan),
        "cost": str(cost),
    }


def run_code(code: str, paths: dict[str, str], env: dict | None = None, prelude: str = ""):
    for old, new in paths.items():
        code = code.replace(f'"{old}"', repr(new))
    env = {**(env or os.environ), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    out = subprocess.run(
        [sys.executable, "-c", prelude + code],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.splitlines()


def run_snippet(name: str, paths: dict[str, str], **kw) -> list[str]:
    return run_code(snippet(name), paths, **kw)


def own_loader_steps(gen: str, n: int | None = None, epoch: int = 0) -> list[list[str]]:
    ds = GroupDataset(gen, RankInfo(rank=0, world_size=1))
    ds.set_epoch(epoch)
    steps = []
    for batch in ds:
        steps.append([s.meta["sample_id"] for s in batch["samples"]])
        if len(steps) == n:
            return steps
    return steps


def test_hf_trainer_snippet_trains(paths):
    pytest.importorskip("accelerate")
    lines = run_snippet("hf-trainer", paths)
    last = lines[-1].split()
    assert last[:3] == ["trained", "steps", "4"]
    assert 0 < float(last[-1]) < 20  # a finite cross-entropy over the vocabulary


def test_torchtitan_snippet_resumes_at_the_next_step(paths):
    first = [ln for ln in run_snippet("torchtitan", paths) if ln.startswith("step")]
    second = [ln for ln in run_snippet("torchtitan", paths) if ln.startswith("step")]
    got = [ast.literal_eval(ln[len("step ") : ln.rindex("]") + 1]) for ln in first + second]
    assert got == own_loader_steps(paths["build/shards"], 6)


def test_energon_snippet_yields_the_balanced_groups(paths):
    pytest.importorskip("megatron.energon")
    lines = run_snippet("energon", paths)
    got = [
        ast.literal_eval(ln[ln.index("[") : ln.rindex("]") + 1]) for ln in lines if ln[:1].isdigit()
    ]
    # reference: node 0 / rank 0's stream read with tarfile, grouped by the records' step
    m = open_generation(paths["build/shards"])
    stream = next(st for st in m.streams if (st.node, st.local_rank) == (0, 0))
    want: dict[int, list[str]] = {}
    for shard in stream.shards:
        with tarfile.open(m.path / shard.file) as tf:
            for member in tf.getmembers():
                if member.name.endswith(".json"):
                    rec = json.loads(tf.extractfile(member).read())
                    want.setdefault(rec["step"], []).append(rec["sample_id"])
    assert got == [want[s] for s in sorted(want)]


def _epochs(lines: list[str]) -> dict[int, list[list[str]]]:
    out: dict[int, list[list[str]]] = {}
    for ln in lines:
        if ln.startswith("epoch "):
            epoch = int(ln.split()[1])
            out.setdefault(epoch, []).append(ast.literal_eval(ln[ln.index("[") :]))
    return out


def test_loader_raw_snippet_shows_what_a_group_is_without_a_transform(paths):
    """The documented raw item (issue 70: it was not documented): the keys, the sample's
    document and its images' bytes as stored, equal to the first group the loader gives."""
    lines = run_snippet("loader-raw", paths)
    got = {ln.split(" ", 1)[0]: ln.split(" ", 1)[1] for ln in lines}
    assert ast.literal_eval(got["batch"]) == ["epoch", "rank", "samples", "skipped", "step"]
    meta = ast.literal_eval(got["meta"])
    assert {"sample_id", "turns", "cost", "images", "step", "group_id", "rank"} <= set(meta)
    first = next(
        iter(GroupDataset(paths["build/shards"], RankInfo(rank=0, world_size=1), shuffle=False))
    )
    sample = first["samples"][0]
    assert got["turn"] == f"{sample.meta['turns'][0][0]} id {sample.meta['sample_id']}"
    names, heads = got["images"].split("] [")
    assert ast.literal_eval(names + "]") == sample.meta["images"]
    # the original bytes: JPEG and PNG magic numbers, as the demo's images were written
    assert ast.literal_eval("[" + heads) == [bytes(b[:2]).hex() for b in sample.images]
    assert all(h in ("ffd8", "8950") for h in ast.literal_eval("[" + heads))


def test_loader_loop_snippet_gives_every_group_once_per_epoch(paths):
    got = _epochs(run_snippet("loader-loop", paths))
    gen = paths["build/shards"]
    assert got[0] == own_loader_steps(gen, epoch=0)
    assert got[1] == own_loader_steps(gen, epoch=1)
    # a new epoch reshuffles the steps, never what trains together
    assert sorted(map(sorted, got[1])) == sorted(map(sorted, got[0]))
    assert got[1] != got[0]


def test_s3_snippet_reads_the_generation_from_a_bucket(paths, s3, tmp_path):
    url = "s3://bkt/docs-snippet/vlm-shards"
    env = s3_env(s3)
    cmd = [sys.executable, "-m", "equishard", "write", paths["plan"], "--cost-table"]
    cmd += [paths["cost"], "--out", url, "--staging", str(tmp_path / "staging")]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    swap = {"s3://team-bucket/vlm-shards": url, "/local_nvme/equishard-cache": str(tmp_path / "c")}
    lines = run_snippet("s3-loader", swap, env=env)
    got = [ast.literal_eval(ln[ln.index("[") :]) for ln in lines]
    assert got == own_loader_steps(paths["build/shards"])  # the same plan written locally
    assert any((tmp_path / "c").rglob("*")), "cache_dir kept nothing"


# ------------------------------------------------------------ the quick start (Qwen2-VL)


@pytest.fixture(scope="module")
def quickstart(paths) -> dict[str, str]:
    """A tiny Qwen2-VL model folder (random weights, the demo tokenizer with Qwen's special
    tokens and chat template, an image processor of at most 64 merged patches), and the quick
    start's shell block run on the demo data with it."""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import train_hf_vlm as ex
    finally:
        sys.path.remove(str(ROOT / "examples"))
    root = Path(paths["root"]) / "quickstart"
    model = ex.model_dir("qwen2vl", paths["build/raw/tokenizer.json"], root / "model")
    processor, net = ex.build("qwen2vl", model)
    processor.save_pretrained(model)
    net.save_pretrained(model)
    # what a released Qwen2-VL checkpoint ships beside its image processor's config: a video
    # processor AutoProcessor would build (and which needs torchvision)
    (model / "video_preprocessor_config.json").write_text(
        json.dumps({"video_processor_type": "Qwen2VLVideoProcessor", "temporal_patch_size": 2})
    )
    code = snippet("quickstart-cli")
    swaps = {
        "MODEL=Qwen2.5-VL-3B-Instruct": f"MODEL={shlex.quote(str(model))}",
        "data/train.jsonl": shlex.quote(str(Path(paths["demo"]) / "demo.jsonl")),
        "--image-root data": f"--image-root {shlex.quote(paths['demo'])}",
        # the tiny processor's bounds (28 * 28 * 64), and a layout for 48 samples
        "max_pixels=12845056": "max_pixels=50176",
        "--dp 16 --nodes 2": "--dp 2 --nodes 1",
        "build/": f"{root}/",
    }
    for old, new in swaps.items():
        assert old in code, old
        code = code.replace(old, new)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    out = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return {"model": str(model), "shards": str(root / "shards"), "log": out.stdout}


def test_quickstart_commands_measure_balance_write_and_verify(quickstart):
    m = open_generation(quickstart["shards"])
    assert m.raw["prep"]["vision_policy"]["spec"].startswith("qwen2vl:")
    assert m.raw["prep"]["vision_policy"]["max_pixels"] == 50176
    assert m.totals["samples"] == 48
    assert m.raw["prep"]["template"]
    assert Path(quickstart["shards"]).parent.joinpath("report.html").exists()


def test_quickstart_loop_trains_the_model_on_its_generation(quickstart):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
    }
    swap = {"Qwen2.5-VL-3B-Instruct": quickstart["model"], "build/shards": quickstart["shards"]}
    lines = run_snippet("quickstart-loop", swap, env=env)  # as written: no torchvision here
    losses = [float(ln.split()[-1]) for ln in lines if ln.startswith("rank 0 step")]
    assert len(losses) == 2 and all(0 < x < 20 for x in losses)
