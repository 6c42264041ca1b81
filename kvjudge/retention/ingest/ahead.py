"""Parsing ahead: a child process reads, decodes, checks and parses an import's files, in order, while the importer
writes the runs of the files before them — the parse on one core, the writes on another.

The child is forked on Linux where a core is idle for it (:func:`spare_core`); elsewhere :func:`parse_ahead` gives
None and the importer parses in its own process. The child runs the importer's own per-file function on each source
in turn and streams what it yields over a pipe, one document at a time, so it holds no more than the pipe's buffer
and the document in hand: the importer
consumes the same items in the same order as if it had parsed them itself, and an :class:`IngestError` of a file
reaches it at the same point of that file. The child never touches the store (it writes nothing, and ends with
``os._exit``, running no finalizer of the parent's objects), and each file is still read once, by the child.

If the import stops — a refused file, an error, a kill — the child ends with it: closing the pipe breaks its
next write, and :meth:`ParseAhead.close` kills and reaps it.
"""

from __future__ import annotations

import fcntl
import os
import pickle
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from kvjudge.errors import IngestError, KvjudgeError

SourceT = TypeVar("SourceT")

#: The pipe's buffer (Linux's default is 64 KiB): room for the child to run a few small files ahead of the writes,
#: so the two rarely wait for each other; a large document still waits for the one before it to be read.
PIPE_BYTES = 1 << 20

# Messages, each one pickle: an item of the current file; the file's IngestError (it ends the file); the end of the
# file; anything else the child raised (it ends the child).
_ITEM, _REFUSED, _END, _CRASHED = range(4)


