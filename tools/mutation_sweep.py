"""Plant known bugs in a scratch copy of the repository and check that the tests catch each one.

Each mutation replaces one snippet of one file (the snippet must occur exactly as written, so a
mutation that no longer applies is reported instead of silently passing) and runs the tests
named for it; the mutation counts as caught when those tests fail. Before any mutation the same
tests run on the unmodified copy and must pass.

    .venv/bin/python tools/mutation_sweep.py            # all, a markdown table at the end
    .venv/bin/python tools/mutation_sweep.py --list
    .venv/bin/python tools/mutation_sweep.py --only detach-encoder,mmscale-identity
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_GRADS = "tests/trainer_adapter/test_reference_gradients.py"
REF = f"{_GRADS}::test_every_layout_gives_the_single_process_gradient"
TRAJ = f"{_GRADS}::test_pipelined_updates_follow_the_flat_run_over_ten_steps"
PROPS = "tests/trainer_adapter/test_training_properties.py"
_PARITY = (
    "tests/trainer_adapter/test_hf_parity.py::test_balanced_equals_unbalanced_equals_single_process"
)
HF = f"{_PARITY}[qwen2vl]"
HF3 = f"{_PARITY}[qwen3vl]"
SPLIT = "tests/trainer_adapter/test_split_samples.py"
_GROUP = "tests/trainer_adapter/test_hf_group_errors.py::test_one_ranks_error_raised_on_every_rank"
_COPIES = "tests/trainer_adapter/test_item_copies.py"
_FSDP = "tests/trainer_adapter/test_hf_fsdp.py"


@dataclass(frozen=True)
class Mutation:
    name: str
    what: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTATIONS = [
    Mutation(
        "detach-encoder",
        "encoder output detached before the exchange (encoder and projector get no gradient)",
        "trainer_adapter/trainer.py",
        "img = route.send_image_embeddings(emb)",
        "img = route.send_image_embeddings(emb.detach())",
        (REF,),
    ),
    Mutation(
        "pp-no-encoder-grad",
        "zero gradient from the LLM back into the encoder under PP",
        "trainer_adapter/trainer.py",
        "packed.backward(leaf.grad)",
        "packed.backward(torch.zeros_like(leaf.grad))",
        (REF,),
    ),
    Mutation(
        "pp-grads-over-microbatches",
        "pipeline gradients divided by the number of microbatches",
        "trainer_adapter/pipeline.py",
        "return cls(stages[0], n_microbatches, loss_fn=loss_fn, scale_grads=False)",
        "return cls(stages[0], n_microbatches, loss_fn=loss_fn, scale_grads=True)",
        (REF,),
    ),
    Mutation(
        "labels-cross-samples",
        "a packed sample's last token predicts the next sample's first token",
        "trainer_adapter/model.py",
        "out[(cu_seqlens[1:].long() - 1)[cu_seqlens[1:] > cu_seqlens[:-1]]] = -100",
        "out[-1:] = -100",
        (f"{PROPS}::test_targets_never_cross_a_packed_sample_boundary", REF),
    ),
    Mutation(
        "mmscale-identity",
        "MMScale's microbatch reordering replaced by the identity",
        "trainer_adapter/microbatches.py",
        "order = inter_microbatch_reorder(unit_cost, pp) if pp > 1 else np.arange(len(units))",
        "order = np.arange(len(units))",
        (f"{PROPS}::test_microbatch_plan_uses_the_reordering",),
    ),
    Mutation(
        "vision-over-llm-cost",
        "the vision phase planned over the LLM cost",
        "trainer_adapter/redistribute.py",
        "vit_cost[has_vit], src[has_vit], vision_ranks",
        "llm_cost[has_vit], src[has_vit], vision_ranks",
        (f"{PROPS}::test_each_phase_is_balanced_over_its_own_cost",),
    ),
    Mutation(
        "leftover-grads",
        "gradients left from before a step (recomputation trials, a caller's backward) reach it",
        "trainer_adapter/trainer.py",
        "        self.model.zero_grad(set_to_none=True)\n",
        "",
        (REF, TRAJ),
    ),
    Mutation(
        "local-normalizer",
        "the loss divided by this rank's targets instead of the global number",
        "trainer_adapter/trainer.py",
        "normalizer = float(max(route.table[:, _TGT].sum(), 1))",
        "normalizer = float(max(route.table[local.llm_index, _TGT].sum(), 1))",
        (REF,),
    ),
    Mutation(
        "encoder-grads-not-reduced",
        "the encoder's gradients are not summed over the ranks that computed them",
        "trainer_adapter/trainer.py",
        "self._reduce = [(owned, None)]",
        "self._reduce = [([], None)]",
        (REF,),
    ),
    Mutation(
        "labels-shift-backwards",
        "targets shifted the wrong way (each token predicts the previous one)",
        "trainer_adapter/model.py",
        "out = torch.roll(labels, -1)",
        "out = torch.roll(labels, 1)",
        (REF,),
    ),
    Mutation(
        "padding-gets-labels",
        "microbatch padding carries a real target (token 0) instead of -100",
        "trainer_adapter/trainer.py",
        "target=pack_rows(tgt, cu, plan, mb, -100)",
        "target=pack_rows(tgt, cu, plan, mb, 0)",
        (REF,),
    ),
    Mutation(
        "nodewise-ignores-embeddings",
        "the LLM placement ignores the image embeddings' trip from the encoder rank",
        "trainer_adapter/redistribute.py",
        "    if policy.embedding_bytes:  # the LLM placement",
        "    if False:  # the LLM placement",
        (
            "tests/trainer_adapter/test_redistribute.py::test_nodewise_placement_counts_the_image_embeddings_trip",
        ),
    ),
    Mutation(
        "isf-close-at-cap",
        "ISF closes a group when a cap is reached instead of passed",
        "balancing/_kernels.py",
        "if k > start and (sv + vo[k] > qv or st + to[k] > qt):",
        "if k > start and (sv + vo[k] >= qv or st + to[k] >= qt):",
        (f"{PROPS}::test_isf_closing_and_filter_rules_by_hand",),
    ),
    Mutation(
        "isf-filter-and",
        "ISF keeps a group only when it reaches both targets (the paper: either)",
        "balancing/_kernels.py",
        "            kept[g] = sv >= qfv or st >= qft\n            g += 1\n            start = k",
        "            kept[g] = sv >= qfv and st >= qft\n            g += 1\n            start = k",
        (f"{PROPS}::test_isf_closing_and_filter_rules_by_hand",),
    ),
    Mutation(
        "hf-return-order",
        "HF wrappers return the routed outputs to their rank in reversed item order",
        "trainer_adapter/item_outputs.py",
        "    item_start = np.cumsum(per.sum(axis=0)) - per.sum(axis=0)\n",
        "    item_start = (np.cumsum(per.sum(axis=0)) - per.sum(axis=0))[::-1].copy()\n",
        (HF,),
    ),
    Mutation(
        "hf-decoder-no-positions",
        "the balanced decoder drops the moved position ids (samples attend across boundaries)",
        "trainer_adapter/hf_decoder.py",
        "                position_ids=p,\n",
        "                position_ids=None,\n",
        (HF,),
    ),
    Mutation(
        "hf-decoder-drops-deepstack",
        "Qwen3-VL's deepstack features do not travel with moved samples (dropped on arrival)",
        "trainer_adapter/hf_decoder.py",
        'kw["deepstack_visual_embeds"] = list(d.split(width, dim=1))',
        'kw["deepstack_visual_embeds"] = [t * 0 for t in d.split(width, dim=1)]',
        (HF3,),
    ),
    Mutation(
        "pixels-not-normalized",
        "uint8 pixels fed to the encoder as they arrive (no CLIP normalization on the device)",
        "trainer_adapter/trainer.py",
        "patches = normalize_patches(local.patches.to(self.device), dtype)",
        "patches = local.patches.to(self.device, dtype)",
        (REF,),
    ),
    Mutation(
        "cut-chain-backward-in-order",
        "a chain of microbatches joined by a cut sample runs its backwards first to last",
        "trainer_adapter/split_samples.py",
        "                rows = reversed(rows)",
        "                rows = iter(rows)",
        (REF, f"{SPLIT}::test_chain_schedules_run_every_chain_backward_in_reverse"),
    ),
    Mutation(
        "cut-prefix-dropped",
        "a cut sample's later piece does not attend to its earlier pieces",
        "trainer_adapter/pipeline.py",
        "cont = bool(codes) and self.carry.continues(codes[0] // 2)",
        "cont = False",
        (REF, f"{SPLIT}::test_cut_sample_attention_and_gradients_equal_the_whole_sample"),
    ),
    Mutation(
        "cut-mask-top-left",
        "the causal mask across a cut aligned top-left (the prefix's last keys are hidden)",
        "trainer_adapter/model.py",
        "mask = torch.ones(n, p + n, dtype=torch.bool, device=y.device).tril(p)",
        "mask = torch.ones(n, p + n, dtype=torch.bool, device=y.device).tril(0)",
        (REF, f"{SPLIT}::test_cut_sample_attention_and_gradients_equal_the_whole_sample"),
    ),
    Mutation(
        "cut-gradient-not-routed",
        "the gradient a later piece leaves on its prefix never reaches the earlier piece",
        "trainer_adapter/split_samples.py",
        "        return grad + sum(extra)",
        "        return grad",
        (REF, f"{SPLIT}::test_cut_sample_attention_and_gradients_equal_the_whole_sample"),
    ),
    Mutation(
        "cut-continuation-not-first",
        "a continuation placed after its row's whole samples",
        "trainer_adapter/microbatches.py",
        "out.append(head + [(i, 0, int(lengths[i])) for i in whole[k]] + stream[k][len(head) :])",
        "out.append([(i, 0, int(lengths[i])) for i in whole[k]] + stream[k])",
        (REF, f"{SPLIT}::test_cut_plans_hold_every_token_once_in_order"),
    ),
    Mutation(
        "recompute-plans-on-trial-batch",
        "adaptive recomputation plans for the trial batch, not the heaviest group",
        "trainer_adapter/recompute.py",
        "return static + ratio * max(peak - static, 0.0)",
        "return peak",
        (
            "tests/trainer_adapter/test_recompute.py::test_plans_for_a_heavier_step_than_the_trial_batch",
        ),
    ),
    Mutation(
        "flops-projector-one-linear",
        "model FLOPs count one of the projector's two products",
        "trainer_adapter/flops.py",
        "fwd += 2.0 * (cfg.vit_hidden * m2 + cfg.llm_hidden) * cfg.llm_hidden * (p / m2)",
        "fwd += 2.0 * cfg.vit_hidden * m2 * cfg.llm_hidden * (p / m2)",
        ("tests/trainer_adapter/test_flops.py",),
    ),
    Mutation(
        "hf-qwen3-packer-merge",
        "the packer counts a Qwen image's tokens without the 2 x 2 merge",
        "trainer_adapter/hf_inputs.py",
        'return [token * (int(g.prod()) // merge) for g in processed["image_grid_thw"]]',
        'return [token * int(g.prod()) for g in processed["image_grid_thw"]]',
        ("tests/trainer_adapter/test_hf_inputs.py::test_qwen3vl_packer_matches_its_processor",),
    ),
    Mutation(
        "onevision-no-pooling-threshold",
        "LLaVA-OneVision's policy pools the features only above 1.2x the 9 tiles' worth",
        "dataprep/anyres_policy.py",
        "if ratio > 1.1:  # pooled",
        "if ratio > 1.2:  # pooled",
        ("tests/dataprep/test_vision_policy.py",),
    ),
    Mutation(
        "onevision-multi-image-anyres",
        "LLaVA-OneVision's policy cuts every image anyres, also in multi-image samples",
        "dataprep/anyres_policy.py",
        "if len(sizes) == 1:",
        "if len(sizes) >= 1:",
        (
            "tests/dataprep/test_jinja_template.py::test_counts_equal_apply_chat_template_and_processor[llava_onevision]",
        ),
    ),
    Mutation(
        "hf-tile-mask-stays",
        "Idefics3 / SmolVLM tiles move without their patch masks",
        "trainer_adapter/hf_towers.py",
        'masked = "patch_attention_mask" in inspect.signature(inner).parameters',
        "masked = False",
        (f"{_PARITY}[smolvlm]",),
    ),
    Mutation(
        "hf-joined-signature",
        "a rank that only joined the tower's exchange may dictate its output structure",
        "trainer_adapter/hf_towers.py",
        "        own = not self.equishard_joining\n",
        "        own = True\n",
        (
            "tests/trainer_adapter/test_hf_parity.py::test_empty_rank_zero_receives_images[internvl]",
        ),
    ),
    Mutation(
        "hf-gemma3-masks-stay",
        "Gemma 3's 4-D decoder masks do not move with their samples (the receiver uses none)",
        "trainer_adapter/hf_decoder.py",
        "moved_masks = route_masks(masks, lengths, route, group, inputs_embeds)",
        "moved_masks = None",
        (f"{_PARITY}[gemma3]",),
    ),
    Mutation(
        "hf-packing-kwargs-stale",
        "HF's packing kwargs (cu_seq_lens, max_length, seq_idx) reach the decoder as the rank's own",
        "trainer_adapter/hf_decoder.py",
        "kw = packing_kwargs(kw, spec, route.table[route.received, 0], x.device)",
        "kw = dict(kw)",
        (
            "tests/trainer_adapter/test_hf_parity.py::test_packing_kwargs_follow_the_samples[qwen3vl]",
        ),
    ),
    Mutation(
        "hf-packing-not-agreed",
        "a rank given no packing kwargs (the empty one) runs its received samples without them",
        "trainer_adapter/hf_decoder.py",
        "spec = {k: v for sp, _, _ in agreed for k, v in sp.items()}",
        "spec = packing_spec(kw)",
        (
            "tests/trainer_adapter/test_hf_parity.py::test_packing_kwargs_follow_the_samples[qwen3vl]",
        ),
    ),
    Mutation(
        "hf-recurrent-unchecked",
        "a decoder with linear-attention layers runs packed rows without sample boundaries",
        "trainer_adapter/hf_packing.py",
        'if kinds and not {"cu_seq_lens_q", "seq_idx"} & set(spec):',
        "if False:",
        ("tests/trainer_adapter/test_hf_guards.py",),
    ),
    Mutation(
        "hf-item-inputs-unchecked",
        "per-item inputs a wrapper cannot move (Mllama's aspect ratios) pass on stale",
        "trainer_adapter/hf_packing.py",
        'extra += [f"`{k}`" for k, v in kwargs.items() if k not in moved and _is_item_data(v)]',
        "extra += []",
        ("tests/trainer_adapter/test_hf_guards.py",),
    ),
    Mutation(
        "hf-one-tower-round",
        "ranks join one tower round at most: a rank with images and videos calls the tower twice",
        "trainer_adapter/hf_rounds.py",
        "if tower.equishard_round_images == 0:",
        "if True:",
        ("tests/trainer_adapter/test_hf_parity.py::test_images_and_videos[qwen2vl]",),
    ),
    Mutation(
        "hf-pixtral-sizes-stay",
        "Pixtral's images move without their sizes (the tower takes each as large as the padding)",
        "trainer_adapter/hf_pixtral.py",
        "lambda: inner(x, sizes_in, *args,",
        "lambda: inner(x, None, *args,",
        (f"{_PARITY}[mistral3]",),
    ),
    Mutation(
        "spans-not-trimmed",
        "an assistant text a template trims (Gemma) is looked for only as written",
        "dataprep/jinja_template.py",
        "                core = piece.strip()\n",
        "                core = piece\n",
        (
            "tests/dataprep/test_jinja_template.py::"
            "test_trimming_template_spans_equal_transformers_generation_mask",
            "tests/trainer_adapter/test_hf_inputs.py::test_packer_matches_the_processor[gemma3]",
        ),
    ),
    Mutation(
        "spans-from-the-start",
        "each turn's text is searched from the start of the conversation (a short answer is "
        "found inside the question)",
        "dataprep/jinja_template.py",
        "            pos, found = at, []",
        "            pos, found = 0, []",
        (
            "tests/dataprep/test_jinja_template.py::"
            "test_trimming_template_spans_equal_transformers_generation_mask",
        ),
    ),
    Mutation(
        "gemma3-types-not-images",
        "Gemma 3's token_type_ids mark no image tokens (its image blocks stay causal)",
        "trainer_adapter/hf_inputs.py",
        'extra["token_type_ids"] = (ids == image_id).long()',
        'extra["token_type_ids"] = torch.zeros_like(ids)',
        ("tests/trainer_adapter/test_hf_inputs.py::test_packer_matches_the_processor[gemma3]",),
    ),
    Mutation(
        "hf-paused-decoder-balances",
        "the balanced decoder ignores paused(): generate's KV-cache calls are refused",
        "trainer_adapter/hf_decoder.py",
        "        if self.equishard_paused:  # see paused()",
        "        if False:  # see paused()",
        ("tests/trainer_adapter/test_hf_generate.py",),
    ),
    Mutation(
        "hf-paused-not-restored",
        "paused() leaves the model paused after its block (balancing silently off)",
        "trainer_adapter/hf_balance.py",
        "            m.equishard_paused = was",
        "            m.equishard_paused = True",
        ("tests/trainer_adapter/test_hf_generate.py",),
    ),
    Mutation(
        "smolvlm-strip-one-tile",
        "a SmolVLM image one tile high (or wide) is not split, only larger ones",
        "dataprep/smolvlm_policy.py",
        "if height > tile or width > tile:",
        "if height > tile and width > tile:",
        (
            "tests/dataprep/test_jinja_template.py::test_smolvlm_grid_equals_the_image_processor",
            "tests/dataprep/test_jinja_template.py::"
            "test_counts_equal_apply_chat_template_and_processor[smolvlm]",
        ),
    ),
    Mutation(
        "prep-image-text-uncounted",
        "prep leaves out the prompt text an image brings (SmolVLM's tile markers)",
        "dataprep/measure.py",
        "                text = with_image_text(text, costs, self.template.image_prefix)\n",
        "",
        (
            "tests/dataprep/test_jinja_template.py::"
            "test_counts_equal_apply_chat_template_and_processor[smolvlm]",
        ),
    ),
    Mutation(
        "hf-smolvlm-masks-dropped",
        "HFPacker builds SmolVLM's rows without the tiles' pixel masks",
        "trainer_adapter/hf_images.py",
        'out["pixel_attention_mask"] = cat("pixel_attention_mask", 1)',
        'out["pixel_attention_masks"] = cat("pixel_attention_mask", 1)',
        ("tests/trainer_adapter/test_hf_inputs.py::test_packer_matches_the_processor[smolvlm]",),
    ),
    Mutation(
        "glm4v-one-frame",
        "GLM-4V's pixel bound holds one frame of an image, not the two it is repeated to",
        "dataprep/glm4v_policy.py",
        "    if temporal * h_bar * w_bar > max_pixels:",
        "    if h_bar * w_bar > max_pixels:",
        ("tests/dataprep/test_vision_policy.py::test_glm4v_equals_its_image_processor",),
    ),
    Mutation(
        "glm4v-no-upscale",
        "GLM-4V's image with a side under 28 px is not scaled up before rounding",
        "dataprep/glm4v_policy.py",
        "    if height < factor or width < factor:",
        "    if height < 0:",
        (
            "tests/dataprep/test_vision_policy.py::test_glm4v_equals_its_image_processor",
            "tests/dataprep/test_jinja_template.py::"
            "test_counts_equal_apply_chat_template_and_processor[glm4v]",
        ),
    ),
    Mutation(
        "hf-rope-without-image-types",
        "HFPacker's 3-D positions are computed as if a sample had no image tokens",
        "trainer_adapter/hf_inputs.py",
        "rope, _ = self.rope_index(ids[None], (ids == image_id).int()[None],",
        "rope, _ = self.rope_index(ids[None], (ids < 0).int()[None],",
        ("tests/trainer_adapter/test_hf_inputs.py::test_packer_matches_the_processor[glm4v]",),
    ),
    Mutation(
        "llava-next-pooled",
        "LLaVA-NeXT's grid features pooled to 4 tiles' worth as LLaVA-OneVision's are",
        "dataprep/anyres_policy.py",
        "return _anyres_cost(width, height, self.tile_size, self.patch_size, self.pinpoints, 0)",
        "return _anyres_cost(width, height, self.tile_size, self.patch_size, self.pinpoints, 4)",
        (
            "tests/dataprep/test_vision_policy.py::test_llava_next_equals_transformers_on_many_sizes",
        ),
    ),
    Mutation(
        "llava-next-grids-reversed",
        "LLaVA-NeXT's grids tried last first, not in the model's order (ties go to the first)",
        "dataprep/anyres_policy.py",
        "    return tuple(grids)\n",
        "    return tuple(reversed(grids))\n",
        (
            "tests/dataprep/test_vision_policy.py::test_llava_next_hand_worked",
            "tests/dataprep/test_vision_policy.py::test_llava_next_equals_transformers_on_many_sizes",
        ),
    ),
    Mutation(
        "hf-llava-next-padded-tiles",
        "HFPacker gives LLaVA-NeXT a sample's images processed together (tiles padded)",
        "trainer_adapter/hf_inputs.py",
        "        if self.family in _EACH and images:\n",
        '        if self.family in _EACH and images and self.family != "llava_next":\n',
        ("tests/trainer_adapter/test_hf_inputs.py::test_packer_matches_the_processor[llava_next]",),
    ),
    Mutation(
        "pixtral-no-break-tokens",
        "Pixtral's prompt counted without the [IMG_BREAK] / [IMG_END] closing each row",
        "dataprep/pixtral_policy.py",
        "return ImageCost(((h // patch) * (w // patch),), rows * (cols + 1))",
        "return ImageCost(((h // patch) * (w // patch),), rows * cols)",
        (
            "tests/dataprep/test_vision_policy.py::test_pixtral_equals_its_processor",
            "tests/dataprep/test_jinja_template.py::"
            "test_counts_equal_apply_chat_template_and_processor[mistral3]",
        ),
    ),
    Mutation(
        "pixtral-round-down",
        "Pixtral's resized sides rounded down to the merged patch, not up",
        "dataprep/pixtral_policy.py",
        "    return ((height - 1) // step + 1) * step, ((width - 1) // step + 1) * step",
        "    return max(step, height // step * step), max(step, width // step * step)",
        ("tests/dataprep/test_vision_policy.py::test_pixtral_equals_its_processor",),
    ),
    Mutation(
        "hf-mistral3-unmerged-resize",
        "HFPacker resizes Mistral 3's images to multiples of the patch, not the merged patch",
        "trainer_adapter/hf_inputs.py",
        "step = self.processor.patch_size * self.processor.spatial_merge_size",
        "step = self.processor.patch_size",
        ("tests/trainer_adapter/test_hf_inputs.py::test_packer_matches_the_processor[mistral3]",),
    ),
    Mutation(
        "hf-check-costs-one-way",
        "HFPacker's cost check only stops samples longer in prep than the processor makes them",
        "trainer_adapter/hf_inputs.py",
        'if int(cost["llm_tokens"]) != built:',
        'if int(cost["llm_tokens"]) > built:',
        ("tests/trainer_adapter/test_hf_inputs.py::test_packer_checks_prep_costs_end_to_end",),
    ),
    Mutation(
        "hf-moe-router-logits-dropped",
        "the balanced decoder brings the hidden states home but not an MoE router's logits",
        "trainer_adapter/hf_decoder.py",
        'if getattr(got, "router_logits", None) is not None:',
        'if getattr(got, "router_logits", None) is None:',
        ("tests/trainer_adapter/test_hf_parity.py::test_moe_router_aux_loss_as_without_balancing",),
    ),
    Mutation(
        "hf-mixed-dtype-cast-back",
        "per-item outputs come home in the exchange's promoted dtype, not their own",
        "trainer_adapter/item_outputs.py",
        "tensors.append(got[idx.reshape(rows_k, *trailing)].to(kinds[k]))",
        "tensors.append(got[idx.reshape(rows_k, *trailing)])",
        ("tests/trainer_adapter/test_hf_balance_outputs.py",),
    ),
    Mutation(
        "exif-orientation-ignored",
        "prep counts the stored pixels of a photo its EXIF orientation turns",
        "dataprep/image_header.py",
        "    if orientation in TURNED:",
        "    if orientation in ():",
        (
            "tests/dataprep/test_image_orientation.py",
            "tests/dataprep/test_jinja_template.py::test_counts_equal_apply_chat_template_and_processor",
        ),
    ),
    Mutation(
        "exif-png-trailing-chunks",
        "a PNG's EXIF after its image data is never read (Pillow reads it only when decoding)",
        "dataprep/image_orientation.py",
        "        and not _png_metadata_after_data(fileobj, nbytes)",
        "        and True",
        ("tests/dataprep/test_image_orientation.py",),
    ),
    Mutation(
        "exif-png-always-decoded",
        "the header probe decodes every PNG without EXIF to look for trailing metadata",
        "dataprep/image_orientation.py",
        "        and not _png_metadata_after_data(fileobj, nbytes)",
        "        and False",
        ("tests/dataprep/test_image_orientation.py",),
    ),
    Mutation(
        "exif-decode-unturned",
        "the collators decode a photo without its EXIF orientation (prep counted it turned)",
        "dataprep/image_orientation.py",
        "    ImageOps.exif_transpose(im, in_place=True)\n",
        "\n",
        (
            "tests/dataprep/test_image_orientation.py",
            "tests/trainer_adapter/test_hf_inputs.py::test_packer_matches_the_processor",
        ),
    ),
    Mutation(
        "energon-cooker-unturned",
        "the Energon cooker hands PIL images over as stored, not as prep counted them",
        "shards/energon_sample.py",
        "            ImageOps.exif_transpose(value, in_place=True)",
        "            pass",
        ("tests/shards/test_peer_readers.py::test_energon_loader_reads_every_sample",),
    ),
    Mutation(
        "cache-stored-sizes-reused",
        "prep --cache reuses rows of a table measured before sizes were the displayed ones",
        "dataprep/prep.py",
        "        if key and not (stored_sizes and n)",
        "        if key",
        ("tests/dataprep/test_cache.py",),
    ),
    Mutation(
        "mpo-camera-jpeg-rejected",
        "a camera's multi-picture JPEG (Pillow: MPO) is rejected as an unsupported format",
        "dataprep/image_header.py",
        '            if fmt == "MPO":',
        '            if fmt == "MPO-never":',
        ("tests/dataprep/test_image_header.py",),
    ),
    Mutation(
        "redistribute-kept-over-cap",
        "runtime balancing keeps the ranks' own samples although they break the memory cap",
        "trainer_adapter/redistribute.py",
        "(not cap or np.bincount(src_j, weights=mem, minlength=d).max() <= cap)",
        "True",
        (
            "tests/trainer_adapter/test_redistribute.py",
            "tests/trainer_adapter/test_training_properties.py::test_every_method_trains_under_pp_within_the_memory_cap",
        ),
    ),
    Mutation(
        "write-trusts-stored-size-table",
        "write trusts the cache key of a cost table measured with images as stored",
        "shards/stream_writer.py",
        "            not stored_sizes\n            and bool(",
        "            bool(",
        ("tests/shards/test_writer_stale_inputs.py",),
    ),
    Mutation(
        "rebalance-extends-stored-size-generation",
        "a nightly rebalance carries on a generation measured with images as stored",
        "shards/rebalance.py",
        '    if meta.get("image_sizes") != IMAGE_SIZES and any(',
        "    if False and any(",
        ("tests/shards/test_rebalance_reliability.py",),
    ),
    Mutation(
        "llama4-causal-lm-as-decoder",
        "balance_model wraps Llama 4's causal LM (lm_head included) as if it were the decoder",
        "trainer_adapter/hf_balance.py",
        '    if decoder is not None and hasattr(decoder, "lm_head"):',
        "    if False:",
        (
            "tests/trainer_adapter/test_hf_parity.py::test_balanced_equals_unbalanced_equals_single_process",
        ),
    ),
    Mutation(
        "paligemma-prefix-mask-moved",
        "a mask that joins a packed row's samples is cut into diagonal blocks and moved",
        "trainer_adapter/hf_decoder.py",
        "        if crossing:  # every rank refuses",
        "        if False:  # every rank refuses",
        ("tests/trainer_adapter/test_hf_guards.py",),
    ),
    Mutation(
        "crossing-mask-refused-locally",
        "only the ranks whose own row joins samples refuse (a rank with one sample waits)",
        "trainer_adapter/hf_decoder.py",
        "        crossing = sorted({k for _, names, _ in agreed for k in names})",
        "        crossing = crossing_masks(masks, lengths)",
        ("tests/trainer_adapter/test_hf_guards.py",),
    ),
    Mutation(
        "crossing-mask-misses-additive",
        "an additive (float) mask's allowed entries are read as the bool mask's",
        "trainer_adapter/hf_masks.py",
        "    return mask[0, 0] if mask.dtype == torch.bool else mask[0, 0] == 0",
        "    return mask[0, 0] != 0",
        ("tests/trainer_adapter/test_hf_guards.py",),
    ),
    Mutation(
        "recurrent-ignoring-packing-balanced",
        "a decoder whose short convolutions / Mamba layers ignore the packing kwargs is balanced",
        "trainer_adapter/hf_packing.py",
        "    if kinds and model_type not in PACKED_RECURRENT:",
        "    if False:",
        ("tests/trainer_adapter/test_hf_guards.py",),
    ),
    Mutation(
        "stateless-layers-called-recurrent",
        "MLP and MoE layer kinds (Nemotron-H) counted as carrying state along the row",
        "trainer_adapter/hf_packing.py",
        '("attention" not in k and k not in _STATELESS)',
        '("attention" not in k)',
        ("tests/trainer_adapter/test_hf_guards.py::test_recurrent_decoders",),
    ),
    Mutation(
        "tower-wrapper-by-attribute-name",
        "the tower's wrapper chosen by its attribute name (.visual), not by what it takes",
        "trainer_adapter/hf_balance.py",
        '    if "grid_thw" in takes:',
        '    if getattr(inner, "visual", None) is not None:',
        (
            "tests/trainer_adapter/test_hf_parity.py::test_balanced_equals_unbalanced_equals_single_process",
        ),
    ),
    Mutation(
        "per-token-input-left-behind",
        "ERNIE's per-token expert routing stays on its rank while its samples move",
        "trainer_adapter/hf_decoder.py",
        "            kw[key] = move_per_token(kw.pop(key, None), key, sp, int(lengths.sum()), route, tie)",
        "            pass",
        (
            "tests/trainer_adapter/test_hf_parity.py::test_balanced_equals_unbalanced_equals_single_process",
        ),
    ),
    Mutation(
        "patch-embed-unchecked",
        "a grid_thw tower without a Qwen-style patch embedding is wrapped (fails mid-step)",
        "trainer_adapter/hf_towers.py",
        "    width = _patch_width(tower)\n",
        "    width = 0\n",
        (
            "tests/trainer_adapter/test_hf_tower_sweep.py::"
            "test_tower_without_patch_rows_refused_when_wrapping",
        ),
    ),
    Mutation(
        "naflex-padding-unmasked",
        "the rows an image is padded with to the group's largest are marked as patches",
        "trainer_adapter/hf_naflex.py",
        "        mask = F.pad(pixel_attention_mask.to(torch.int64), (0, most - rows))",
        "        mask = F.pad(pixel_attention_mask.to(torch.int64), (0, most - rows), value=1)",
        (
            "tests/trainer_adapter/test_hf_parity.py::test_balanced_equals_unbalanced_equals_single_process",
        ),
    ),
    Mutation(
        "naflex-grid-stays-home",
        "a moved image runs with the receiving rank's own patch grids",
        "trainer_adapter/hf_naflex.py",
        '        shapes = route.send(spatial_shapes.to(torch.int64), one, "spatial_shapes")',
        '        shapes = route.send(spatial_shapes.to(torch.int64), one, "spatial_shapes")\n'
        "        shapes = shapes.flip(0)",
        (
            "tests/trainer_adapter/test_hf_parity.py::test_balanced_equals_unbalanced_equals_single_process",
        ),
    ),
    Mutation(
        "aya-global-tile-unmarked",
        "Aya Vision's global tile counted without its TILE_GLOBAL marker",
        "dataprep/aya_policy.py",
        '    markers = [f"{tile}_{k}" for k in range(1, tiles)] + [global_tile]',
        '    markers = [f"{tile}_{k}" for k in range(1, tiles)] + [""]',
        (
            "tests/dataprep/test_vision_policy.py::test_aya_vision_equals_its_processor",
            "tests/dataprep/test_jinja_template.py::"
            "test_counts_equal_apply_chat_template_and_processor[aya_vision]",
        ),
    ),
    Mutation(
        "aya-markers-run-together",
        "Aya Vision's tile markers tokenized run together, not each bounded by an image token",
        "dataprep/aya_policy.py",
        '    text = start + "".join(m + IMAGE_PLACEHOLDER for m in markers) + end',
        '    text = start + "".join(markers) + end',
        (
            "tests/dataprep/test_vision_policy.py::test_aya_vision_equals_its_processor",
            "tests/dataprep/test_jinja_template.py::"
            "test_counts_equal_apply_chat_template_and_processor[aya_vision]",
        ),
    ),
    Mutation(
        "aya-no-thumbnail",
        "Aya Vision's tiles counted without the global tile of a multi-tile image",
        "dataprep/aya_policy.py",
        "        tiles = self.num_tiles(width, height)",
        "        tiles = max(1, self.num_tiles(width, height) - 1)",
        ("tests/dataprep/test_vision_policy.py::test_aya_vision_equals_its_processor",),
    ),
    Mutation(
        "collator-takes-policy-subclass",
        "equishard's own collator accepts Aya Vision's tiling as InternVL's (its markers lost)",
        "shards/collate.py",
        "        if type(policy) not in (FixedPolicy, InternVLPolicy, Qwen2VLPolicy):",
        "        if not isinstance(policy, FixedPolicy | InternVLPolicy | Qwen2VLPolicy):",
        (
            "tests/dataprep/test_jinja_template.py::"
            "test_counts_equal_apply_chat_template_and_processor[aya_vision]",
        ),
    ),
    Mutation(
        "ernie-qwen-pixel-bounds",
        "ERNIE 4.5-VL's images counted with Qwen2-VL's pixel bounds, not its own",
        "dataprep/policy_spec.py",
        "        kwargs = {**ERNIE45VL_DEFAULTS, **kwargs}",
        "        kwargs = {**kwargs}",
        (
            "tests/dataprep/test_qwen2vl_resize_sources.py::"
            "test_ernie45vl_spec_equals_ernie_image_processor",
            "tests/dataprep/test_jinja_template.py::"
            "test_counts_equal_apply_chat_template_and_processor[ernie45vl]",
        ),
    ),
    Mutation(
        "hf-ernie-vision-experts-unmarked",
        "HFPacker leaves ERNIE's image start / end tokens to the text experts",
        "trainer_adapter/hf_inputs.py",
        '            types = self.processor.create_moe_mm_token_type_ids(enc["input_ids"])',
        "            types = (ids == image_id).tolist()",
        ("tests/trainer_adapter/test_hf_inputs.py::test_packer_matches_the_processor[ernie45vl]",),
    ),
    Mutation(
        "hf-ernie-flat-positions",
        "HFPacker gives ERNIE 4.5-VL 1-D positions, not its 3-D ones",
        "trainer_adapter/hf_inputs.py",
        '_QWEN = ("qwen2vl", "qwen3vl", "glm4v", "ernie45vl")',
        '_QWEN = ("qwen2vl", "qwen3vl", "glm4v")',
        ("tests/trainer_adapter/test_hf_inputs.py::test_packer_matches_the_processor[ernie45vl]",),
    ),
    Mutation(
        "gemma4-positions-stay-home",
        "a moved Gemma 4 image runs with another image's patch positions",
        "trainer_adapter/hf_patch_positions.py",
        '        pos = route.send(pos.reshape(n, most * 2), one, "pixel_position_ids")'
        ".reshape(-1, most, 2)",
        '        pos = route.send(pos.reshape(n, most * 2), one, "pixel_position_ids")'
        ".reshape(-1, most, 2).flip(0)",
        (
            "tests/trainer_adapter/test_hf_parity.py::test_balanced_equals_unbalanced_equals_single_process",
        ),
    ),
    Mutation(
        "gemma4-padding-as-patches",
        "Gemma 4's added padding rows get position (0, 0), so the tower takes them for patches",
        "trainer_adapter/hf_patch_positions.py",
        "(0, 0, 0, most - rows), value=-1)",
        "(0, 0, 0, most - rows), value=0)",
        (
            "tests/trainer_adapter/test_hf_parity.py::test_balanced_equals_unbalanced_equals_single_process",
        ),
    ),
    Mutation(
        "per-layer-inputs-detached",
        "Gemma 4's per-layer inputs move without their gradient",
        "trainer_adapter/hf_packing.py",
        "    return route.send(rows, 0, key).reshape(1, -1, *shape)",
        "    return route.send(rows.detach(), 0, key).reshape(1, -1, *shape)",
        (
            "tests/trainer_adapter/test_hf_parity.py::test_balanced_equals_unbalanced_equals_single_process",
        ),
    ),
    Mutation(
        "refusal-raised-alone-vision",
        "a Qwen-style tower refuses a rank's inputs on that rank only (the others wait)",
        "trainer_adapter/hf_towers.py",
        "            table, row_bytes, refusal = None, 0, e\n",
        "            raise\n",
        (f"{_GROUP}[qwen2vl-tower-extra-input]", f"{_GROUP}[qwen2vl-tower-rows-short]"),
    ),
    Mutation(
        "refusal-raised-alone-tiles",
        "a tile tower refuses a rank's inputs on that rank only",
        "trainer_adapter/hf_towers.py",
        "            n, row_bytes, refusal = 0, 0, e\n",
        "            raise\n",
        (f"{_GROUP}[internvl-tower-extra-input]", f"{_GROUP}[smolvlm-tower-masks-short]"),
    ),
    Mutation(
        "refusal-raised-alone-decoder",
        "the decoder refuses a rank's row on that rank only",
        "trainer_adapter/hf_decoder.py",
        "            refusal, masks = e, None\n",
        "            raise\n",
        (f"{_GROUP}[qwen2vl-decoder-positions]",),
    ),
    Mutation(
        "module-failure-raised-alone",
        "a tower or decoder failing on what its rank received (out of memory) fails that rank only",
        "trainer_adapter/item_outputs.py",
        "        return None, e\n",
        "        raise\n",
        (f"{_GROUP}[qwen2vl-tower-fails]", f"{_GROUP}[qwen2vl-decoder-fails]"),
    ),
    Mutation(
        "refusal-not-gathered",
        "the item tables' gather ignores a rank's refusal (the others go on without it)",
        "trainer_adapter/exchange.py",
        "    if bool((counts < 0).any()):",
        "    if False:",
        (f"{_GROUP}[qwen2vl-tower-extra-input]",),
    ),
    Mutation(
        "refusal-names-no-rank",
        "every rank raises, but the message does not say which rank failed",
        "trainer_adapter/group_errors.py",
        """        f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))} of {len(reasons)}: {m}\"""",
        "        m",
        (f"{_GROUP}[qwen2vl-decoder-extra-input]",),
    ),
    Mutation(
        "refusal-cause-dropped",
        "the failing rank's own error is not chained (its traceback lost)",
        "trainer_adapter/group_errors.py",
        "raise StepRefused(message, failed) from cause",
        "raise StepRefused(message, failed) from None",
        (f"{_GROUP}[qwen2vl-tower-fails]",),
    ),
    Mutation(
        "tower-rows-unchecked",
        "patch rows that are not what grid_thw gives fail mid-exchange on one rank",
        "trainer_adapter/hf_towers.py",
        "    if len(hidden_states) != rows.sum():",
        "    if False:",
        (f"{_GROUP}[qwen2vl-tower-rows-short]",),
    ),
    Mutation(
        "pixtral-sizes-unchecked",
        "image_sizes that do not fit the images are not checked before the exchange",
        "trainer_adapter/hf_pixtral.py",
        "if len(sizes) != n or (sizes > (height, width)).any():",
        "if False:",
        (f"{_GROUP}[mistral3-tower-sizes-short]",),
    ),
    Mutation(
        "decoder-positions-length-unchecked",
        "position ids shorter than the row fail mid-exchange on one rank",
        "trainer_adapter/hf_decoder.py",
        "    if position_ids.shape[-1] != inputs_embeds.shape[1]:",
        "    if False:",
        (f"{_GROUP}[qwen2vl-decoder-positions-short]",),
    ),
    Mutation(
        "per-token-shape-unchecked",
        "a per-token input not [1, L] beside the row fails mid-exchange on one rank",
        "trainer_adapter/hf_packing.py",
        "        if value is not None and tuple(value.shape[:2]) != (1, length):",
        "        if False:",
        (f"{_GROUP}[qwen2vl-decoder-per-token-short]",),
    ),
    Mutation(
        "settings-not-adopted",
        "a rank with no tiles of its own runs received ones with its own defaults (fine=False)",
        "trainer_adapter/hf_towers.py",
        "lambda: inner(x, *args, **{**kwargs, **route.settings})",
        "lambda: inner(x, *args, **kwargs)",
        (
            "tests/trainer_adapter/test_hf_parity.py::test_empty_rank_zero_receives_images[granite_docling_fine]",
        ),
    ),
    Mutation(
        "settings-not-compared",
        "ranks calling a tower or the decoder with different settings are not refused",
        "trainer_adapter/item_exchange.py",
        "    if len({repr(s) for s in given.values()}) > 1:",
        "    if False:",
        (f"{_GROUP}[granite_docling-tower-settings-differ]",),
    ),
    Mutation(
        "decoder-settings-not-compared",
        "ranks calling the decoder with different settings are not refused",
        "trainer_adapter/hf_decoder.py",
        "settings = agreed_settings([st for _, _, st in agreed], where)",
        "settings = next((s for _, _, s in agreed if s is not None), {})",
        (f"{_GROUP}[qwen2vl-decoder-settings-differ]",),
    ),
    Mutation(
        "idle-copies-not-made",
        "plan_items(idle=True) gives idle ranks no copy (FSDP2 per block: the group hangs)",
        "trainer_adapter/item_exchange.py",
        "    if idle and dest.size:",
        "    if False:",
        (f"{_COPIES}::test_copy_runs_on_the_idle_rank_and_changes_nothing_else",),
    ),
    Mutation(
        "copy-results-sent-home",
        "a copy's results are not cut off before the way home",
        "trainer_adapter/item_exchange.py",
        "            y = y[: int(rows[here[here < n]].sum())]",
        "            y = y[: int(rows[here].sum())]",
        (f"{_COPIES}::test_copy_runs_on_the_idle_rank_and_changes_nothing_else",),
    ),
    Mutation(
        "copy-rows-of-another-item",
        "a copy sends the rows at its own index, not its original's",
        "trainer_adapter/redistribute.py",
        "            pos[mine] = pos[copy_of[mine]]",
        "            pos[mine] = np.minimum(pos[mine], 0)",
        (f"{_COPIES}::test_copy_runs_on_the_idle_rank_and_changes_nothing_else",),
    ),
    Mutation(
        "copy-ignores-own-items",
        "an idle rank copies the cheapest item of all, not its own (a transfer it need not make)",
        "trainer_adapter/item_exchange.py",
        "        pool = own if own.size else np.arange(src.size)",
        "        pool = np.arange(src.size)",
        (f"{_COPIES}::test_idle_copies_prefers_the_ranks_own_cheapest_then_the_cheapest_of_all",),
    ),
    Mutation(
        "fsdp-not-detected",
        "idle_ranks='auto' never sees fully_shard units (idle ranks skip sharded blocks)",
        "trainer_adapter/item_outputs.py",
        "    return any(isinstance(m, FSDPModule) for m in module.modules())",
        "    return False",
        (f"{_COPIES}::test_auto_runs_idle_ranks_where_the_module_holds_fsdp2_units",),
    ),
    Mutation(
        "plain-decoder-skips-copies",
        "balancing off, the decoder's empty rank skips its sharded layers (FSDP2 hang)",
        "trainer_adapter/hf_decoder.py",
        "        if not policy.enabled and not idle:",
        "        if not policy.enabled:",
        (f"{_FSDP}::test_idle_ranks_run_copies_and_nobody_hangs[qwen2vl]",),
    ),
    Mutation(
        "anchor-ties-sharded-params",
        "the zero tying a skipped tower into the graph takes FSDP2's sharded DTensor parameters",
        "trainer_adapter/item_outputs.py",
        "    params = [p for p in module.parameters() if p.requires_grad and not _sharded(p)]",
        "    params = [p for p in module.parameters() if p.requires_grad]",
        (f"{_FSDP}::test_step_without_any_image_under_fsdp2",),
    ),
    Mutation(
        "join-input-from-dtensor",
        "a joining rank builds its empty input from a sharded (DTensor) parameter",
        "trainer_adapter/item_outputs.py",
        "    return torch.zeros(shape, dtype=p.dtype, device=p.device)",
        "    return p.new_zeros(shape)",
        (f"{_FSDP}::test_balanced_under_fsdp2_per_block_equals_single_process[gemma3]",),
    ),
    Mutation(
        "gemma4-round-to-patch",
        "Gemma 4's resized sides are multiples of the patch, not of the pooling block",
        "dataprep/gemma4_policy.py",
        "    side = k * patch\n",
        "    side = patch\n",
        (
            "tests/dataprep/test_vision_policy.py::test_gemma4_equals_its_image_processor",
            "tests/dataprep/test_vision_policy.py::test_gemma4_hand_worked",
        ),
    ),
    Mutation(
        "gemma4-thin-uncapped",
        "Gemma 4's thin image keeps floor(long / short) blocks past the budget",
        "dataprep/gemma4_policy.py",
        "        h, w = side, min(math.floor(width / height) * side, longest)",
        "        h, w = side, math.floor(width / height) * side",
        ("tests/dataprep/test_vision_policy.py::test_gemma4_equals_its_image_processor",),
    ),
    Mutation(
        "gemma4-real-patches",
        "prep gives Gemma 4's encoder an image's own patches, not the padded rows it attends over",
        "dataprep/gemma4_policy.py",
        "    return ImageCost((budget,), patches // (k * k))",
        "    return ImageCost((patches,), patches // (k * k))",
        ("tests/dataprep/test_vision_policy.py::test_gemma4_equals_its_image_processor",),
    ),
    Mutation(
        "gemma4-template-as-glm",
        "a template's shared <|image|> marker is read as the first family's, turns unchecked",
        "dataprep/jinja_template.py",
        "if t.marker in source and t.also in source]",
        "if t.marker in source]",
        (
            "tests/dataprep/test_jinja_template.py::test_template_sources_and_family_detection",
            "tests/dataprep/test_jinja_template.py::"
            "test_counts_equal_apply_chat_template_and_processor[glm4v]",
        ),
    ),
    Mutation(
        "hf-gemma4-positions-dropped",
        "HFPacker builds Gemma 4's rows without the images' patch positions",
        "trainer_adapter/hf_images.py",
        '    "gemma4": ("image_position_ids",),\n',
        '    "gemma4": (),\n',
        ("tests/trainer_adapter/test_hf_inputs.py::test_packer_matches_the_processor[gemma4]",),
    ),
    Mutation(
        "hf-gemma4-types-as-ids",
        "HFPacker marks Gemma 4's image start and end as image tokens for the bidirectional mask",
        "trainer_adapter/hf_inputs.py",
        '            types = self.processor.create_mm_token_type_ids([enc["input_ids"]])[0]',
        "            types = [int(t in (image_id, image_id - 1, image_id - 2)) for t in ids]",
        ("tests/trainer_adapter/test_hf_inputs.py::test_packer_matches_the_processor[gemma4]",),
    ),
    Mutation(
        "janus-without-bounds",
        "Janus's image tokens expanded without the <begin_of_image> / <end_of_image> around them",
        "dataprep/jinja_template.py",
        '"janus": ImageTokens("<image_placeholder>", "<begin_of_image>", "<end_of_image>"),',
        '"janus": ImageTokens("<image_placeholder>"),',
        (
            "tests/dataprep/test_jinja_template.py::"
            "test_counts_equal_apply_chat_template_and_processor[janus]",
        ),
    ),
    Mutation(
        "shared-marker-first-family",
        "a marker two families share is read as the first one's instead of asking which",
        "dataprep/jinja_template.py",
        "    if len(same) > 1:\n",
        "    if len(same) > 9:\n",
        ("tests/dataprep/test_jinja_template.py::test_template_sources_and_family_detection",),
    ),
    Mutation(
        "hf-gemma4-counts-off",
        "HFPacker writes one soft token fewer than Gemma 4's image processor counted",
        "trainer_adapter/hf_inputs.py",
        'return [token * int(n) for n in processed["num_soft_tokens_per_image"]]',
        'return [token * (int(n) - 1) for n in processed["num_soft_tokens_per_image"]]',
        ("tests/trainer_adapter/test_hf_inputs.py::test_packer_matches_the_processor[gemma4]",),
    ),
    Mutation(
        "ovis2-fallback-fewest",
        "where no Ovis2 grid covers 90 %, the fewest tiles win instead of the most covering",
        "dataprep/ovis2_policy.py",
        "return min(scored, key=lambda s: (-s[1], s[0][0] * s[0][1]))[0]",
        "return min(scored, key=lambda s: (s[0][0] * s[0][1], -s[1]))[0]",
        ("tests/dataprep/test_vision_policy.py::test_ovis2_equals_its_processor",),
    ),
    Mutation(
        "ovis2-covering-transposed",
        "Ovis2's covering cuts the image into the grid's columns by rows (its processor: rows)",
        "dataprep/ovis2_policy.py",
        "        row_h, col_w = height // a, width // b\n",
        "        row_h, col_w = height // b, width // a\n",
        ("tests/dataprep/test_vision_policy.py::test_ovis2_equals_its_processor",),
    ),
    Mutation(
        "ovis2-no-thumbnail",
        "Ovis2's thumbnail tile is not counted",
        "dataprep/ovis2_policy.py",
        "    n = rows * cols + 1  # the thumbnail first\n",
        "    n = rows * cols\n",
        (
            "tests/dataprep/test_jinja_template.py::test_counts_equal_apply_chat_template_and_processor[ovis2]",
        ),
    ),
    Mutation(
        "ovis2-rows-cols-swapped",
        "Ovis2's grid read the original way round (a wide image a wide grid): the markers differ",
        "dataprep/ovis2_policy.py",
        "        return rows, cols\n",
        "        return cols, rows\n",
        ("tests/dataprep/test_vision_policy.py::test_ovis2_hand_worked",),
    ),
    Mutation(
        "aria-split-floor",
        "Aria's split crops floor the fitted grid by the crop size (its processor: ceil)",
        "dataprep/aria_policy.py",
        "    return math.ceil(h / size) * math.ceil(w / size)\n",
        "    return max(1, h // size) * max(1, w // size)\n",
        ("tests/dataprep/test_vision_policy.py::test_aria_equals_its_image_processor",),
    ),
    Mutation(
        "hf-aria-call-crops",
        "HFPacker gives every Aria image the most crops of its sample, as AriaProcessor's call",
        "trainer_adapter/hf_inputs.py",
        'return [token * (int(n) * per_crop) for n in processed["num_crops"]]',
        'return [token * (max(processed["num_crops"]) * per_crop) for n in processed["num_crops"]]',
        ("tests/trainer_adapter/test_hf_inputs.py::test_aria_split_counts_each_images_own_crops",),
    ),
    Mutation(
        "hf-aria-no-pixel-mask",
        "HFPacker leaves Aria's pixel masks out of the row (the tower then attends the padding)",
        "trainer_adapter/hf_images.py",
        '    "aria": ("pixel_mask",),\n',
        '    "aria": (),\n',
        ("tests/trainer_adapter/test_hf_inputs.py::test_packer_matches_the_processor[aria]",),
    ),
    Mutation(
        "granite-newline-before",
        "a one-tile Granite Docling page's newline counted before its tokens (not joining the "
        "template's next text)",
        "dataprep/granite_docling_policy.py",
        'return ImageCost((patches,), tokens, f"{FAKE}<row_1_col_1>", "\\n")',
        'return ImageCost((patches,), tokens, f"{FAKE}<row_1_col_1>\\n")',
        (
            "tests/dataprep/test_vision_policy.py::test_granite_docling_prompt_counts_equal_its_processor",
        ),
    ),
    Mutation(
        "granite-no-side-cap",
        "Granite Docling's grids allowed more than 16 tiles a side (its markers stop at 16)",
        "dataprep/granite_docling_policy.py",
        "grids = tile_grids(min_tiles, max_tiles, min(max_tiles, MAX_SIDE))",
        "grids = tile_grids(min_tiles, max_tiles, max_tiles)",
        ("tests/dataprep/test_vision_policy.py::test_granite_docling_equals_its_image_processor",),
    ),
    Mutation(
        "granite-fine-same-tokens",
        "Granite Docling's fine path counted with the coarse path's tokens a tile",
        "dataprep/granite_docling_policy.py",
        "tokens = self.tokens_per_tile * (4 if self.fine else 1)",
        "tokens = self.tokens_per_tile",
        (
            "tests/trainer_adapter/test_hf_inputs.py::"
            "test_granite_docling_fine_route_and_spread_rule",
        ),
    ),
    Mutation(
        "hf-granite-no-fine-mask",
        "HFPacker leaves Granite Docling's fine-path flag out of the row",
        "trainer_adapter/hf_images.py",
        'if family == "granite_docling" and with_images and fine_route:',
        'if family == "granite_docling" and with_images and not fine_route:',
        (
            "tests/trainer_adapter/test_hf_inputs.py::"
            "test_granite_docling_fine_route_and_spread_rule",
        ),
    ),
    Mutation(
        "ray-inflight-left-writing",
        "a Ray run stopped by a task's error returns while its other tasks still write",
        "dataprep/ray_engine.py",
        "            ray.wait(list(pending), num_returns=len(pending))\n",
        "            pass\n",
        ("tests/shards/test_ray_engine.py::test_task_error_fails_the_run_and_rerun_resumes",),
    ),
    Mutation(
        "idefics2-upscale-keeps-aspect",
        "Idefics2's resize raises a small image's short side keeping the aspect (it does not)",
        "dataprep/idefics2_policy.py",
        "    return max(height, shortest), max(width, shortest)\n",
        "    s = max(shortest / height, shortest / width, 1.0)\n"
        "    return max(int(height * s), shortest), max(int(width * s), shortest)\n",
        ("tests/dataprep/test_vision_policy.py::test_idefics2_equals_its_image_processor",),
    ),
    Mutation(
        "idefics2-split-halves-round-up",
        "Idefics2's quarters cut at half the size rounded up",
        "dataprep/idefics2_policy.py",
        "    mh, mw = height // 2, width // 2\n",
        "    mh, mw = (height + 1) // 2, (width + 1) // 2\n",
        ("tests/dataprep/test_vision_policy.py::test_idefics2_equals_its_image_processor",),
    ),
    Mutation(
        "idefics2-no-space-after-fake",
        "prep leaves out the space Idefics2's processor puts after a fake token text follows",
        "dataprep/idefics2_policy.py",
        '        return _SPACE_AFTER.sub(f"{FAKE} ", text.replace(FAKE + FAKE, FAKE))\n',
        "        return text.replace(FAKE + FAKE, FAKE)\n",
        (
            "tests/dataprep/test_vision_policy.py::test_idefics2_prompt_counts_equal_its_processor",
            "tests/dataprep/test_jinja_template.py::"
            "test_counts_equal_apply_chat_template_and_processor[idefics2]",
        ),
    ),
    Mutation(
        "idefics2-packer-keeps-double-fake",
        "HFPacker keeps both fake tokens between adjacent Idefics2 images",
        "dataprep/idefics2_policy.py",
        "        if k and not parts[k] and text.startswith(FAKE):\n",
        "        if False:\n",
        (
            "tests/dataprep/test_vision_policy.py::test_idefics2_prompt_counts_equal_its_processor",
            "tests/trainer_adapter/test_hf_inputs.py::test_packer_matches_the_processor",
        ),
    ),
    Mutation(
        "tiles-no-crop-back",
        "balance_tiles returns outputs at the group's padded tile size, not the rank's own",
        "trainer_adapter/hf_towers.py",
        "        if own and masked:  # this rank's tiles' patches, on its own patch grid\n",
        "        if False:\n",
        (
            "tests/trainer_adapter/test_hf_parity.py::"
            "test_balanced_equals_unbalanced_equals_single_process[idefics2]",
            "tests/trainer_adapter/test_hf_tile_sizes.py",
        ),
    ),
    Mutation(
        "tiles-pad-mask-true",
        "balance_tiles marks the patches it pads as image",
        "trainer_adapter/hf_tile_sizes.py",
        "            mask = torch.nn.functional.pad(mask, (0, gw, 0, gh), value=False)\n",
        "            mask = torch.nn.functional.pad(mask, (0, gw, 0, gh), value=True)\n",
        (
            "tests/trainer_adapter/test_hf_parity.py::"
            "test_balanced_equals_unbalanced_equals_single_process[idefics2]",
            "tests/trainer_adapter/test_hf_tile_sizes.py",
        ),
    ),
    Mutation(
        "gemma3-sentence-dropped",
        "Gemma 3's pan-and-scan sentence before an image with crops not counted",
        "dataprep/gemma3_policy.py",
        "    return replace(cost, before=BEFORE)",
        "    return cost",
        (
            "tests/dataprep/test_jinja_template.py::"
            "test_counts_equal_apply_chat_template_and_processor[gemma3-pan-and-scan]",
        ),
    ),
    Mutation(
        "gemma3-crops-bankers-rounding",
        "pan-and-scan's crop count rounds half to even (2.5 -> 2) instead of up",
        "dataprep/gemma3_policy.py",
        "n = min(math.floor(long / short + 0.5),",
        "n = min(round(long / short),",
        ("tests/dataprep/test_gemma3_policy.py::test_gemma3_hand_worked",),
    ),
    Mutation(
        "gemma3-small-crops-kept",
        "pan-and-scan keeps crops narrower than min_crop_size",
        "dataprep/gemma3_policy.py",
        "    if min(math.ceil(width / cols), math.ceil(height / rows)) < min_crop_size:\n"
        "        return 0, 0\n",
        "",
        ("tests/dataprep/test_gemma3_policy.py::test_gemma3_crops_equal_its_image_processor",),
    ),
    Mutation(
        "image-before-after-start",
        "an image's text before the template's image start goes after it instead",
        "dataprep/measure.py",
        "            out[-1] = out[-1][:cut] + c.before + out[-1][cut:]",
        "            out[-1] = out[-1] + c.before",
        (
            "tests/dataprep/test_gemma3_policy.py::"
            "test_pan_and_scan_sentence_goes_before_the_template_image_start",
        ),
    ),
    Mutation(
        "packer-image-processor-attributes",
        "HFPacker runs the image processor with its own attributes, not the processor call's "
        "defaults over them (InternVL's crop_to_patches)",
        "trainer_adapter/hf_images.py",
        'settings = {**(getattr(processor, "images_kwargs", None) or {}), **given}',
        "settings = dict(given)",
        (
            "tests/trainer_adapter/test_hf_inputs.py::"
            "test_packer_takes_the_image_settings_of_the_processor_call",
        ),
    ),
    Mutation(
        "packer-gemma3-block-doubled",
        "HFPacker puts Gemma 3's whole image block where the template already wrote its start "
        "and end",
        "trainer_adapter/hf_inputs.py",
        '        if self.family != "gemma3" or not n_images:',
        "        if True:",
        ("tests/trainer_adapter/test_hf_inputs.py::test_packer_matches_the_processor[gemma3]",),
    ),
    Mutation(
        "granite-spread-rule-ignored",
        "Granite Docling's spread rule never gives a page the larger tile budget",
        "dataprep/granite_docling_policy.py",
        "        return self.dense_max_tiles\n",
        "        return self.max_tiles\n",
        ("tests/dataprep/test_vision_policy.py::test_granite_docling_equals_its_image_processor",),
    ),
    Mutation(
        "granite-spread-scale-inverted",
        "the spread rule selects the pages the max_tiles grid resolves well instead",
        "dataprep/granite_docling_policy.py",
        "            if not cols * self.tile_size / width < self.dense_max_scale:",
        "            if cols * self.tile_size / width < self.dense_max_scale:",
        ("tests/dataprep/test_vision_policy.py::test_granite_docling_equals_its_image_processor",),
    ),
    Mutation(
        "hybrid-second-tower-unbalanced",
        "DeepSeek-VL hybrid's SAM tower (high-resolution copies) left unbalanced",
        "trainer_adapter/hf_balance.py",
        '    second = getattr(inner, "high_res_vision_model", None)',
        "    second = None",
        (f"{_PARITY}[deepseek_vl_hybrid]",),
    ),
    Mutation(
        "hybrid-towers-settled-one-by-one",
        "two towers settled one after the other: a rank without images joins the first "
        "tower's rounds before the second's, the others took them interleaved",
        "trainer_adapter/hf_rounds.py",
        "    if len(towers) == 1:\n        return towers[0].equishard_settle()",
        "    if towers:\n        return sum(t.equishard_settle() for t in towers)",
        (f"{_PARITY}[deepseek_vl_hybrid]",),
    ),
    Mutation(
        "hybrid-policy-one-sequence",
        "prep counts DeepSeek-VL hybrid's SigLIP patches only, not its SAM tower's",
        "dataprep/deepseek_hybrid_policy.py",
        "        return ImageCost((low, high), low)",
        "        return ImageCost((low,), low)",
        (
            "tests/dataprep/test_jinja_template.py::"
            "test_counts_equal_apply_chat_template_and_processor[deepseek_vl_hybrid]",
        ),
    ),
    Mutation(
        "packer-hybrid-high-res-dropped",
        "HFPacker leaves DeepSeek-VL hybrid's high-resolution copies out of the row",
        "trainer_adapter/hf_images.py",
        '    "deepseek_vl_hybrid": ("high_res_pixel_values",),\n',
        "",
        (
            "tests/trainer_adapter/test_hf_inputs.py::"
            "test_packer_matches_the_processor[deepseek_vl_hybrid]",
        ),
    ),
    Mutation(
        "decoder-bidirectional-unchecked",
        "balance_decoder balances a bidirectional decoder given no mask (PaliGemma's Gemma)",
        "trainer_adapter/hf_decoder.py",
        "crossing_masks(masks, lengths) + bidirectional_without_masks(self, masks)",
        "crossing_masks(masks, lengths)",
        (
            "tests/trainer_adapter/test_hf_tower_sweep.py::"
            "test_decoder_that_mixes_packed_samples_refused_on_every_rank[paligemma]",
        ),
    ),
    Mutation(
        "decoder-padding-unchecked",
        "balance_decoder takes a packed row whose attention mask marks padding",
        "trainer_adapter/hf_decoder.py",
        "if attention_mask is not None and not bool(attention_mask.all()):",
        "if False:",
        (
            "tests/trainer_adapter/test_hf_guards.py::"
            "test_refused_with_a_clear_error_on_every_rank[qwen35-padded-row]",
        ),
    ),
    Mutation(
        "placeholder-own-dtype",
        "a rank without items receives into a placeholder of its own dtype (float32 among bf16)",
        "trainer_adapter/item_exchange.py",
        "        if want is not None and x.dtype != want:",
        "        if False:",
        (
            "tests/trainer_adapter/test_item_dtypes.py::test_rank_without_items_receives_the_senders_dtype",
            "tests/trainer_adapter/test_item_dtypes.py::test_mixed_precision_with_an_empty_rank_as_without_balancing[mistral3]",
        ),
    ),
    Mutation(
        "deepstack-dtype-undeclared",
        "balance_decoder does not declare the deepstack features' dtype (bf16 under autocast)",
        "trainer_adapter/hf_decoder.py",
        '"deepstack": deep[0].dtype if deep else None,',
        '"deepstack": None,',
        (
            "tests/trainer_adapter/test_item_dtypes.py::test_mixed_precision_with_an_empty_rank_as_without_balancing[qwen3vl]",
        ),
    ),
    Mutation(
        "naflex-dtype-undeclared",
        "the padded-rows towers (NaFlex, Gemma 4) do not declare their pixels' dtype",
        "trainer_adapter/hf_naflex.py",
        'dtypes={"patches": getattr(pixel_values, "dtype", None)},',
        'dtypes={"patches": None},',
        (
            "tests/trainer_adapter/test_item_dtypes.py::test_mixed_precision_with_an_empty_rank_as_without_balancing[lfm2vl]",
            "tests/trainer_adapter/test_item_dtypes.py::test_mixed_precision_with_an_empty_rank_as_without_balancing[gemma4]",
        ),
    ),
    Mutation(
        "dtypes-disagreement-unchecked",
        "ranks giving one payload in different dtypes are not refused",
        "trainer_adapter/item_exchange.py",
        "        if given.size > 1:",
        "        if False:",
        (
            "tests/trainer_adapter/test_item_dtypes.py::test_ranks_giving_different_dtypes_refused_on_every_rank",
        ),
    ),
    Mutation(
        "pixtral-sizes-unsent",
        "the Pixtral wrapper gives the receiving rank the sizes of other images",
        "trainer_adapter/hf_pixtral.py",
        'got = route.send(mine, np.ones_like(route.src), "image_sizes")',
        'got = route.send(mine.flip(0), np.ones_like(route.src), "image_sizes")',
        (
            "tests/trainer_adapter/test_hf_tower_sweep.py::"
            "test_balanced_tower_equals_the_tower_alone[mistral3-uneven]",
        ),
    ),
    Mutation(
        "outputs-fractions-unchecked",
        "route_home takes one rank's rows per input row for all without comparing the ranks'",
        "trainer_adapter/item_outputs.py",
        "where, proportional=True)",
        "where, proportional=False)",
        (
            "tests/trainer_adapter/test_hf_guards.py::"
            "test_tower_whose_rows_per_item_vary_refused_on_every_rank",
        ),
    ),
    Mutation(
        "joining-tiles-config-layout",
        "a rank joining a tile round without tiles keeps its own empty block's layout",
        "trainer_adapter/hf_towers.py",
        "            pixel_values = pixel_values.new_zeros((0, *lead, *size))",
        "            pixel_values = pixel_values.new_zeros((0, 3, *size))",
        (
            "tests/trainer_adapter/test_hf_row_shapes.py::"
            "test_rank_without_images_receives_rows_of_the_senders_layout",
        ),
    ),
    Mutation(
        "joining-patches-flat-layout",
        "a rank joining a patch round without images receives flat rows whatever the senders'",
        "trainer_adapter/hf_towers.py",
        "            hidden_states = hidden_states.reshape(0, *shape)",
        "            hidden_states = hidden_states.reshape(0, -1)",
        (
            "tests/trainer_adapter/test_hf_row_shapes.py::"
            "test_rank_without_images_receives_rows_of_the_senders_layout",
        ),
    ),
    Mutation(
        "row-layouts-unchecked",
        "ranks giving rows of different layouts are not compared",
        "trainer_adapter/hf_rounds.py",
        "    if (cols != cols[0]).any():",
        "    if False:",
        (
            "tests/trainer_adapter/test_hf_row_shapes.py::"
            "test_ranks_giving_rows_of_different_layouts_refused_on_every_rank",
        ),
    ),
    Mutation(
        "merged-frames-unchecked",
        "a frame-merging tower (Kimi-K2.5's) balances videos, routed home by one ratio of rows",
        "trainer_adapter/hf_towers.py",
        '    if not callable(getattr(tower, "temporal_merge", None)):',
        "    if True:",
        (
            "tests/trainer_adapter/test_hf_tower_sweep.py::"
            "test_frame_merging_tower_with_videos_refused_on_every_rank",
        ),
    ),
]


def _scratch() -> Path:
    """A copy of the tracked and untracked-unignored files (no .venv, no build output)."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    dst = Path(tempfile.mkdtemp(prefix="equishard-mutant-"))
    for f in filter(None, files):
        src = REPO / f
        if src.is_file():
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / f)
    return dst


