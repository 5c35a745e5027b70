"""A tensor-parallel worker (ranks 1..N-1): loads its weight slices, holds the KV cache of its heads, and
runs every step rank 0 broadcasts until rank 0 says stop. It never schedules, samples or tokenizes.

Spawned by rank 0 as `python -m rtp_llm.engine.tp_worker` (the EngineConfig comes as JSON in
RTP_LLM_ENGINE_CONFIG), or entered from start_server when torchrun's RANK is not 0.
"""

from __future__ import annotations

import json
import logging
import os
import sys

from rtp_llm.config.engine_config import EngineConfig
from rtp_llm.engine.child_process import become_child
from rtp_llm.distributed.launch import CONFIG_ENV, SPAWNED_ENV, LaunchEnv, join_as_worker, launch_env

log = logging.getLogger("rtp_llm.engine.tp_worker")


def run_worker(config: EngineConfig, env: LaunchEnv) -> int:
    from rtp_llm.cache import kv_cache_blocks
    from rtp_llm.device import get_device
    from rtp_llm.engine.model_runner import ModelRunner
    from rtp_llm.lora import LoRAManager
    from rtp_llm.pooling import runs_pooling
    from rtp_llm.models.default_model import with_default_model
    from rtp_llm.models.gguf_reader import shared_gguf_files
    from rtp_llm.models.registry import load_engine_model

    config = with_default_model(config)  # torchrun-style ranks start from the command line, as rank 0 does
    device = get_device(config.device, env.local_rank, config.device_options)
    device.bind_thread()
    tp, heartbeat = join_as_worker(config, device, env)
    try:
        block_size = config.block_size or device.default_block_size
        device.validate_block_size(block_size)
        with shared_gguf_files():  # a GGUF's metadata parsed once for the config and the weights
            model, cfg = load_engine_model(config, device, tp)
        num_blocks = tp.all_reduce_min(kv_cache_blocks(config, device, cfg.num_layers, block_size,
                                                       model.shard.num_kv_heads, cfg.head_dim, model.dtype))
        runner = ModelRunner(model, cfg, num_blocks, block_size, device, config.attention_backend, tp)
        runner.pools = runs_pooling(config.runner, cfg)
        runner.lora = LoRAManager.for_engine(config, model, runner.pools, device)  # this rank's slices of adapters
        log.info("tensor-parallel rank %d/%d ready: heads %d-%d, kv heads %d-%d, %d KV blocks", env.rank, env.size,
                 model.shard.head_start, model.shard.head_stop - 1, model.shard.kv_start, model.shard.kv_stop - 1,
                 num_blocks)
        while True:
            msg = tp.recv_step()
            if msg is None:
                break
            runner.forward(msg)
    except Exception as exc:
        log.error("tensor-parallel rank %d failed: %s: %s", env.rank, type(exc).__name__, exc)
        return 1
    finally:
        heartbeat.stop()
    tp.close()
    return 0


def main() -> int:
    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "info").upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parent = int(os.environ.get(SPAWNED_ENV, "0"))
    if parent:  # spawned by rank 0 (not a torchrun rank): it must not outlive rank 0
        become_child(parent)
    config = EngineConfig(**json.loads(os.environ[CONFIG_ENV]))
    return run_worker(config, launch_env(config.tp_size))


if __name__ == "__main__":
    sys.exit(main())
