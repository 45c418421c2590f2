"""`turnstile chat`: several named conversations in one model, driven by a prompt or a script on stdin.

A plain line is a message to the current conversation (streamed back); a line starting with "/" is a command.
Lines are read in a daemon thread, so a blocked read never holds up the event loop or the exit.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel

from runtime.api import Runtime
from runtime.cli.term import Progress, Style, is_tty, seconds, size, wants_colour
from runtime.errors import SessionNotFound, TurnstileError
from runtime.reply import Reply

HELP = """\
commands:
  /new NAME [SYSTEM PROMPT]  start a conversation and switch to it
  /switch NAME               switch to another conversation
  /list                      list the conversations (* is the current one)
  /history                   show the current conversation
  /fork NEW                  copy the current conversation to NEW and switch to it
  /undo                      drop the last exchange
  /regen                     answer the last message again
  /edit NEW TEXT             replace the last user message with NEW TEXT and answer it again
  /stats                     what the cache and the queue did so far
  /help                      this list
  /quit                      leave (so does the end of input)
anything else is a message to the current conversation"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--session", default="main", metavar="NAME", help="the conversation to start in (default main)")
    p.add_argument("--system", default=None, metavar="TEXT", help="system prompt for new conversations without one")


async def read_line(prompt: str | None = None) -> str | None:
    """One line from stdin without its newline, None at the end of input; `prompt` is written first."""
    token = anyio.lowlevel.current_token()
    done = anyio.Event()
    box: list[str | None] = []

    def reader() -> None:
        try:
            if prompt is not None:
                sys.stdout.write(prompt)
                sys.stdout.flush()
            line = sys.stdin.readline()
            box.append(line.rstrip("\r\n") if line else None)
        except (OSError, ValueError):  # stdin closed
            box.append(None)
        with contextlib.suppress(Exception):  # the event loop is gone: nobody is waiting any more
            anyio.from_thread.run_sync(done.set, token=token)

    threading.Thread(target=reader, name="turnstile-stdin", daemon=True).start()
    await done.wait()
    return box[0]


