"""The scheduler on its own, without a model (as vLLM's tests/v1/core/test_scheduler.py): token and sequence
budgets, chunked prefill, the order of work in a step, FIFO admission, preemption and recompute, prefix-cache
hits, n > 1 forks, and the block tables it hands the runner. A step's "model" appends a token per sample row."""

from __future__ import annotations

import pytest

from rtp_llm.engine.scheduler import Scheduler
from rtp_llm.engine.sequence import Request, Sequence, SeqState
from rtp_llm.sampling import SamplingParams

BS = 4  # tokens per block


def scheduler(num_blocks=64, max_num_seqs=8, max_tokens=64, prefill_chunk=None, prefix=True) -> Scheduler:
    return Scheduler(num_blocks, BS, prefix, max_num_seqs, max_tokens, prefill_chunk or max_tokens)


_ids = iter(range(1, 1 << 30))


def request(rid: str, prompt: list[int], n: int = 1) -> Request:
    req = Request(rid, list(prompt), SamplingParams(max_tokens=100, n=n))
    req.sequences = [Sequence(next(_ids), req, i, seed=i, detok=None) for i in range(n)]
    for sib in req.sequences[1:]:
        sib.state = SeqState.PENDING_FORK
    return req


def add(s: Scheduler, req: Request) -> Request:
    s.add(req.sequences[0])
    return req


def step(s: Scheduler, token: int = 7):
    """One scheduler step, then what the core does after the model ran: forks, then a token per sample row."""
    out = s.schedule()
    s.fork_siblings(out)
    for seq, _ in out.sample_rows:
        seq.output.append(token)
    return out


def prompt(n: int, base: int = 10) -> list[int]:
    return [base + i for i in range(n)]


def test_a_step_never_exceeds_the_token_budget_and_chunks_cover_each_prompt_once():
    s = scheduler(max_tokens=16)
    reqs = [add(s, request(f"r{i}", prompt(10, 10 * i))) for i in range(3)]
    computed = {r.request_id: [] for r in reqs}
    for _ in range(6):
        out = step(s)
        assert out.num_tokens <= 16
        for x in out.scheduled:
            if x.start < len(x.seq.prompt):  # a prefill chunk: the next tokens of the prompt, in order
                computed[x.seq.request.request_id].append((x.start, x.tokens))
    for r in reqs:
        pos, toks = 0, []
        for start, chunk in computed[r.request_id]:
            assert start == pos
            pos += len(chunk)
            toks += chunk
        assert toks[:len(r.prompt_ids)] == r.prompt_ids


def test_chunked_prefill_samples_only_after_the_last_chunk_and_decodes_go_first():
    s = scheduler(max_tokens=64, prefill_chunk=4)
    a = add(s, request("a", prompt(3)))
    out = step(s)  # a: one whole chunk (3 tokens), sampled
    assert [(x.start, len(x.tokens), x.needs_sample) for x in out.scheduled] == [(0, 3, True)]
    b = add(s, request("b", prompt(10, 50)))
    seen = []
    for _ in range(3):
        out = step(s)
        seen.append([(x.seq.request.request_id, x.start, len(x.tokens), x.needs_sample) for x in out.scheduled])
    # a decodes every step (first in the batch); b's prompt goes 4 + 4 + 2, sampled after the last chunk only
    assert seen == [[("a", 3, 1, True), ("b", 0, 4, False)],
                    [("a", 4, 1, True), ("b", 4, 4, False)],
                    [("a", 5, 1, True), ("b", 8, 2, True)]]
    out = step(s)
    assert [(x.seq.request.request_id, x.start, len(x.tokens)) for x in out.scheduled] == [("a", 6, 1), ("b", 10, 1)]
    assert a.sequences[0].output == [7] * 5 and b.sequences[0].output == [7, 7]


