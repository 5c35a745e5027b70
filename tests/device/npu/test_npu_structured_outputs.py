"""Grammar masks on the emulated NPU: the mask is built on the host and applied where the logits are (torch ops
torch_npu has: index_select, where, amax, index_copy_), so constrained answers match their grammar on the NPU as on
the CPU, beside free requests that keep their tokens."""

import re

import pytest

from tests.npu_emulator.install import install

torch_npu = install()

from rtp_llm.sampling import SamplingParams  # noqa: E402
from tests.device.npu.helpers import engine, tok  # noqa: E402,F401  (tok: a fixture)
from tests.engine.helpers import run_all  # noqa: E402
from tests.models.tiny_checkpoints import make_checkpoint  # noqa: E402

# Digits and commas only: every token the grammar needs is a single character, inside the tiny model's 256 ids.
PATTERN = r"[0-9]{2,6}(,[0-9]{1,4}){1,3}"


@pytest.mark.parametrize("device", ["npu", "cpu"])
def test_constrained_answers_match_and_free_ones_keep_their_tokens(tmp_path, tok, device):
    make_checkpoint(tmp_path, "llama_hd128")
    prompts = [[5, 17, 33, 9], [40, 41, 42, 43, 44, 45], [7] * 9]
    free = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    alone = [run_all(engine(tmp_path, tok, device), [(0, "a", p, free)])["a"].outputs[0].token_ids for p in prompts]
    arrivals = []
    for i, p in enumerate(prompts):
        arrivals.append((0, f"f{i}", p, free))
        arrivals.append((0, f"c{i}", p, SamplingParams(max_tokens=30, temperature=1.0, seed=i,
                                                       structured_outputs={"regex": PATTERN})))
    done = run_all(engine(tmp_path, tok, device), arrivals)
    for i in range(len(prompts)):
        assert done[f"f{i}"].outputs[0].token_ids == alone[i]
        c = done[f"c{i}"].outputs[0]
        assert c.finish_reason == "stop" and re.fullmatch(PATTERN, c.text), c.text
