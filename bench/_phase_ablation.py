"""OrchMLLM's ablation on the mixed dataset: which phases to balance at run time.

Simulated 8-rank DP on one device: each rank's share of a step is run for real (forward and
backward of that phase's module over exactly that rank's items, best of three runs, memoized by
the items' lengths) and the slowest rank sets the step time. The data: ``bench._mixed`` (the
real InternVL image lengths, LibriSpeech-like recordings costed by Qwen2.5-Omni's audio rule,
LLaVA-Video-like clips costed by the Qwen2.5-VL video rule: every cost from the product's own
rules). The model: the reference trainer's tiny ViT (32 x 2) over images and video frames, its
Whisper-shaped audio encoder (32 x 2, Qwen2.5-Omni's chunks of 100 positions,
:mod:`trainer_adapter.train.audio_encoder`) and its LLM (64 x 4).

The rows, each over the same number of steps of ``RANKS`` x ``BATCH`` samples:

* **random batches**: each rank runs its own samples in every phase;
* **random + LLM-only balancing** (OrchMLLM's ablation): the LLM phase re-split over the ranks,
  the encoders on their own samples;
* **random + vision-only** (VeOmni-style: its encoder balancing): the vision phase re-split;
* **random + every phase**: vision, audio and LLM each re-split with its own cost;
* **ISF shards + every phase**: the steps of an equishard plan of the table (all phases in
  the grouping), then every phase re-split;
* the last two again, **calibrated**: each phase's cost fitted by ``equishard calibrate``'s
  fit (:func:`balancing.calibration.fit_phase`) to the measured shares of ``WARMUP`` other
  random steps, instead of the FLOPs proxy.

A re-split phase uses ``balancing.post_balance`` (``auto``) on each sample's modeled cost in
that phase (``CostModel.from_dims`` of the three modules, as the runtime computes it). Where a
phase is re-split, an exchange separates the encoders from the LLM, so the step takes the
slowest rank's encoders (vision, then audio) plus the slowest rank's LLM; without any
re-split a rank runs its whole step alone and the step takes the slowest rank's total.
Efficiency is the sum over steps of the mean rank's total over the step's time.
"""

from __future__ import annotations

import numpy as np
import torch

from bench._timing import Memo, best_time

RANKS, BATCH, STEPS, POOL = 8, 16, 6, 4000
SCALE = 8  # every length divided by it, so that a CPU runs a step's shares in seconds
REPEATS = 3  # a share's time: the best of this many runs
WARMUP = 4  # random steps whose measured shares the calibrated rows are fitted to
ALL = ("vision", "audio", "llm")
ROWS = (
    "random batches",
    "random + LLM-only",
    "random + vision-only",
    "random + every phase",
    "ISF shards + every phase",
    "random + every phase, calibrated",
    "ISF shards + every phase, calibrated",
)
BALANCED = {  # which phases each row re-splits
    "random batches": (),
    "random + LLM-only": ("llm",),
    "random + vision-only": ("vision",),
    **{name: ALL for name in ROWS[3:]},
}


def _models(device):
    from trainer_adapter.train.audio_encoder import AudioConfig, AudioEncoder
    from trainer_adapter.train.model import VisionLanguageModel, VLMConfig

    torch.manual_seed(0)
    vlm = VisionLanguageModel(VLMConfig.preset("tiny", vocab_size=2048)).to(device)
    audio = AudioEncoder(AudioConfig(mel=128, hidden=32, layers=2, heads=2, out_dim=64)).to(device)
    return vlm, audio


def _timers(vlm, audio, device):
    memo = Memo()
    cfg = vlm.cfg

    def vision(seqs: tuple[int, ...]) -> float:
        if not seqs:
            return 0.0

        def run():
            patches = torch.randn(sum(seqs), cfg.patch_dim, device=device)
            hw = torch.tensor([[1, s] for s in seqs])
            return best_time(
                lambda: vlm.vision(patches, hw).square().mean().backward(),
                repeats=REPEATS,
                device=device,
            )

        return memo(("v", tuple(sorted(seqs))), run)

    def hear(frames: tuple[int, ...]) -> float:
        if not frames:
            return 0.0

        def run():
            x = torch.randn(sum(frames), audio.cfg.mel, device=device)
            return best_time(
                lambda: audio(x, list(frames)).square().mean().backward(),
                repeats=REPEATS,
                device=device,
            )

        return memo(("a", tuple(sorted(frames))), run)

    def llm(lens: tuple[int, ...]) -> float:
        if not lens:
            return 0.0

        def run():
            n = int(sum(lens))
            ids = torch.randint(0, cfg.vocab_size, (n,), device=device)
            pos = torch.cat([torch.arange(x) for x in lens]).to(device)

            def once():
                x = vlm.llm.tok(ids) + vlm.llm.pos(pos)
                h = vlm.llm.forward_blocks(x, list(lens))
                torch.nn.functional.cross_entropy(vlm.llm.logits(h), ids).backward()

            return best_time(once, repeats=REPEATS, device=device)

        return memo(("l", tuple(sorted(lens))), run)

    return {"vision": vision, "audio": hear, "llm": llm}