class ParseAhead:
    """The child parsing ``sources`` and the reading end of its pipe. Read the files in order with :meth:`file`;
    :meth:`close` (or the ``with`` block) ends the child."""

    def __init__(self, pid: int, reader: Any) -> None:
        self._pid = pid
        self._reader = reader
        self._next = 0  # the index of the next file to read
        self._unread = False  # the previous file was left before its end (its remaining messages are skipped)

    def file(self, index: int) -> Iterator[Any]:
        """The items of file ``index`` (the next one), as the child's per-file function yielded them; raises the
        IngestError that function raised, at the same point."""
        if index != self._next:
            raise ValueError(f"files are read in order: expected file {self._next}, asked for {index}")
        self._skip_unread()
        self._next += 1
        self._unread = True
        while True:
            kind, value = self._receive()
            if kind == _ITEM:
                yield value
            elif kind == _REFUSED:
                self._unread = False
                raise IngestError(value)
            else:  # _END
                self._unread = False
                return

    def _skip_unread(self) -> None:
        while self._unread:
            kind, _ = self._receive()
            self._unread = kind == _ITEM

    def _receive(self) -> tuple[int, Any]:
        try:
            kind, value = pickle.load(self._reader)
        except (EOFError, pickle.UnpicklingError):  # the pipe closed, at a message's end or within one
            raise KvjudgeError(f"the process that parses files ahead of the writes ended unexpectedly "
                               f"({self._ended()}); nothing of the open batch was written — run the same command "
                               f"again") from None
        if kind == _CRASHED:
            raise value
        return kind, value

    def _ended(self) -> str:
        try:
            pid, status = os.waitpid(self._pid, 0)
        except ChildProcessError:
            return "already reaped"
        self._pid = 0
        if os.WIFSIGNALED(status):
            return f"killed by signal {os.WTERMSIG(status)}"
        return f"exit status {os.waitstatus_to_exitcode(status)}"

    def close(self) -> None:
        """Kill the child (when it has not finished) and reap it; close the pipe."""
        self._reader.close()
        if self._pid:
            try:
                os.kill(self._pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                os.waitpid(self._pid, 0)
            except ChildProcessError:
                pass
            self._pid = 0

    def __enter__(self) -> ParseAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: How long :func:`spare_core` watches the CPUs before an import: about 10 of the kernel's 100 Hz ticks a core (a
#: tenth of a core's resolution), short beside any import that forks the child.
IDLE_SAMPLE_S = 0.1

#: The idle CPUs an import needs to fork the child: one for the importer, and half of one at least for the child.
IDLE_CPUS_FOR_CHILD = 1.5


def spare_core(sample_s: float = IDLE_SAMPLE_S) -> bool:
    """True when a core is idle for the child: of the CPUs this process may run on (two or more), at least
    :data:`IDLE_CPUS_FOR_CHILD` were idle over the last ``sample_s`` seconds (``/proc/stat``, read twice), while the
    importer itself waited. A short sample, not the load average: the load average lags by a minute, and still
    counts the work this command's caller did just before — a benchmark's own set-up left it above 1.5 on an
    otherwise idle 2-core machine, and it turned the child away exactly where it pays.

    On a busy machine the child only shares the time the importer would have had (Linux's scheduler shares it by
    session, not by process), and handing each parsed run over costs about a tenth more CPU than parsing it in
    place: measured on 1,000 40 KB files at load 10-12 on 2 cores, the import took longer with the child in 10 of 10
    interleaved runs, and with one core kept busy by a loop it did not pay either."""
    try:
        cpus = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return False
    if len(cpus) < 2:
        return False
    before = _cpu_ticks(cpus)
    time.sleep(sample_s)
    after = _cpu_ticks(cpus)
    if before is None or after is None:
        return False  # no /proc/stat to read: parse in this process, as where nothing is known
    idle, total = after[0] - before[0], after[1] - before[1]
    if total <= 0:
        return False  # no tick counted (a clock that did not move): nothing measured
    return len(cpus) * idle / total >= IDLE_CPUS_FOR_CHILD


#: Where Linux keeps each CPU's time, in ticks, by what it was spent on.
PROC_STAT = "/proc/stat"


def _cpu_ticks(cpus: set[int]) -> tuple[int, int] | None:
    """(idle ticks, all ticks) summed over ``cpus``, from their ``cpuN`` lines of :data:`PROC_STAT` (idle and
    iowait are idle; user, nice, system, irq, softirq and steal are not); None where the file cannot be read."""
    idle = total = 0
    try:
        with open(PROC_STAT, encoding="ascii") as stat:
            for line in stat:
                name, _, fields = line.partition(" ")
                if not name.startswith("cpu") or not name[3:].isdigit() or int(name[3:]) not in cpus:
                    continue
                ticks = [int(field) for field in fields.split()[:8]]
                idle += ticks[3] + ticks[4]
                total += sum(ticks)
    except (OSError, ValueError, IndexError):
        return None
    return idle, total


def parse_ahead(sources: Sequence[SourceT], parse_file: Callable[[SourceT], Iterable[Any]]) -> ParseAhead | None:
    """A child process running ``parse_file`` on each of ``sources`` in order (its items must pickle), or None where
    this platform forks no such child or no core is spare for it (:func:`spare_core`): then parse in this process."""
    if not sys.platform.startswith("linux") or not spare_core():
        return None
    read_end, write_end = os.pipe()
    try:
        fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except OSError:
        pass  # a smaller limit (/proc/sys/fs/pipe-max-size): the default buffer works, with more waits
    pid = os.fork()
    if pid == 0:  # the child: it never returns
        os.close(read_end)
        _child(sources, parse_file, write_end)
    os.close(write_end)
    return ParseAhead(pid, os.fdopen(read_end, "rb", buffering=PIPE_BYTES))


def _child(sources: Sequence[SourceT], parse_file: Callable[[SourceT], Iterable[Any]], write_end: int) -> None:
    code = 1
    try:
        # Fresh stdio on /dev/null: the parent's are left alone (a thread of the parent may have held their locks at
        # the fork, and a reader waiting for the parent's output must not wait for this process too).
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        sys.stdin = sys.stdout = sys.stderr = open(null, "r+", closefd=False)  # noqa: SIM115 - ends with the process
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C ends it at once, beside the parent
        out = os.fdopen(write_end, "wb", buffering=PIPE_BYTES)
        try:
            for source in sources:
                try:
                    for item in parse_file(source):
                        _send(out, _ITEM, item)
                except IngestError as exc:
                    _send(out, _REFUSED, str(exc))
                else:
                    _send(out, _END, None)
            code = 0
        except BrokenPipeError:
            code = 0  # the parent stopped reading: it has finished or failed, and says so itself
        except BaseException as exc:  # noqa: BLE001 - handed to the parent, which raises it
            try:
                _send(out, _CRASHED, exc)
            except BaseException:  # noqa: BLE001 - it does not pickle: its text does
                try:
                    _send(out, _CRASHED, RuntimeError(f"parsing ahead failed: {type(exc).__name__}: {exc}"))
                except BaseException:  # noqa: BLE001 - the parent sees the pipe close
                    pass
    finally:
        os._exit(code)


def _send(out: Any, kind: int, value: Any) -> None:
    # Pickled whole before a byte is written: what fails to pickle leaves no half message in the pipe.
    out.write(pickle.dumps((kind, value), protocol=pickle.HIGHEST_PROTOCOL))
    out.flush()  # each message as soon as it is whole: the parent may be waiting for it
