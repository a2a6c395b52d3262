"""Shared fixtures: real image bytes, the demo tokenizer, and small helpers."""

from __future__ import annotations

import io
import logging
import os
import re
import sys
from importlib import resources
from pathlib import Path

import pytest
from hypothesis import settings
from PIL import Image

# Property tests draw the same examples on every run (CI and a laptop agree, and a submission
# never fails on a draw no one saw): each test's examples derive from its own name. A failure
# is reproduced by running it again. ``HYPOTHESIS_PROFILE=explore`` draws fresh random examples
# (1,000 where a test sets no count) to look for new failures; pin each one with ``@example``.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("explore", max_examples=1000, derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def image_bytes(width: int, height: int, fmt: str = "JPEG", orientation: int = 1) -> bytes:
    """A real encoded image of the given stored size; ``orientation`` != 1 adds that EXIF
    Orientation tag (5-8: displayed turned, ``height`` x ``width``)."""
    buf = io.BytesIO()
    img = Image.new("RGB", (width, height), (40, 120, 200))
    if orientation == 1:
        img.save(buf, format=fmt)
    else:
        exif = Image.Exif()
        exif[0x0112] = orientation
        img.save(buf, format=fmt, exif=exif)
    return buf.getvalue()


def write_image(
    path: Path, width: int, height: int, fmt: str = "JPEG", orientation: int = 1
) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(image_bytes(width, height, fmt, orientation))
    return path


def local_ray_cluster():
    """A local Ray cluster of 2 CPUs for a test module (yield from it in a module fixture): its
    address while the module runs, then shut down, the environment as it was (ray.init sets
    RAY_* and PYTHONBREAKPOINT for the processes to come)."""
    import ray

    env = dict(os.environ)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()
    os.environ.clear()
    os.environ.update(env)


@pytest.fixture(scope="session")
def tokenizer_path() -> str:
    with resources.as_file(resources.files("dataprep") / "assets" / "demo_tokenizer.json") as p:
        return str(p)


def built_or_refused(make, kw: dict, bad: str | None):
    """``make(**kw)`` where ``bad`` is None; else asserts that it raises ``ValueError`` whose
    message matches ``bad`` and returns None (the settings-at-their-limits tests' one shape)."""
    if bad is None:
        return make(**kw)
    with pytest.raises(ValueError, match=bad):
        make(**kw)
    return None


def bos_post_processor(token: str, token_id: int) -> dict:
    """A ``tokenizer.json`` post-processor that puts ``token`` (id ``token_id``) before every
    single encoding, as Llama's and many large models' tokenizers do."""
    return {
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": token, "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
        ],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {token: {"id": token, "ids": [token_id], "tokens": [token]}},
    }


def _cpu_cap() -> float | None:
    """The cgroup's CPU-time cap in cores (None: uncapped)."""
    quota = Path("/sys/fs/cgroup/cpu.max")
    cap = quota.read_text().split() if quota.exists() else ["max"]
    return None if cap[0] == "max" else int(cap[0]) / int(cap[1])


def usable_cores() -> int:
    """The cores this process may run on: its affinity, cut to a CPU-time cap (the writer's
    own count, shards.write.stream_pool)."""
    from shards.write.stream_pool import usable_cores as cores

    return cores()


