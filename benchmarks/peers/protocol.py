"""The pipe protocol between benchmarks.engines.PipePeer and the peer drivers (*_peer.py), which run as
scripts in their own venvs and import this file from their own folder: one JSON job per input line
({"prompts": [[token ids]], "new_tokens": N}), one result line per job prefixed with RESULT_MARK, because
peers log to stdout too."""

RESULT_MARK = "@@rtp-llm-peer@@ "
