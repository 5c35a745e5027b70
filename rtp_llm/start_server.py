"""python -m rtp_llm.start_server: serve a model over HTTP.

With no arguments it serves the embedded default model (SmolLM2-135M-Instruct) on
127.0.0.1:8000. `--help` lists every flag with its environment-variable twin.
"""

from __future__ import annotations

import logging
import os
import sys


def main(argv: list[str] | None = None) -> int:
    from rtp_llm.config.server_args import engine_config, resolve
    from rtp_llm.errors import ConfigError

    try:
        args = resolve(argv)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args["log_level"].upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("rtp_llm.start_server")

    from rtp_llm.device import resolve_device
    from rtp_llm.distributed.launch import launch_env
    from rtp_llm.engine.client import ProcessEngineClient
    from rtp_llm.errors import CheckpointError, DeviceError, EngineDeadError, LaunchError

    server = None
    exit_code = 0

    def fatal(exc: BaseException) -> None:
        """The engine process ended or a tensor-parallel rank died or hung: nothing can recover it, so the
        server stops (exit 1). Every open stream has already ended with the error."""
        nonlocal exit_code
        if exit_code:
            return
        exit_code = 1
        log.error("stopping the server: %s", exc)
        if server is not None:
            server.should_exit = True

    try:
        device = resolve_device(args["device"])
        config = engine_config(args, device)
        if config.tp_size > 1:
            env = launch_env(config.tp_size)
            if env.rank != 0:  # torchrun / multi-machine: this process is a worker, rank 0 serves HTTP
                from rtp_llm.engine.tp_worker import run_worker

                return run_worker(config, env)
        engine = ProcessEngineClient(config, on_death=fatal, log_level=args["log_level"])
    except (ConfigError, DeviceError, CheckpointError, LaunchError, ValueError, EngineDeadError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    import uvicorn

    from rtp_llm.models.default_model import SERVED_NAME
    from rtp_llm.server.api import ChatOptions, CorsOptions, create_app
    from rtp_llm.server.serving_lora import LoRAOptions

    name = args["served_model_name"] or (
        SERVED_NAME if config.model is None else os.path.basename(os.path.normpath(config.model)))

    def _stop_engine():
        engine.stop_accepting()
        engine.shutdown()  # the engine process closes the engine (and any tensor-parallel workers)

    template = args["chat_template"]
    if template is not None and os.path.isfile(template):
        with open(template) as f:
            template = f.read()
    app = create_app(engine, name, args["api_key"], args["max_body_bytes"], on_shutdown=_stop_engine,
                     chat_options=ChatOptions(template, args["tool_call_parser"], args["reasoning_parser"],
                                              args["strict_json_schemas"]),
                     cors=CorsOptions(args["allowed_origins"] or [], args["allowed_methods"], args["allowed_headers"],
                                      args["allow_credentials"]),
                     stream_stall_timeout=args["stream_stall_timeout"], unknown_fields=args["unknown_fields"],
                     lora=LoRAOptions(config.enable_lora, config.lora_modules or {}, config.max_lora_rank,
                                      args["allow_runtime_lora_updating"], config.model, config.model_type,
                                      config.hf_overrides))

    log.info("serving %s as %r on http://%s:%d (device %s, engine process pid %d)", engine.model_path, name,
             args["host"], args["port"], device, engine.pid)
    if not args["api_key"] and args["host"] not in ("127.0.0.1", "localhost", "::1"):
        log.warning("listening on %s without --api_key: anyone who can reach this address can use the model "
                    "(set --api_key / API_KEY, or --host 127.0.0.1)", args["host"])
    class _Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            if not self.should_exit:
                log.info("signal %d: no new requests; in-flight ones get %.0fs to finish", sig,
                         args["shutdown_timeout"])
            super().handle_exit(sig, frame)
            # uvicorn re-raises the signal after a graceful stop; a requested stop is a clean exit (0).
            self._captured_signals.clear()

    server = _Server(uvicorn.Config(app, host=args["host"], port=args["port"], log_level=args["log_level"],
                                           timeout_graceful_shutdown=args["shutdown_timeout"], access_log=False))
    if exit_code:  # the engine (or a tensor-parallel worker) died while the server was starting
        engine.shutdown()
        return exit_code
    server.run()
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
