"""The loop that serves an EngineCore to its client, one for the engine thread and the engine process alike:
apply the client's commands (engine/protocol.py), step while there is work, send each step's deltas; when idle,
sleep on the transport until a command comes (or the client goes).

A transport carries the typed messages: recv(timeout) -> message or None when nothing came in time (timeout None:
wait), raising EOFError / OSError once the client is gone; send(message), callable from any thread (the
tensor-parallel monitor reports from its own).
"""

from __future__ import annotations

import faulthandler
import gc
import logging
import pickle
import queue
import threading
from typing import Callable, Optional

from rtp_llm.engine.child_process import become_child
from rtp_llm.engine.protocol import (AbortRequest, AddRequest, CoreDied, Rejected, Ready, Shutdown, StartupFailed,
                                     StatsUpdate, StepOutputs, UnloadLoRA, WorkerFailed)

log = logging.getLogger("rtp_llm.engine.core_loop")

class PipeTransport:
    """The engine process's end of the pipe to the server process."""

    def __init__(self, conn):
        self.conn = conn
        self._lock = threading.Lock()

    def recv(self, timeout: Optional[float]):
        return self.conn.recv() if self.conn.poll(timeout) else None

    def send(self, msg) -> None:
        with self._lock:
            self.conn.send(msg)


class ThreadTransport:
    """The engine thread's link to a client in the same process: commands on a queue, messages handed to
    `deliver` on the engine thread."""

    def __init__(self, deliver: Callable[[object], None]):
        self.commands: queue.SimpleQueue = queue.SimpleQueue()
        self.deliver = deliver

    def recv(self, timeout: Optional[float]):
        try:
            return self.commands.get(block=timeout != 0, timeout=timeout or None)
        except queue.Empty:
            return None

    def send(self, msg) -> None:
        self.deliver(msg)


def serve(core, transport) -> None:
    """Runs the core until Shutdown or the client is gone; raises what the core raises."""
    while True:
        try:
            msg = transport.recv(0 if core.has_unfinished() else None)
            changed = False
            while msg is not None:
                if isinstance(msg, Shutdown):
                    return
                _apply(core, msg, transport)
                changed = True
                msg = transport.recv(0)
        except (EOFError, OSError):
            log.info("the engine's client is gone; the engine stops")
            return
        if core.has_unfinished():
            steps = core.counters["steps"]
            outs = core.step()
            while core.rejected:  # refused after add_request (an adapter that failed to load): none of it ran
                rid, exc = core.rejected.pop(0)
                transport.send(Rejected(rid, picklable(exc)))
            if outs or core.counters["steps"] != steps:
                transport.send(StepOutputs(outs, core.stats()))
        elif changed:
            transport.send(StatsUpdate(core.stats()))


def _apply(core, msg, transport) -> None:
    if isinstance(msg, AddRequest):
        try:
            core.add_request(msg.request)
        except Exception as exc:  # a refusal (queue full, id in use) ends the caller's stream; silence means accepted
            transport.send(Rejected(msg.request.request_id, picklable(exc)))
    elif isinstance(msg, AbortRequest):
        core.abort(msg.request_id)
    elif isinstance(msg, UnloadLoRA):
        core.unload_lora(msg.name)
    else:
        raise TypeError(f"unexpected message for the engine core: {type(msg).__name__}")


def run(core, transport) -> None:
    """Serves the core on this thread until it stops; a core that breaks is reported as CoreDied. The core is
    closed here: tensor-parallel collectives must not interleave with a step."""
    try:
        core.device.bind_thread()
        if core.tp_runtime is not None:
            core.tp_runtime.on_failure(lambda message: transport.send(WorkerFailed(message)))
        serve(core, transport)
    except (BrokenPipeError, ConnectionResetError):
        log.info("the engine's client is gone; the engine stops")
    except BaseException as exc:  # noqa: BLE001 - the engine broke: the client fails its streams
        log.exception("engine loop died")
        try:
            transport.send(CoreDied(picklable(exc)))
        except OSError:
            pass
    finally:
        core.close()


def run_engine_process(config, conn, log_level: str) -> None:
    """Entry point of the engine process (multiprocessing spawn target): builds the core, says Ready, serves."""
    become_child()
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # A fatal signal in a kernel (SIGSEGV, SIGILL, SIGBUS) prints this process's Python stack to the server's log:
    # the op and the step that died, where the server itself can only say that the engine exited.
    faulthandler.enable()
    transport = PipeTransport(conn)
    from rtp_llm.engine.core import EngineCore

    try:
        core = EngineCore(config)
    except BaseException as exc:  # noqa: BLE001 - reported to the client, which prints it and exits
        transport.send(StartupFailed(picklable(exc)))
        return
    # Start-up objects (modules, the model, the tokenizer) live as long as the process: the cyclic collector need
    # not rescan them in every full collection of the serving loop.
    gc.freeze()
    try:
        transport.send(Ready(core.model_path, core.limits, core.stats()))
    except OSError:
        core.close()
        return
    run(core, transport)


def picklable(exc: BaseException) -> BaseException:
    """The exception itself if it survives pickling (the pipe), else a RuntimeError naming it."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - an exception type that does not survive pickling
        return RuntimeError(f"{type(exc).__name__}: {exc}")
