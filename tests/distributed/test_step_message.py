"""The step message: packing round-trips every field, and the channel delivers messages of any size
between two real gloo processes (growing for a large prefill step, shrinking back for decode steps)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from datetime import timedelta

import numpy as np

from rtp_llm.distributed.step_message import KIND_STEP, KIND_STOP, StepChannel, StepMessage
from tests.server.server_process import free_port


def _random_message(rng: np.random.Generator, batch: int) -> StepMessage:
    q = rng.integers(1, 40, batch)
    width = int(rng.integers(1, 9))
    return StepMessage([rng.integers(0, 150000, n) for n in q], rng.integers(0, 5000, batch).tolist(),
                       [rng.integers(0, 10 ** 6, n) for n in q], rng.integers(0, 2, batch).astype(bool).tolist(),
                       rng.integers(0, 3000, (batch, width)).astype(np.int32),
                       [tuple(int(x) for x in rng.integers(0, 3000, 2)) for _ in range(int(rng.integers(0, 4)))],
                       rng.integers(0, 3, batch).tolist() if batch % 2 else [],
                       [(int(rng.integers(1, 99)), name, f"/adapters/{name}.gguf")
                        for name in ["sql", "čeština-适配器", ""][:int(rng.integers(0, 4))]])


def test_encode_decode_round_trip():
    rng = np.random.default_rng(0)
    for batch in (1, 2, 7, 64):
        msg = _random_message(rng, batch)
        back = StepMessage.decode(msg.encode())
        assert [t.tolist() for t in back.tokens] == [t.tolist() for t in msg.tokens]
        assert [s.tolist() for s in back.slots] == [s.tolist() for s in msg.slots]
        assert back.starts == msg.starts and back.need_logits == msg.need_logits and back.copies == msg.copies
        assert back.loras == (msg.loras or [0] * batch) and back.adapters == msg.adapters  # LoRA ids, names, paths
        assert back.block_table.dtype == np.int32 and np.array_equal(back.block_table, msg.block_table)


RANK1 = textwrap.dedent("""
    import sys
    from datetime import timedelta
    import torch.distributed as dist
    from rtp_llm.distributed.step_message import KIND_STOP, StepChannel
    store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), 2, False, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=1, world_size=2)
    ch = StepChannel(dist.new_group(backend="gloo"))
    while True:
        kind, data = ch.recv()
        print(kind, len(data), int(data.sum()), ch.capacity, flush=True)
        if kind == KIND_STOP:
            break
    dist.destroy_process_group()
""")


def test_channel_delivers_any_size_and_shrinks_after_a_large_message():
    import torch.distributed as dist

    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, 2, True, timeout=timedelta(seconds=60), wait_for_workers=False)
    child = subprocess.Popen([sys.executable, "-c", RANK1, str(port)], stdout=subprocess.PIPE, text=True)
    try:
        dist.init_process_group("gloo", store=store, rank=0, world_size=2)
        ch = StepChannel(dist.new_group(backend="gloo"))
        sizes = [10, 1022, 1023, 50000, 40000, 20, 3, 0, 300000, 700]
        rng = np.random.default_rng(1)
        sent, caps = [], []
        for n in sizes:
            data = rng.integers(-(10 ** 9), 10 ** 9, n)
            ch.send(KIND_STEP, data)
            sent.append((KIND_STEP, n, int(data.sum())))
            caps.append(ch.capacity)
        ch.send(KIND_STOP)
        out, _ = child.communicate(timeout=60)
        dist.destroy_process_group()
    finally:
        if child.poll() is None:
            child.kill()
    got = [tuple(int(x) for x in line.split()) for line in out.split("\n") if line]
    assert [g[:3] for g in got[:-1]] == sent
    assert got[-1][0] == KIND_STOP
    assert [g[3] for g in got[:-1]] == caps  # both sides always agree on the buffer size
    assert caps[3] >= 50002 and caps[5] == StepChannel.MIN_CAPACITY and caps[8] >= 300002
    assert caps[-1] == StepChannel.MIN_CAPACITY  # a decode-sized step after a prefill does not pay for it
