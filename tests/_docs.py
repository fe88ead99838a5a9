"""The documentation runner: every code block of a Markdown page, run in order as a reader would.

A page's fenced blocks are code when their language is ``python``, ``sh``, ``bash`` or ``sql``; any other
language (``text``, ``json``, ``toml``) marks output, a synopsis or a picture, which is not run. A block
without a language is refused: every block says which it is. Code blocks
run in page order, in a working folder of the page's own, with ``$PGSTREAMS_DSN`` naming the page's own
database:

- ``python``: each block is a script of its own, run by this interpreter (``python block.py``); it must
  exit 0. In notebook mode (a page written as one session, such as docs/spark.md) the blocks run one after
  the other in one interpreter and share their names, as in a notebook or the ``pyspark`` shell.
- ``sh``/``bash``: each command (a line, with ``\\`` continuations joined) runs in ``bash -o pipefail``
  with this interpreter's ``bin`` folder first on ``PATH``; it must exit 0. A command that serves until
  stopped (:data:`SERVING`, or a ``--follow``) must still run after :data:`SERVE_SECONDS`; it is then
  stopped with SIGTERM and must exit 0 or 143 without a traceback.
- ``sql``: the block runs in one autocommit session on the page's database.

An HTML comment just before a block (invisible on the rendered page) changes what is done with it:

- ``<!-- doc-test: skip REASON -->``: not run (the page says why where the reader sees it; the tests keep
  the list of skipped blocks, so a new one is a change of the test too);
- ``<!-- doc-test: file PATH -->``: the block is a file of the example (a handler module, say): written to
  ``PATH`` in the working folder, not run;
- ``<!-- doc-test: stop-after SECONDS -->``: a script that runs until stopped (``worker.run()``): it must
  still run after ``SECONDS``, is then sent SIGTERM and must exit 0;
- ``<!-- doc-test: setup`` ... ``-->``: Python lines run before the block, in the same script (what an
  earlier part of the page set up, for a fragment).
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

#: The languages of blocks that are code and run.
RUNNABLE = ("python", "sh", "bash", "sql")
#: Shell commands that serve until stopped: started, left running :data:`SERVE_SECONDS`, then stopped.
SERVING = ("pgstreams console", "pgstreams metrics serve", "pgstreams worker", "pgstreams kafka serve",
           "pgstreams cdc run")
#: How long a serving command must keep running before it is stopped.
SERVE_SECONDS = 3.0

#: The interpreter of notebook mode: runs the blocks it reads from stdin (JSON lines) in one namespace and
#: answers on the file descriptor its first argument names.
_KERNEL = r"""
import json, os, sys, traceback
answers = os.fdopen(int(sys.argv[1]), "w")
space = {"__name__": "__main__"}
for line in sys.stdin:
    block = json.loads(line)
    try:
        exec(compile(block["code"], block["name"], "exec"), space)
        answers.write(json.dumps({"ok": True}) + "\n")
    except BaseException:
        answers.write(json.dumps({"ok": False, "error": traceback.format_exc()}) + "\n")
    sys.stdout.flush()
    sys.stderr.flush()
    answers.flush()
"""

_FENCE = re.compile(r"^(`{3,})\s*([\w+-]*)\s*$")
_DIRECTIVE = re.compile(r"^<!--\s*doc-test:\s*(\w[\w-]*)\s*(.*?)\s*(-->)?\s*$")


@dataclass(frozen=True)
class Block:
    """A fenced block of a page: its language, text, the line of its opening fence and its directives."""

    page: Path
    line: int
    lang: str
    code: str
    directives: dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        """``page:line`` of the block's opening fence."""
        return f"{self.page.name}:{self.line}"

    @property
    def first_line(self) -> str:
        """The block's first non-empty line (how the tests name a block)."""
        return next((ln.strip() for ln in self.code.splitlines() if ln.strip()), "")

    @property
    def runs(self) -> bool:
        """Whether the runner runs it (code, neither skipped nor a file)."""
        return self.lang in RUNNABLE and "skip" not in self.directives and "file" not in self.directives


