"""LoRA adapters on the emulated NPU (bfloat16): the deltas run as torch ops (TorchOps.lora_add: index_select, mm in
float32, index_copy_), which torch_npu implements. Two adapters and the base in one batch: each row the same bits as
its run alone (an emulator fact: on hardware it also rests on mm's reduction order), each adapter's greedy tokens
those of transformers + peft in bfloat16 and of the CPU engine in bfloat16 under the bf16 rule."""

import torch

from tests.npu_emulator.install import install

torch_npu = install()

from rtp_llm import LLM, SamplingParams  # noqa: E402
from rtp_llm.lora import LoRARequest  # noqa: E402
from rtp_llm.models.default_model import default_model_path  # noqa: E402
from tests.engine.lora_helpers import make_adapter  # noqa: E402
from tests.models.bf16_rule import (  # noqa: E402
    assert_engines_agree, assert_transformers_agree, margin_of, reference_logits)
from tests.models.tiny_checkpoints import make_checkpoint  # noqa: E402

PROMPTS = [[5, 17, 33, 2, 90, 14, 7], [100, 3, 3, 41, 8, 250, 61, 19, 4, 77, 12], [9, 9, 9, 4]]
GREEDY = SamplingParams(max_tokens=10, temperature=0, logprobs=2, ignore_eos=True)


def test_adapters_on_the_npu_agree_with_peft_and_the_cpu(tmp_path):
    base = tmp_path / "base"
    make_checkpoint(base, "llama_hd128")
    refs = [make_adapter(base, tmp_path / "a", 8, seed=1),
            make_adapter(base, tmp_path / "b", 4, ["q_proj", "up_proj", "down_proj"], seed=2)]
    loras = [LoRARequest("a", 1, str(tmp_path / "a")), LoRARequest("b", 2, str(tmp_path / "b")), None]
    runs = {}
    for device, kw in (("npu", dict(num_blocks=24)), ("cpu", dict(dtype="bfloat16", block_size=16))):
        llm = LLM(str(base), tokenizer=default_model_path(), device=device, enable_lora=True, max_loras=2,
                  max_model_len=512, **kw)
        assert llm.core.runner.model.dtype == torch.bfloat16
        mixed = llm.generate(PROMPTS, GREEDY, use_tqdm=False, lora_request=loras)
        if device == "npu":
            assert llm.core.runner.device.type == "npu"
            for prompt, lora, m in zip(PROMPTS, loras, mixed):  # each row alone: the same bits
                alone = llm.generate([prompt], GREEDY, use_tqdm=False, lora_request=lora)[0].outputs[0]
                assert (alone.token_ids, [(x.logprob, x.top) for x in alone.logprobs]) == \
                    (m.outputs[0].token_ids, [(x.logprob, x.top) for x in m.outputs[0].logprobs])
        runs[device] = [m.outputs[0] for m in mixed]
    strict = 0
    for prompt, ref, ours, cpu in zip(PROMPTS, refs, runs["npu"], runs["cpu"]):
        ref = ref.to(torch.bfloat16)
        strict += assert_transformers_agree(ref, prompt, ours.token_ids)
        assert_engines_agree(ours, cpu, margin_of(reference_logits(ref, prompt, ours.token_ids)))
    assert strict >= 10  # of 20: most positions' gaps exceed the margin, so the argmax itself was required
    assert len({tuple(o.token_ids) for o in runs["npu"]}) == 3  # each adapter changes the answer