def _run_tests(root: Path, tests: tuple[str, ...], timeout: float) -> tuple[bool, float, str]:
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
    t0 = time.perf_counter()
    try:
        r = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return False, time.perf_counter() - t0, "timed out"
    tail = [x for x in r.stdout.splitlines() if x.strip()][-1:] or [""]
    return r.returncode == 0, time.perf_counter() - t0, tail[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--only", default="", help="comma-separated mutation names")
    ap.add_argument("--list", action="store_true", help="list the mutations and exit")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per test run")
    args = ap.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only.split(",")]
    if args.list:
        for m in MUTATIONS:
            print(f"{m.name:28s} {m.what}")
        return 0
    root = _scratch()
    try:
        needed = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
        ok, secs, tail = _run_tests(root, needed, args.timeout)
        print(f"unmutated copy: {'pass' if ok else 'FAIL'} ({secs:.0f} s) {tail}", flush=True)
        if not ok:
            print("the tests fail without any mutation; fix that first", file=sys.stderr)
            return 2
        rows = []
        for m in chosen:
            path = root / m.file
            original = path.read_text()
            if original.count(m.old) < 1:
                rows.append((m, "NOT APPLIED (snippet not found)", 0.0, ""))
                continue
            path.write_text(original.replace(m.old, m.new))
            try:
                passed, secs, tail = _run_tests(root, m.tests, args.timeout)
            finally:
                path.write_text(original)
            rows.append((m, "MISSED" if passed else "caught", secs, tail))
            print(f"{m.name}: {rows[-1][1]} ({secs:.0f} s) {tail}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("\n| mutation | planted bug | result | tests run | seconds |")
    print("|---|---|---|---|---|")
    for m, result, secs, _ in rows:
        tests = ", ".join(t.split("::")[-1] if "::" in t else Path(t).name for t in m.tests)
        print(f"| {m.name} | {m.what} | {result} | {tests} | {secs:.0f} |")
    return 0 if all(r[1] == "caught" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