def _processes_sharing_cores(config=None) -> int:
    """How many pytest processes share the cores: in an xdist worker, their count; in the
    process that starts them (``-n N``), N; else one."""
    if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
        return max(1, int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    n = getattr(getattr(config, "option", None), "numprocesses", None)
    return n if isinstance(n, int) and n > 0 else 1


def worker_threads(config=None) -> int:
    """torch's compute threads for this pytest process: the usable cores shared among
    pytest-xdist's workers (``make test`` runs one per core), at least one."""
    return max(1, usable_cores() // _processes_sharing_cores(config))


def pytest_configure(config):
    """torch takes a thread per core the host has; in a container with fewer cores (a CPU-time
    cap on a large host), or beside other test workers, the surplus threads only contend (a
    kernel of many small parallel regions crawls): cut to this process's share of the cores.
    The process that starts xdist's workers sets their share before it starts them (they
    inherit its environment: set to its own share, 2 threads for each of 2 workers on 2 cores,
    two tests' torch kernels ran up to 9x slower side by side)."""
    threads = worker_threads(config)
    if "torch" in sys.modules:
        import torch

        torch.set_num_threads(min(torch.get_num_threads(), threads))
    elif "PYTEST_XDIST_WORKER" not in os.environ and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(threads)  # read by torch when a test imports it
        os.environ[THREADS_SET_HERE] = "1"  # (a value set outside the run is kept)


THREADS_SET_HERE = "EQUISHARD_TEST_THREADS_SET"


# the longest files (45 s or more each on 2 cores, longest first, as a run's junit times gave
# them on 2026-12-07), first: make test gives whole files to its workers in collection order, so
# one started last would run alone at the end
LONGEST_FIRST = (
    "test_example_hf.py",
    "trainer_adapter/test_hf_inputs.py",
    "trainer_adapter/test_hf_video_inputs.py",
    "dataprep/test_jinja_template.py",
    "test_gpu_check.py",
    "trainer_adapter/test_reference_gradients.py",
    "trainer_adapter/test_hf_tower_sweep.py",
    "shards/store/test_object_store.py",
    "trainer_adapter/test_cli_train.py",
    "test_docs.py",
    "dataprep/test_media_counts.py",
    "dataprep/test_vision_policy.py",
    "trainer_adapter/test_hf_parity.py",
)


def pytest_collection_modifyitems(session, config, items):
    """The files of LONGEST_FIRST ahead of the rest, each file's tests in their own order."""
    tests = Path(__file__).resolve().parent

    def rank(item) -> int:
        try:
            name = item.path.resolve().relative_to(tests).as_posix()
        except ValueError:
            return len(LONGEST_FIRST)
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the order within a file and among the rest is kept


@pytest.fixture(autouse=True)
def _store_limits_stay_in_their_test():
    """The CLI forwards ``--store-timeout`` / ``--store-retries`` to its workers through the
    process environment: a test that runs ``main()`` in this process (a tight 0.25 s limit)
    would leave them to whatever test this worker runs next (seen: an S3 publish failing its
    isdir within 1 s). Each test gets the environment's values back afterwards."""
    from shards.store.store_limits import RETRIES_ENV, TIMEOUT_ENV

    kept = {k: os.environ.get(k) for k in (TIMEOUT_ENV, RETRIES_ENV)}
    yield
    for key, value in kept.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _machine() -> str:
    """The cores and memory the tests ran with, as this process sees them (a failing run on
    another machine is read with it: a CPU-time cap or a smaller memory shows here)."""
    cap = _cpu_cap()
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    limit = Path("/sys/fs/cgroup/memory.max")
    limit = limit.read_text().strip() if limit.exists() else "max"
    limit = "none" if limit == "max" else f"{int(limit) / 2**30:.1f} GiB"
    if "torch" in sys.modules:
        threads = sys.modules["torch"].get_num_threads()
    else:
        threads = f"torch not imported (OMP_NUM_THREADS {os.environ.get('OMP_NUM_THREADS')})"
    return (
        f"machine: {os.cpu_count()} CPUs, {len(os.sched_getaffinity(0))} usable, CPU-time cap "
        f"{'none' if cap is None else f'{cap:g} cores'}, {pages / 2**30:.0f} GiB memory "
        f"(cap {limit}); torch threads in pytest: {threads}"
    )


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(_machine())


# --------------------------------------------------------------- a real S3 server (moto)
class _Requests(logging.Handler):
    """The server's access log: one line per HTTP request it served."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(re.sub(r"\x1b\[[0-9;]*m", "", record.getMessage()))  # no colours


@pytest.fixture(scope="session")
def s3():
    """A local S3 server (moto in server mode, HTTP on 127.0.0.1) with bucket ``bkt``, used
    through s3fs exactly as a bucket would be; one per session (moto keeps its buckets in the
    process, so every server would share them anyway); tests use prefixes of their own."""
    moto_server = pytest.importorskip("moto.server")
    s3fs = pytest.importorskip("s3fs")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    log = _Requests()
    werkzeug = logging.getLogger("werkzeug")
    werkzeug.addHandler(log)
    werkzeug.setLevel(logging.INFO)
    werkzeug.propagate = False
    endpoint = f"http://{host}:{port}"
    opts = {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}
    s3fs.S3FileSystem(**opts).mkdir("bkt")
    yield {"endpoint": endpoint, "opts": opts, "log": log}
    werkzeug.removeHandler(log)
    werkzeug.propagate = True
    server.stop()
