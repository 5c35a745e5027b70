"""64 concurrent streaming clients, a third of them disconnecting mid-stream."""

import asyncio
import json

import httpx
from prometheus_client.parser import text_string_to_metric_families


def _gauge(text, name):
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                return s.value
    raise KeyError(name)


def test_sixty_four_streams_with_disconnects(server):
    async def client(i, http):
        body = {"prompt": f"Story number {i}: once upon a time", "max_tokens": 24, "temperature": 0.7, "seed": i,
                "ignore_eos": True, "stream": True}
        chunks, finish = 0, None
        async with http.stream("POST", server.url + "/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            async for line in resp.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks += 1
                    finish = json.loads(line[6:])["choices"][0]["finish_reason"] or finish
                    if i % 3 == 0 and chunks == 3:
                        return "disconnected"
                if line == "data: [DONE]":
                    return finish
        return "no [DONE]"

    async def health_watch(http, stop):
        codes = []
        while not stop.is_set():
            codes.append((await http.get(server.url + "/health")).status_code)
            await asyncio.sleep(0.2)
        return codes

    async def main():
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(timeout=300, limits=limits) as http:
            stop = asyncio.Event()
            watch = asyncio.create_task(health_watch(http, stop))
            results = await asyncio.gather(*(client(i, http) for i in range(64)))
            stop.set()
            return results, await watch

    results, health = asyncio.run(main())
    for i, r in enumerate(results):
        if i % 3 == 0:
            assert r == "disconnected"
        else:
            assert r == "length", (i, r)  # every kept stream ran to its 24 tokens and ended properly
    assert health and all(code == 200 for code in health)
    # Disconnected streams were aborted: the pool drains back to empty.
    for _ in range(100):
        text = httpx.get(server.url + "/metrics").text
        if _gauge(text, "rtp_llm_kv_cache_usage_ratio") == 0 and _gauge(text, "rtp_llm_num_requests_running") == 0:
            break
        asyncio.run(asyncio.sleep(0.2))
    assert _gauge(text, "rtp_llm_kv_cache_usage_ratio") == 0
    assert _gauge(text, "rtp_llm_num_requests_running") == 0
    assert _gauge(text, "rtp_llm_num_requests_waiting") == 0
