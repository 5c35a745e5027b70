"""A short soak (benchmarks/soak.py) in CI: the real server under a minute of mixed load (streams, n > 1, stop
strings, structured outputs, disconnects, timeouts, bad inputs): no 5xx, every bad input a 4xx, no KV block held
after the load, and no steady RSS growth after warm-up."""

import asyncio

from benchmarks.soak import run_load, start_server


def test_a_minute_of_mixed_load_leaks_nothing():
    proc, url, pids, log = start_server("--max_model_len", "512", "--kv_cache_memory_gb", "0.1",
                                        "--max_num_seqs", "16")
    try:
        lines = []
        summary = asyncio.run(run_load(url, 60, 6, pids, seed=1, report=lines.append))
    finally:
        proc.terminate()
        code = proc.wait(120)
    text = open(log).read()
    assert not summary["gone"], f"processes {summary['gone']} died under load; server log:\n{text[-6000:]}"
    assert code == 0, text[-2000:]
    assert summary["status"].get(5, 0) == 0 and summary["status"].get(2, 0) > 20, lines
    assert summary["bad_not_4xx"] == 0 and summary["aborted"] > 0
    assert summary["leaked"] == {"running": 0.0, "kv_usage": 0.0}
    assert "Traceback" not in text, text[-3000:]
    for first, growth in zip(summary["rss_mb_first"], summary["rss_growth_mb_after_warmup"]):
        assert growth < max(64, 0.2 * first), lines  # allocator settling, not a leak per request