def test_max_num_seqs_caps_the_running_set_and_admission_is_fifo():
    s = scheduler(max_num_seqs=2)
    reqs = [add(s, request(f"r{i}", prompt(5, 20 * i))) for i in range(4)]
    out = step(s)
    assert [x.seq.request.request_id for x in out.scheduled] == ["r0", "r1"]
    assert [q.request.request_id for q in s.waiting] == ["r2", "r3"]
    s.finish(reqs[1].sequences[0])
    out = step(s)
    assert [x.seq.request.request_id for x in out.scheduled] == ["r0", "r2"]  # r2 before r3: arrival order
    assert len(s.running) == 2 and [q.request.request_id for q in s.waiting] == ["r3"]


def test_preemption_frees_the_newest_and_recomputes_it_with_its_output():
    # 6 usable blocks of 4: two 8-token prompts take 4; decoding grows both until the pool runs out.
    s = scheduler(num_blocks=7, prefix=False)
    a, b = add(s, request("a", prompt(8))), add(s, request("b", prompt(8, 40)))
    step(s)
    preempted = None
    for t in range(12):
        out = step(s, token=100 + t)
        if out.preempted:
            preempted = out
            break
    assert preempted is not None and preempted.preempted == [b.sequences[0]]  # the newest admission
    victim = b.sequences[0]
    assert victim.state == SeqState.WAITING and not s.manager.has_sequence(victim.seq_id) and s.waiting[0] is victim
    assert s.num_preemptions == 1
    kept = list(victim.output)
    assert len(kept) >= 1
    # a runs on alone; when it finishes, b comes back and recomputes prompt + output in one prefill
    s.finish(a.sequences[0])
    out = step(s)
    (x,) = out.scheduled
    assert x.seq is victim and x.start == 0 and x.tokens == b.prompt_ids + kept and x.needs_sample
    assert victim.output[:len(kept)] == kept


def test_a_cached_prefix_is_not_recomputed():
    s = scheduler(prefix=True)
    shared = prompt(8, 60)  # two full blocks
    a = add(s, request("a", shared + [1, 2]))
    step(s)
    s.finish(a.sequences[0])  # its full blocks stay cached
    b = add(s, request("b", shared + [3]))
    out = step(s)
    (x,) = out.scheduled
    assert x.start == 8 and x.tokens == [3] and b.cached_tokens == 8
    assert s.manager.stats().prefix_hit_tokens >= 8


def test_n_samples_sample_from_the_parents_row_and_fork_its_blocks():
    s = scheduler(prefix=False)
    r = add(s, request("n", prompt(6), n=3))
    out = s.schedule()
    parent, *sibs = r.sequences
    assert [(q, row) for q, row in out.sample_rows] == [(parent, 0), (sibs[0], 0), (sibs[1], 0)]
    assert all(q.state == SeqState.PENDING_FORK for q in sibs)
    s.fork_siblings(out)
    assert all(q.state == SeqState.RUNNING and s.manager.has_sequence(q.seq_id) for q in sibs)
    tables = [s.manager.block_table(q.seq_id) for q in r.sequences]
    assert tables[0] == tables[1] == tables[2]
    assert all(s.manager.ref_count(blk) == 3 for blk in tables[0])
    for i, q in enumerate(r.sequences):
        q.output.append(100 + i)
    out = s.schedule()  # three decodes; the shared partial block is copied on write
    assert sorted(x.seq.index for x in out.scheduled) == [0, 1, 2]
    assert len(out.copies) == 2
    rows = {x.seq.index: out.block_table[i] for i, x in enumerate(out.scheduled)}
    assert len({tuple(v[:2]) for v in rows.values()}) == 3  # each now writes its own last block


