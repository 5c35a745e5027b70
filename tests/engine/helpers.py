"""A tiny random model + transformers reference + a real tokenizer, for engine tests."""

from __future__ import annotations

import dataclasses

import torch

from rtp_llm.config.engine_config import EngineConfig
from rtp_llm.device import get_device
from rtp_llm.engine.core import EngineCore
from rtp_llm.engine.input_processor import InputProcessor
from rtp_llm.engine.outputs import OutputCollector
from rtp_llm.models.default_model import default_model_path
from rtp_llm.models.registry import load_model
from rtp_llm.sampling import SamplingParams
from rtp_llm.tokenizer import Tokenizer
from tests.models.tiny_checkpoints import make_checkpoint


class Driver:
    """An EngineCore driven step by step as the offline API drives it: requests through an InputProcessor (which
    validates them), each step's deltas through an OutputCollector (RequestOutputs with totals). Everything else
    is the core's."""

    def __init__(self, core: EngineCore):
        self.core = core
        self.processor = InputProcessor(core.tokenizer, core.limits)
        self.collector = OutputCollector()

    def add_request(self, request_id, prompt, params=None):
        self.core.add_request(self.processor.process(request_id, prompt, params))

    def step(self):
        return [self.collector.add(d) for d in self.core.step()]

    def __getattr__(self, name):
        return getattr(self.core, name)


def driver(config: EngineConfig, **kwargs) -> Driver:
    return Driver(EngineCore(config, **kwargs))


class Tiny:
    def __init__(self, tmp_path, variant="qwen3_gqa2_headdim32_untied", dtype="float32", device_ops: bool = False):
        """device_ops: the model runs the CPU device's kernels (as the server does), not plain torch ops."""
        self.hf = make_checkpoint(tmp_path, variant)
        self.hf.generation_config.eos_token_id = None
        ops = get_device("cpu").ops() if device_ops else None
        self.model, self.cfg = load_model(str(tmp_path), dtype=dtype, ops=ops)
        # The real SmolLM2 tokenizer: detokenises the tiny model's ids (all < 256) into real text.
        self.tokenizer = Tokenizer.load(default_model_path())
        self._ref: dict[tuple, list[int]] = {}

    def engine(self, eos_token_ids=(), **kwargs) -> Driver:
        args = dict(block_size=4, num_blocks=256, max_num_seqs=16, max_num_batched_tokens=256, max_model_len=512)
        args.update(kwargs)
        cfg = dataclasses.replace(self.cfg, eos_token_ids=list(eos_token_ids))
        tok = self.tokenizer
        if eos_token_ids:  # a model whose EOS is the given token: the tokenizer's EOS must not interfere
            tok = Tokenizer(tok.backend, tok.chat_template, None, None)
        return driver(EngineConfig(**args), model=self.model, model_config=cfg, tokenizer=tok)

    def greedy(self, prompt: list[int], n: int) -> list[int]:
        """transformers' own greedy continuation (its KV cache, no batching)."""
        key = (tuple(prompt), n)
        if key not in self._ref:
            with torch.no_grad():
                out = self.hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                       max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
            self._ref[key] = out[0, len(prompt):].tolist()
        return self._ref[key]


def run_all(engine: Driver, arrivals: list[tuple[int, str, list[int], SamplingParams]], max_steps=100000):
    """Adds request (rid, prompt, params) at its step index; steps until all finish; {rid: output}."""
    done, step = {}, 0
    pending = sorted(arrivals, key=lambda a: a[0])
    while pending or engine.has_unfinished():
        while pending and pending[0][0] <= step:
            _, rid, prompt, params = pending.pop(0)
            engine.add_request(rid, prompt, params)
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
        step += 1
        assert step < max_steps, "engine did not finish"
    return done


def greedy(max_tokens, **kw):
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, **kw)


def repetitive(rng, n):
    """A prompt that repeats phrases, so its own n-grams predict the continuation now and then."""
    phrases = [[rng.randrange(3, 250) for _ in range(rng.randrange(2, 6))] for _ in range(4)]
    out = []
    while len(out) < n:
        out += rng.choice(phrases)
    return out[:n]
