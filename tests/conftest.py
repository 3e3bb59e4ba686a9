import os
import sys
from pathlib import Path

import pytest

# The commands keep saved prompts in $EDGESPEC_HOME/prompt-cache by default; in the tests
# a state one test left would be restored by the next. Tests of the folder name their own.
os.environ["EDGESPEC_CACHE_DISK"] = "0"

# Test helpers (exactness.py, ggufs.py) are imported as plain modules.
sys.path.insert(0, str(Path(__file__).parent))

from ggufs import perturbed, tiny_llama_weights, write_tiny_llama_gguf  # noqa: E402


@pytest.fixture(scope="session")
def tiny_gguf_pair(tmp_path_factory):
    """(target, drafter) tiny F32 llama GGUF files with a 16-token vocabulary."""
    folder = tmp_path_factory.mktemp("tiny-gguf")
    weights = tiny_llama_weights(seed=0)
    target = write_tiny_llama_gguf(folder / "target.gguf", weights)
    draft = write_tiny_llama_gguf(folder / "draft.gguf", perturbed(weights, scale=0.3, seed=1))
    return target, draft


@pytest.fixture(scope="session")
def smollm2_path():
    """The real SmolLM2-135M-Instruct Q4_1 GGUF (fetched once into $EDGESPEC_HOME)."""
    from edgespec.models.catalog import resolve_model
    return resolve_model("smollm2-135m-instruct", fetch=True)


@pytest.fixture(scope="session")
def smollm2_q2k_path(smollm2_path, tmp_path_factory):
    """SmolLM2 requantized to Q2_K: a real, cheaper, slightly different drafter."""
    from edgespec.models.quantize import quantize_gguf
    return quantize_gguf(smollm2_path, tmp_path_factory.mktemp("quant") / "smollm2-q2_k.gguf", "Q2_K")
