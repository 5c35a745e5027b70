"""The engine process's side of EngineProcess: the LLMEngine loop, driven over a pipe.

    parent -> core:  ("add", rid, prompt, params) | ("abort", rid) | ("stop",)
    core -> parent:  ("ready", info) | ("error", exc)                       once, at start-up
                     ("added", rid, exc_or_None)                            one per add
                     ("out", [wire outputs], stats) | ("stats", stats)      after a step / after commands
                     ("fatal", message)  a tensor-parallel worker died or hung (from the monitor thread)
                     ("died", exc)       the engine loop raised

A step's outputs travel as deltas (wire_output): the new text and tokens of each sample, the prompt ids
only with a request's first output, the whole text/tokens/logprobs only with its last. The parent
rebuilds full RequestOutputs, so the pipe carries O(new tokens) per step, not O(context).
"""

from __future__ import annotations

import ctypes
import gc
import logging
import signal
import threading

from rtp_llm.engine.outputs import RequestOutput

log = logging.getLogger("rtp_llm.engine_core")

_PR_SET_PDEATHSIG = 1


def wire_output(out: RequestOutput, first: bool) -> tuple:
    comps = [(o.index, o.delta_text, o.delta_token_ids, o.delta_logprobs, o.finish_reason, o.stop_reason,
              (o.text, o.token_ids, o.logprobs) if out.finished else None) for o in out.outputs]
    return (out.request_id, out.prompt_token_ids if first else None, out.finished, out.num_cached_tokens,
            out.error, out.metrics, comps)


def _die_with_parent() -> None:
    """A parent killed outright (SIGKILL, OOM) takes this process with it instead of leaving it holding
    the model's memory until its next pipe read."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the closed pipe still ends the loop
        pass


def _picklable(exc: BaseException) -> BaseException:
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - an exception type that does not survive pickling
        return RuntimeError(f"{type(exc).__name__}: {exc}")


class EngineCore:
    def __init__(self, engine, conn, send):
        self.engine, self.conn, self.send = engine, conn, send
        self._announced: set[str] = set()  # requests whose prompt ids the parent already has

    def run(self) -> None:
        engine = self.engine
        while True:
            busy = engine.has_unfinished()
            changed = False
            if self.conn.poll(0 if busy else None):  # idle: sleep until a command (or the parent goes)
                changed = self._drain()
                if changed is None:
                    return
            if engine.has_unfinished():
                steps = engine.counters["steps"]
                outs = engine.step()
                if outs or engine.counters["steps"] != steps:
                    self.send(("out", [self._wire(o) for o in outs], engine.stats()))
            elif changed:
                self.send(("stats", engine.stats()))

    def _wire(self, out: RequestOutput) -> tuple:
        rid = out.request_id
        first = rid not in self._announced
        if out.finished:
            self._announced.discard(rid)
        elif first:
            self._announced.add(rid)
        return wire_output(out, first)

    def _drain(self):
        """Applies every queued command; None when told to stop or the parent is gone."""
        while self.conn.poll(0):
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                log.info("the server process is gone; the engine stops")
                return None
            kind = msg[0]
            if kind == "add":
                _, rid, prompt, params = msg
                try:
                    self.engine.add_request(rid, prompt, params)
                    self.send(("added", rid, None))
                except Exception as exc:  # validation errors go back to the caller
                    self.send(("added", rid, _picklable(exc)))
            elif kind == "abort":
                self.engine.abort(msg[1])
            elif kind == "stop":
                return None
        return True


def run_engine_core(config, conn, log_level: str) -> None:
    """Entry point of the engine process (multiprocessing spawn target)."""
    _die_with_parent()
    # Ctrl-C reaches the whole foreground process group: the server decides how to stop, not this process.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    lock = threading.Lock()

    def send(msg) -> None:
        with lock:  # the tensor-parallel monitor thread sends too
            conn.send(msg)

    from rtp_llm.engine.llm_engine import LLMEngine

    try:
        engine = LLMEngine(config)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which prints it and exits
        send(("error", _picklable(exc)))
        return
    try:
        if engine.tp_runtime is not None:
            engine.tp_runtime.on_failure(lambda message: send(("fatal", message)))
        # Start-up objects (modules, the model, the tokenizer) live as long as the process: the cyclic collector
        # need not rescan them in every full collection of the serving loop.
        gc.freeze()
        send(("ready", {"model_path": engine.model_path, "max_model_len": engine.max_model_len,
                        "stats": engine.stats()}))
        EngineCore(engine, conn, send).run()
    except (BrokenPipeError, ConnectionResetError):
        log.info("the server process is gone; the engine stops")
    except BaseException as exc:  # noqa: BLE001 - the engine broke: the server fails its streams and exits
        log.exception("engine loop died")
        try:
            send(("died", _picklable(exc)))
        except OSError:
            pass
    finally:
        # Closing belongs to this thread: tensor-parallel collectives must not interleave with a step.
        engine.close()