def test_the_block_table_is_each_sequences_own():
    s = scheduler()
    reqs = [add(s, request(f"r{i}", prompt(n, 30 * i))) for i, n in enumerate((3, 9, 13))]
    out = s.schedule()
    width = out.block_table.shape[1]
    assert width == -(-13 // BS)
    for i, x in enumerate(out.scheduled):
        own = s.manager.block_table(x.seq.seq_id)
        assert list(out.block_table[i][:len(own)]) == own
        assert list(x.slots) == [own[p // BS] * BS + p % BS for p in range(x.start, x.start + len(x.tokens))]
    assert [x.seq for x in out.scheduled] == [r.sequences[0] for r in reqs]


def test_finish_frees_every_block_whatever_the_state():
    s = scheduler(prefix=False, max_tokens=8, prefill_chunk=4)
    running = add(s, request("run", prompt(10)))
    waiting = add(s, request("wait", prompt(10, 40)))
    out = step(s)  # a budget of 8 tokens in chunks of 4: both admitted, each with its first chunk
    assert [(x.seq.request.request_id, len(x.tokens)) for x in out.scheduled] == [("run", 4), ("wait", 4)]
    third = add(s, request("third", prompt(5, 80)))  # and one still waiting
    for r in (running, waiting, third):
        s.finish(r.sequences[0])
    stats = s.manager.stats()
    assert stats.used_blocks == 0 and stats.num_sequences == 0
    assert not s.running and not s.waiting
    assert all(q.state == SeqState.FINISHED for r in (running, waiting, third) for q in r.sequences)


@pytest.mark.parametrize("chunk", [1, 3, 64])
def test_every_step_is_within_budget_under_random_arrivals(chunk):
    import random

    rng = random.Random(chunk)
    s = scheduler(num_blocks=24, max_num_seqs=4, max_tokens=12, prefill_chunk=chunk, prefix=True)
    live = []
    for t in range(300):
        if rng.random() < 0.3:
            live.append(add(s, request(f"q{t}", [rng.randint(3, 9) for _ in range(rng.randint(1, 20))],
                                       n=rng.choice([1, 1, 2]))))
        out = step(s, token=rng.randint(3, 9))
        assert out.num_tokens <= 12 and len(s.running) <= 4
        for r in list(live):
            if any(len(q.output) >= 5 for q in r.sequences):
                for q in r.sequences:
                    if not q.finished:
                        s.finish(q)
                live.remove(r)
    for r in live:
        for q in r.sequences:
            if not q.finished:
                s.finish(q)
    assert s.manager.stats().used_blocks == 0


def test_drafts_ride_with_their_decode_and_give_back_what_is_rejected():
    """A speculating sequence computes its last token and its drafts (every row samples); the budget counts the
    drafts; settling keeps the accepted ones' KV and returns the rest; short of blocks the drafts go first."""
    s = scheduler(num_blocks=6, max_tokens=6)  # 5 usable blocks of 4
    req = add(s, request("r", prompt(6)))
    step(s)  # the prompt
    seq = req.sequences[0]
    seq.draft = [1, 2, 3, 4, 5, 6, 7]
    out = s.schedule()
    (x,) = out.scheduled
    assert x.tokens == [seq.output[-1]] + [1, 2, 3, 4, 5] and x.draft == [1, 2, 3, 4, 5]  # 6 tokens of budget
    assert [r for _, r in out.sample_rows] == list(range(6)) and out.sample_ahead == list(range(6))
    used = s.manager.stats().used_blocks
    assert used == 3  # 6 prompt + 6 new tokens = 12 slots
    seq.output += [1, 2, 9]  # two drafts accepted, then the bonus token
    s.settle_speculation(seq, x.start + 1 + 2)
    assert seq.num_computed_tokens == 9 == s.manager.num_slots(seq.seq_id)
    assert s.manager.stats().used_blocks == 3 and seq.draft == []
    assert s.manager.num_tokens(seq.seq_id) == 9 and seq.remaining == 1
    # Another prompt takes the last 2 blocks: 5 drafts would need one more, so it decodes without them.
    other = add(s, request("o", prompt(8, 50)))
    step(s)
    assert other.sequences[0].state == SeqState.RUNNING and s.manager.num_available_blocks() == 0
    seq.draft = [1, 2, 3, 4, 5]
    out = s.schedule()
    mine = [x for x in out.scheduled if x.seq is seq]
    assert mine and mine[0].draft == [] and len(mine[0].tokens) == 1 and not out.preempted