class DocBlockFailed(AssertionError):
    """A block of a page did not do what the page says: names the block, what ran and its output."""

    def __init__(self, block: Block, what: str, output: str) -> None:
        super().__init__(f"{block.where} ({block.lang}): {what}\n{output[-4000:]}")
        self.block = block


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page`` in order, with the ``doc-test`` directives of the comments just above
    it (blank lines between allowed)."""
    lines = page.read_text().splitlines()
    out: list[Block] = []
    pending: dict[str, str] = {}
    i = 0
    while i < len(lines):
        line = lines[i]
        d = _DIRECTIVE.match(line.strip())
        if d:
            name, rest = d.group(1), d.group(2)
            if d.group(3) is None:  # a comment over several lines: the text up to -->
                body = [rest] if rest else []
                i += 1
                while i < len(lines) and lines[i].strip() != "-->":
                    body.append(lines[i])
                    i += 1
                rest = "\n".join(body)
            pending[name] = rest
            i += 1
            continue
        m = _FENCE.match(line)
        if m:
            fence, lang = m.group(1), m.group(2).lower()
            start = i + 1
            i += 1
            body = []
            while i < len(lines) and lines[i].strip() != fence:
                body.append(lines[i])
                i += 1
            out.append(Block(page, start, lang, "\n".join(body) + "\n", pending))
            pending = {}
            i += 1
            continue
        if line.strip():
            if pending:
                raise ValueError(f"{page.name}:{i + 1}: a doc-test directive must come just before a block")
        i += 1
    return out


def commands(code: str) -> list[str]:
    """The commands of a shell block: lines joined at trailing backslashes, without blank and comment
    lines."""
    out: list[str] = []
    current = ""
    for raw in code.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        if current.strip() and not current.lstrip().startswith("#"):
            out.append(current.strip())
        current = ""
    return out


@dataclass
class DocRunner:
    """Runs the blocks of pages in ``workdir`` with ``env`` (which must name the database in
    ``PGSTREAMS_DSN``); each command, script or notebook block gets ``timeout`` seconds.

    ``activate`` (default true) puts this interpreter's ``bin`` folder first on ``PATH``, as an activated
    virtual environment does; ``notebook`` (default false) runs the Python blocks in one interpreter."""

    workdir: Path
    env: dict[str, str]
    timeout: float = 180.0
    activate: bool = True
    notebook: bool = False
    ran: list[Block] = field(default_factory=list)
    skipped: list[Block] = field(default_factory=list)
    _kernel: subprocess.Popen[str] | None = None
    _answers: int = -1

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        path = self.env.get("PATH", os.defpath)
        if self.activate:
            path = str(Path(sys.executable).parent) + os.pathsep + path
        self.env = {**self.env, "PATH": path, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}

    def run_page(self, page: Path) -> None:
        """Run every block of ``page`` in order; raise :class:`DocBlockFailed` at the first that fails."""
        try:
            for block in blocks(page):
                self.run_block(block)
        finally:
            self._stop_kernel()

    def run_block(self, block: Block) -> None:
        """Run (or write, or skip) one block."""
        if "skip" in block.directives:
            if not block.directives["skip"]:
                raise DocBlockFailed(block, "a skipped block must say why (doc-test: skip REASON)", "")
            self.skipped.append(block)
            return
        if "file" in block.directives:
            target = self.workdir / block.directives["file"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.code)
            return
        if not block.lang:
            raise DocBlockFailed(block, "a block needs a language: python, sh, bash, sql to run, text (or "
                                 "json, toml, ...) for output and synopses", block.code)
        if block.lang not in RUNNABLE:
            return
        if block.lang == "python":
            self._python(block)
        elif block.lang == "sql":
            self._sql(block)
        else:
            for command in commands(block.code):
                self._shell(block, command)
        self.ran.append(block)

    def _python(self, block: Block) -> None:
        if self.notebook:
            self._in_kernel(block)
            return
        script = self.workdir / f"block_{block.page.stem}_{block.line}.py"
        script.write_text(block.directives.get("setup", "") + "\n" + block.code)
        stop_after = block.directives.get("stop-after")
        if stop_after is None:
            self._check(block, [sys.executable, str(script)], f"python {script.name}")
        else:
            self._serve(block, [sys.executable, str(script)], f"python {script.name}", float(stop_after),
                        (0,))

    def _shell(self, block: Block, command: str) -> None:
        argv = ["bash", "-o", "pipefail", "-c", command]
        if command.startswith(SERVING) or " --follow" in command:
            self._serve(block, argv, command, SERVE_SECONDS, (0, 143))
        else:
            self._check(block, argv, command)

    def _check(self, block: Block, argv: list[str], what: str) -> None:
        try:
            done = subprocess.run(argv, cwd=self.workdir, env=self.env, capture_output=True, text=True,
                                  timeout=self.timeout)
        except subprocess.TimeoutExpired as exc:
            raise DocBlockFailed(block, f"{what}: still running after {self.timeout:.0f} s",
                                 str(exc.stdout or "") + str(exc.stderr or "")) from None
        if done.returncode != 0:
            raise DocBlockFailed(block, f"{what}: exit code {done.returncode}", done.stdout + done.stderr)

    def _serve(self, block: Block, argv: list[str], what: str, seconds: float,
               codes: tuple[int, ...]) -> None:
        # faulthandler on: a process that does not stop is sent SIGABRT, and its threads' stacks are shown
        env = dict(self.env, PYTHONFAULTHANDLER="1")
        proc = subprocess.Popen(argv, cwd=self.workdir, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        early = proc.poll()
        if early is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGABRT)  # Python's faulthandler prints every thread's stack
            try:
                out, err = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                out, err = proc.communicate()
            raise DocBlockFailed(block, f"{what}: did not stop within 60 s of SIGTERM (stacks at SIGABRT "
                                 "below)", out + err) from None
        if early is not None:
            raise DocBlockFailed(block, f"{what}: exited ({early}) before it was stopped", out + err)
        if proc.returncode not in codes or "Traceback" in err:
            raise DocBlockFailed(block, f"{what}: exit code {proc.returncode} after SIGTERM", out + err)

    def _in_kernel(self, block: Block) -> None:
        if self._kernel is None:
            read, write = os.pipe()
            log = (self.workdir / "notebook.log").open("w")
            self._kernel = subprocess.Popen(
                [sys.executable, "-c", _KERNEL, str(write)], cwd=self.workdir, env=self.env,
                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, text=True, pass_fds=(write,))
            os.close(write)
            log.close()
            self._answers = read
        kernel = self._kernel
        assert kernel.stdin is not None
        setup = block.directives.get("setup", "")
        kernel.stdin.write(json.dumps({"code": setup + "\n" + block.code, "name": block.where}) + "\n")
        kernel.stdin.flush()
        ready, _, _ = select.select([self._answers], [], [], self.timeout)
        output = (self.workdir / "notebook.log").read_text()
        if not ready:
            raise DocBlockFailed(block, f"still running after {self.timeout:.0f} s", output)
        answer = b""
        while not answer.endswith(b"\n"):
            chunk = os.read(self._answers, 65536)
            if not chunk:
                raise DocBlockFailed(block, f"the interpreter exited ({kernel.wait()})", output)
            answer += chunk
        reply = json.loads(answer)
        if not reply["ok"]:
            raise DocBlockFailed(block, "raised", output + reply["error"])

    def _stop_kernel(self) -> None:
        if self._kernel is not None:
            assert self._kernel.stdin is not None
            self._kernel.stdin.close()
            try:
                self._kernel.wait(120)
            except subprocess.TimeoutExpired:
                self._kernel.kill()
                self._kernel.wait()
            os.close(self._answers)
            self._kernel = None

    def _sql(self, block: Block) -> None:
        try:
            with psycopg.connect(self.env["PGSTREAMS_DSN"], autocommit=True) as conn:
                conn.execute(block.code.encode())
        except psycopg.Error as exc:
            raise DocBlockFailed(block, f"SQL failed: {exc}", block.code) from None