class Chat:
    """The prompt loop over one runtime."""

    def __init__(self, rt: Runtime, args: argparse.Namespace) -> None:
        self.rt = rt
        self.current: str = args.session
        self.system: str | None = args.system
        self.sampling: dict[str, Any] = {"temperature": args.temperature, "max_tokens": args.max_tokens}
        if args.seed is not None:
            self.sampling["seed"] = args.seed
        self.out = sys.stdout
        self.style = Style(wants_colour(self.out))
        self.interactive = is_tty(sys.stdin)
        self.progress = Progress()

    def say(self, text: str = "", *styles: str) -> None:
        self.out.write(self.style(text, *styles) + "\n")
        self.out.flush()

    def error(self, text: str) -> None:
        self.out.flush()
        sys.stderr.write(self.style(f"error: {text}", "red") + "\n")
        sys.stderr.flush()

    async def run(self) -> int:
        await self.ensure(self.current)
        if self.interactive:
            self.say(f"turnstile chat: conversation {self.current!r}; /help lists the commands, /quit leaves", "dim")
        while True:
            line = await read_line(f"{self.current}> " if self.interactive else None)
            if line is None:
                break
            line = line.strip()
            if not line:
                continue
            if not self.interactive:
                self.say(f"{self.current}> {line}", "bold")  # a script's transcript shows what was asked
            try:
                if line.startswith("/"):
                    if not await self.command(line):
                        break
                else:
                    await self.chat(line)
            except TurnstileError as e:
                self.error(str(e))
        return 0

    async def ensure(self, sid: str) -> None:
        try:
            await self.rt.get_session(sid)
        except SessionNotFound:
            await self.rt.create_session(sid, system=self.system)

    async def command(self, line: str) -> bool:
        """Run one slash command; False ends the loop."""
        name, _, rest = line[1:].partition(" ")
        rest = rest.strip()
        rt, sid = self.rt, self.current
        if name in ("quit", "exit", "q"):
            return False
        if name in ("help", "h", "?"):
            self.say(HELP)
        elif name == "new" and rest:
            new, _, system = rest.partition(" ")
            await rt.create_session(new, system=system.strip() or self.system)
            self.current = new
            self.say(f"created {new!r}; now in {new!r}", "dim")
        elif name == "switch" and rest:
            session = await rt.get_session(rest)
            self.current = rest
            self.say(f"now in {rest!r} ({len(session.messages)} messages)", "dim")
        elif name == "list":
            for other in sorted(await rt.list_sessions()):
                s = await rt.get_session(other)
                system = f"  system: {s.system}" if s.system else ""
                self.say(f"{'*' if other == sid else ' '} {other}  {len(s.messages)} messages{system}")
        elif name == "history":
            session = await rt.get_session(sid)
            if session.system:
                self.say(f"system: {session.system}", "dim")
            for m in session.messages:
                self.say(f"{m.role}: {m.content}", *(("bold",) if m.role == "user" else ()))
            if not session.messages:
                self.say("(no messages)", "dim")
        elif name == "fork" and rest:
            await rt.fork(sid, rest)
            self.current = rest
            self.say(f"forked {sid!r} to {rest!r}; now in {rest!r}", "dim")
        elif name == "undo":
            session = await rt.undo(sid)
            self.say(f"undone: {sid!r} has {len(session.messages)} messages", "dim")
        elif name == "regen":
            async with self.progress.show("regenerating…", delay=0.2):
                reply = await rt.regenerate(sid, **self.sampling)
            self.show_reply(reply)
        elif name == "edit" and rest:
            session = await rt.get_session(sid)
            users = [i for i, m in enumerate(session.messages) if m.role == "user"]
            if not users:
                self.error(f"{sid!r} has no user message to edit")
                return True
            async with self.progress.show("answering…", delay=0.2):
                reply = await rt.edit(sid, users[-1], rest, **self.sampling)
            self.show_reply(reply)
        elif name == "stats":
            self.stats()
        elif name in ("new", "switch", "fork", "edit"):
            self.error(f"/{name} needs an argument; /help lists the commands")
        else:
            self.error(f"unknown command /{name}; /help lists the commands")
        return True

    async def chat(self, text: str) -> None:
        reply: Reply | None = None
        started = False
        async with self.progress.show("thinking…", delay=0.2) as stop:
            async for item in self.rt.stream(self.current, text, **self.sampling):
                if isinstance(item, Reply):
                    reply = item
                elif isinstance(item, str) and item:  # (no tools here: no tool-call pieces)
                    if not started:
                        stop()
                        item = item.lstrip()
                        started = bool(item)
                    self.out.write(item)
                    self.out.flush()
        assert reply is not None
        self.out.write("\n")
        self.footer(reply)

    def show_reply(self, reply: Reply) -> None:
        self.say(reply.text.strip())
        self.footer(reply)

    def footer(self, reply: Reply) -> None:
        u = reply.usage
        end = " · cut at --max-tokens" if reply.finish_reason == "length" else ""
        self.say(
            f"[{u.prompt_tokens} prompt · {u.cached_tokens} cached · {u.prefilled_tokens} prefilled · "
            f"{u.generated_tokens} generated · {seconds(reply.timings.total)} · from {reply.cache_source}{end}]",
            "dim",
        )

    def stats(self) -> None:
        st = self.rt.stats()
        sl, sc = st.slot, st.scheduler
        share = 100 * sl.cached_tokens / sl.prompt_tokens if sl.prompt_tokens else 0.0
        self.say(
            f"sessions: {st.sessions}; requests: {sc.completed} done, {sc.cancelled} cancelled, {sc.failed} failed"
        )
        self.say(
            f"tokens: {sl.prompt_tokens} prompt, {sl.cached_tokens} cached ({share:.0f}%), "
            f"{sl.prefilled_tokens} prefilled, {sl.generated_tokens} generated"
        )
        self.say(
            f"cache: {sl.swaps} swaps, {sl.ram_loads} RAM loads, {sl.disk_loads} disk loads; "
            f"RAM holds {sl.ram_entries} states ({size(sl.ram_bytes)})"
        )
        if st.disk is not None:
            d = st.disk
            self.say(f"disk: {d.entries} states ({size(d.bytes)}), {d.hits} hits, {d.misses} misses")


async def run(args: argparse.Namespace, open_options: dict[str, Any]) -> int:
    code = 0
    async with anyio.create_task_group() as tg:
        stop = Progress().start(tg, "loading model…", delay=0.2)
        try:
            async with Runtime.open(**open_options) as rt:
                stop()
                code = await Chat(rt, args).run()
        finally:
            stop()
    return code
