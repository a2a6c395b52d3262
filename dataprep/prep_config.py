"""What ``equishard prep`` is asked to do (:class:`PrepConfig`, checked where it is made: inputs
and output, workers and engine, the shard of the inputs, the error rate, the image check, the
cache, and the vision policy, tokenizer and template specs) and what it reports
(:class:`PrepResult`)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dataprep.chat_template import load_template
from dataprep.image_header import CHECKS
from dataprep.media_rules.registry import check_media_rules
from dataprep.policies import parse_vision_policy
from dataprep.text_tokens import TokenizerSpec
from equishard.common.options import option
from equishard.common.ray_engine import (
    DEFAULT_TASK_TIMEOUT,
    ENGINE_OPTION,
    ENGINES,
    RAY_ADDRESS_OPTION,
    TASK_TIMEOUT_OPTION,
)
from equishard.common.values import check_count, check_flag, check_real, check_task_timeout
from equishard.common.workers import MAX_WORKERS
from equishard.contracts.cost_table import errors_path

__all__ = ["PrepConfig", "PrepResult"]


@dataclass(frozen=True, kw_only=True)
class PrepConfig:
    inputs: tuple[str, ...] = field(
        metadata=option(
            "dataset files or HF dataset directories",
            flag="",
            nargs="+",
            metavar="INPUT",
            parse=tuple,
        )
    )
    output: str = field(
        metadata=option(
            "cost table to write (.parquet)", short="-o", required=True, metavar="COST_TABLE"
        )
    )
    tokenizer: str | None = field(
        metadata=option(
            "tokenizer.json of the model you train (required), or 'estimate:chars_per_token=F' "
            "to estimate text tokens from characters (recorded in the table's metadata)",
            metavar="T",
        )
    )
    vision_policy: str = field(
        default="internvl",
        metadata=option(
            "fixed:S/P, {policies} with options (internvl:max_tiles=6, "
            "qwen2vl:max_pixels=1003520,resize=qwen-vl-utils; resize=transformers is the "
            "default) (default: internvl)",
            metavar="P",
        ),
    )
    video_rule: str | None = field(
        default=None,
        metadata=option(
            "measure videos (a record's video/videos field, <video> in its text, LLaVA-Video's "
            "<image> beside a video) as this model's processor samples them: {video_rules} "
            "with options (qwen2vl:fps=1,max_frames=64,source=transformers). Without it a "
            "sample with a video is refused (reason unsupported_modality)",
            metavar="R",
        ),
    )
    audio_rule: str | None = field(
        default=None,
        metadata=option(
            "measure recordings (audio/audios field, <audio>) as this model's feature "
            "extractor and encoder take them: {audio_rules} (whisper:chunk_length=30,"
            "n_window=0 for another). Without it a sample with audio is refused",
            metavar="R",
        ),
    )
    template: str = field(
        default="chatml",
        metadata=option(
            "chat template whose tokens are counted. Exact: the model's own Jinja template -- "
            "its directory, chat_template.jinja, chat_template.json or tokenizer_config.json "
            "(image markers expanded as the family's processor does, the family found from the "
            "template; PATH#images=FAMILY to choose, and for DeepSeek-VL and Janus, whose "
            "templates write the same marker: PATH#images=deepseek_vl|janus). Built-in "
            "fallbacks: chatml, vicuna, plain, or a JSON file with fields bos, system_prompt, "
            "prefix{system,user,assistant}, suffix, image_prefix, image_suffix (default: chatml)",
            metavar="NAME|FILE|DIR",
        ),
    )
    image_root: str | None = field(
        default=None,
        metadata=option(
            "directory that relative image paths start from (default: each input's directory)",
            metavar="DIR",
        ),
    )
    image_column: str | None = field(
        default=None,
        metadata=option("Parquet/HF image column (default: image or images)", metavar="COL"),
    )
    text_column: str | None = field(
        default=None,
        metadata=option(
            "Parquet/HF text column (default: conversations, messages or text)", metavar="COL"
        ),
    )
    workers: int = field(
        default=1,
        metadata=option(
            "worker processes (default: 1; with --engine local at most one per usable core, "
            "$EQUISHARD_CORES to say how many a container has)",
            metavar="W",
        ),
    )
    engine: str = field(default="local", metadata=ENGINE_OPTION)  # equishard.common.ray_engine
    ray_address: str | None = field(default=None, metadata=RAY_ADDRESS_OPTION)
    task_timeout: float | None = field(default=DEFAULT_TASK_TIMEOUT, metadata=TASK_TIMEOUT_OPTION)
    chunk_size: int = field(
        default=1024, metadata=option("records per work unit (default: 1024)", metavar="N")
    )
    shard_index: int = field(
        default=0, metadata=option("this machine's part, 0-based (default: 0)", metavar="K")
    )
    num_shards: int = field(
        default=1,
        metadata=option("number of parts the input is split into (default: 1)", metavar="N"),
    )
    # "header": walk each file's structure; "decode": full decode
    check_images: str = field(
        default="header",
        metadata=option(
            "how each image is checked: 'header' reads its header and walks its structure to "
            "the end marker without decoding pixels (default); 'decode' fully decodes it with "
            "Pillow (exact, slower)",
            choices=CHECKS,
        ),
    )
    allow_outside_image_root: bool = field(
        default=False,
        metadata=option(
            "read image paths that resolve outside --image-root ('..', absolute paths, "
            "symlinks leading out); by default such a sample is rejected (reason unsafe_path)"
        ),
    )
    # a cost table whose rows are reused when sample_id + cache_key match
    cache: str | None = field(
        default=None,
        metadata=option(
            "an earlier cost table: a sample whose id and cache key (record bytes, image file "
            "sizes and mtimes) match keeps its row, without its images being read or its text "
            "tokenized. Its tokenizer (by content), template and vision policy must be this "
            "prep's and its image check at least as strict, else it is refused",
            metavar="COST_TABLE",
        ),
    )
    max_error_rate: float = field(
        default=0.01,
        metadata=option(
            "abort when more than this fraction of samples is rejected (default: 0.01)",
            metavar="F",
        ),
    )
    progress: bool = False  # the command's --no-progress and --json turn it off

    def __post_init__(self) -> None:
        if not self.inputs:
            raise ValueError(
                "no inputs: give one or more .json/.jsonl/.parquet/.tar files or HF dataset dirs"
            )
        if not self.output.endswith(".parquet"):
            raise ValueError(
                f"output {self.output!r} must end in .parquet (e.g. -o build/cost.parquet)"
            )
        check_count("--workers", self.workers, 1, MAX_WORKERS)
        check_task_timeout(self.task_timeout)
        if self.engine not in ENGINES:
            raise ValueError(f"--engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if self.ray_address and self.engine != "ray":
            raise ValueError("--ray-address is for --engine ray; add --engine ray or drop it")
        check_count("chunk_size (samples)", self.chunk_size, 1, 1 << 24)
        check_count("--num-shards", self.num_shards, 1, 1 << 20)
        check_count("--shard-index", self.shard_index, 0, 1 << 20)
        for name in ("progress", "allow_outside_image_root"):
            check_flag(name, getattr(self, name))
        if not 0 <= self.shard_index < self.num_shards:
            raise ValueError(
                f"--shard-index must be in [0, --num-shards), got {self.shard_index} of {self.num_shards}"
            )
        check_real("--max-error-rate", self.max_error_rate, 0.0, 1.0, hi_open=False)
        if self.check_images not in CHECKS:
            raise ValueError(
                f"--check-images must be one of {', '.join(CHECKS)}, got {self.check_images!r}"
            )
        if self.cache is not None and not Path(self.cache).is_file():
            raise ValueError(
                f"--cache {self.cache}: no such cost table; give the cost table of an earlier prep"
            )
        for out in (Path(self.output), errors_path(self.output)):  # never over an input
            for given in self.inputs:
                if out.is_file() and Path(given).is_file() and os.path.samefile(out, given):
                    what = "cost" if out == Path(self.output) else "errors"
                    raise ValueError(
                        f"output {out} is the input {given}: prep would replace its own input "
                        f"with its {what} table; write it elsewhere (e.g. -o build/cost.parquet)"
                    )
        parse_vision_policy(self.vision_policy)  # validates the spec early
        check_media_rules(self.video_rule, self.audio_rule, self.vision_policy)

        TokenizerSpec.parse(self.tokenizer)
        load_template(self.template)


@dataclass(slots=True)
class PrepResult:
    output: str
    errors_output: str
    n_in: int = 0
    n_written: int = 0
    n_rejected: int = 0
    n_cached: int = 0
    damaged_ranges: int = 0  # byte ranges of tars that held no sample (rows of the errors table)
    reasons: dict[str, int] = field(default_factory=dict)
    percentiles: dict[str, dict[str, float]] = field(default_factory=dict)
    modalities: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    # what the counts were measured with, and what looked wrong about it (setting_checks)
    settings: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)