def _samples(table):
    """Per sample: its vision sequences (images' tiles and video frames), its recordings'
    frames (two per position of each chunk, the stem's stride) and its LLM length."""
    cut = lambda n: max(1, int(n) // SCALE)  # noqa: E731
    vis = [
        tuple(cut(x) for x in (*a, *b))
        for a, b in zip(
            table.column("vit_seq_lens").to_pylist(),
            table.column("video_seq_lens").to_pylist(),
            strict=True,
        )
    ]
    aud = [(cut(2 * sum(s)),) if s else () for s in table.column("audio_seq_lens").to_pylist()]
    llm = np.array([cut(n) for n in table.column("llm_tokens").to_pylist()], dtype=np.int64)
    return vis, aud, llm


def _costs(vlm, audio, vis, aud, llm) -> dict[str, np.ndarray]:
    """Each sample's modeled cost per phase, from the three modules' dimensions."""
    from balancing import CostModel

    cm = CostModel.from_dims(
        vit_hidden=vlm.cfg.vit_hidden,
        vit_layers=vlm.cfg.vit_layers,
        llm_hidden=vlm.cfg.llm_hidden,
        llm_layers=vlm.cfg.llm_layers,
        audio_hidden=audio.cfg.hidden,
        audio_layers=audio.cfg.layers,
    )

    def phase(model, seqs):
        t = np.array([sum(s) for s in seqs], dtype=np.float64)
        sq = np.array([sum(x * x for x in s) for s in seqs], dtype=np.float64)
        n = np.array([len(s) for s in seqs], dtype=np.float64)
        return model.of(t, sq, n)

    chunks = [audio.sequences(f[0]) if f else () for f in aud]
    return {
        "vision": phase(cm.vision, vis),
        "audio": phase(cm.audio, chunks),
        "llm": cm.llm.of(llm.astype(np.float64), llm.astype(np.float64) ** 2, 1.0),
    }


def simulate(seed: int = 0, device: str = "cpu") -> dict:
    from balancing import post_balance
    from balancing.plan import BalanceConfig, build_plan
    from bench._mixed import mixed_cost_table

    torch.set_num_threads(1)
    dev = torch.device(device)
    vlm, audio = _models(dev)
    timers = _timers(vlm, audio, dev)
    table = mixed_cost_table(POOL, seed=seed, audio="unpadded")
    vis, aud, llm = _samples(table)
    costs = _costs(vlm, audio, vis, aud, llm)
    rng = np.random.default_rng(seed)
    random_steps = [
        rng.choice(POOL, RANKS * BATCH, replace=False).reshape(RANKS, BATCH) for _ in range(STEPS)
    ]
    plan = build_plan(table, BalanceConfig(dp=RANKS, target_batch=BATCH, seed=seed)).plan
    ids = {s: i for i, s in enumerate(table.column("sample_id").to_pylist())}
    sid = np.array([ids[s] for s in plan.column("sample_id").to_pylist()], dtype=np.int64)
    step, rank = plan.column("step").to_numpy(), plan.column("rank").to_numpy()
    full = np.unique(step)[:-1]  # the last step may be short
    isf_steps = [
        [sid[(step == s) & (rank == r)] for r in range(RANKS)]
        for s in rng.choice(full, STEPS, replace=False)
    ]
    items = {"vision": vis, "audio": aud, "llm": [(int(x),) for x in llm]}
    seqs = {"vision": vis, "audio": [audio.sequences(f[0]) if f else () for f in aud]}
    seqs["llm"] = items["llm"]
    warm = [rng.choice(POOL, RANKS * BATCH, replace=False) for _ in range(WARMUP)]
    fitted = _calibrated(timers, items, seqs, warm)
    rows = {}
    for name in ROWS:
        steps = isf_steps if name.startswith("ISF") else random_steps
        cost = fitted if name.endswith("calibrated") else costs
        spent = mean_total = tokens = 0.0
        for groups in steps:
            idx = np.concatenate(groups)
            owner = np.repeat(np.arange(RANKS), [len(g) for g in groups])
            where = {}
            for ph in ALL:
                if ph in BALANCED[name]:
                    where[ph] = post_balance(cost[ph][idx], RANKS, method="auto").dest
                else:
                    where[ph] = owner
            t = {ph: _times(timers[ph], items[ph], idx, where[ph]) for ph in ALL}
            total = t["vision"] + t["audio"] + t["llm"]
            # with any phase re-split, an exchange between the encoders and the LLM
            encoders = (t["vision"] + t["audio"]).max()
            step_time = encoders + t["llm"].max() if BALANCED[name] else total.max()
            spent += step_time
            mean_total += total.mean()
            tokens += float(llm[idx].sum())
        rows[name] = {
            "efficiency": mean_total / spent,
            "tokens_per_s": tokens / spent,
            "step_time_ms": 1000 * spent / len(steps),
        }
    rows["calibration"] = {ph: f.describe() for ph, f in fitted.fits.items()}
    return rows


def _times(timer, items, idx, where) -> np.ndarray:
    """Each rank's measured time in a phase over the items ``where`` gives it."""
    return np.array(
        [timer(tuple(x for i in idx[where == r] for x in items[i])) for r in range(RANKS)]
    )


class _Fitted(dict):
    """Per phase, each sample's calibrated cost; ``fits`` the phase fits."""

    fits: dict


def _calibrated(timers, items, seqs, warm) -> _Fitted:
    """Each phase's cost per sample from a fit to the measured shares of the warm-up steps
    (``BATCH`` random samples per rank each, as in the random rows)."""
    from balancing.calibration import fit_phase

    out = _Fitted()
    out.fits = {}
    for ph in ALL:
        secs, obs = [], []
        for idx in warm:
            shares = idx.reshape(RANKS, -1)
            for r in range(RANKS):
                secs.append(timers[ph](tuple(x for i in shares[r] for x in items[ph][i])))
                obs.append([x for i in shares[r] for x in seqs[ph][i]])
        fit = fit_phase(ph, secs, obs)
        out.fits[ph] = fit
        t = np.array([sum(s) for s in seqs[ph]], dtype=np.float64)
        sq = np.array([sum(x * x for x in s) for s in seqs[ph]], dtype=np.float64)
        n = np.array([len(s) for s in seqs[ph]], dtype=np.float64)
        out[ph] = fit.cost.of(t, sq, n)
    return out
