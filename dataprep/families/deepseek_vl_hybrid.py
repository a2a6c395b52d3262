"""DeepSeek-VL 7B (``DeepseekVLHybridProcessor``): SigLIP's patches and SAM's of a 1024-px copy,
576 tokens an image; its template writes DeepSeek-VL's marker (``#images=deepseek_vl``)."""

from dataprep.families.deepseek_vl import SPEC as DEEPSEEK_VL
from dataprep.families.processor_settings import FIXED_SIZE_CHECKS, image_setting
from dataprep.families.spec import FamilySpec, PackerRules, policy
from dataprep.policies.deepseek_hybrid import DeepseekHybridPolicy

SPEC = FamilySpec(
    name="deepseek_vl_hybrid",
    models="DeepSeek-VL 7B",
    policies=("deepseek-vl-hybrid",),
    policy_specs={
        "deepseek-vl-hybrid": policy(
            DeepseekHybridPolicy,
            ("image_size", "patch_size", "high_res_size", "high_res_patch_size"),
            help="DeepSeek-VL 7B: 576 tokens an image, SigLIP's 576 patches and SAM's 4096\n"
            "(its 1024px copy) as two encoder sequences\n"
            "options: deepseek-vl-hybrid:image_size=384,high_res_size=1024",
        )
    },
    template="deepseek_vl",
    image_tokens=DEEPSEEK_VL.image_tokens,
    processor_checks=(
        *FIXED_SIZE_CHECKS,
        ("high_res_size", image_setting("high_res_size", "height")),
    ),
    packer=PackerRules(fixed_tokens=True, beside=("high_res_pixel_values",)),
)
