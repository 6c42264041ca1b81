"""The trial-identity rule: when two documents name the same run, are they one run or two trials of one task?

A run id names one agent's run on one task (and its trial, where the harness names one). Two documents can arrive
at the same id: the same run reached twice (one file under two paths, an import run again), the same run with
other content (a grade from ``--results`` that came later, another ``--tenant``), or two *different* runs the
harness did not tell apart — SWE-agent's demonstrations of one instance under two configurations, two inspect logs
of one eval written before inspect named each eval, one instance twice in an ``output.jsonl``. The rule:

- the same content is the same run (already present, nothing written);
- the same **work** — the task, the prompt, the branches and every transition, what the agent did — with other
  content is the same run changed: refused, as a run id names one content — unless, in one import, the harness's
  own ids for the two differ (:attr:`ParsedRun.marks`: two inspect evals, the second rescoring the first's
  samples), which makes them two trials;
- other work is another trial — unless the document named the run itself (:attr:`ParsedRun.named`: a native run's
  id, a session, a Harbor trial, an inspect eval), where other work is that run changed, and refused. The first
  run keeps its id; the later one gets a trial label from what tells it apart, the first that fits of: the
  harness's own ids for the run (:attr:`ParsedRun.marks`: an inspect eval's run id), the file's path within what
  was pointed at (:attr:`Source.within`: the configuration folder of a SWE-agent demonstration, the stem of an
  inspect log), else a digest of its work. A label fits when its id is free, or holds this same work. The label
  ends the run id (``<id>/<label>``, or ``<id>-<label>`` where the id already ends with the harness's own trial)
  and is the run's trial, so ``select`` sees every trial of the task and a result that names the run without its
  trial still finds it.

Importing the same files again imports nothing new: each document meets the same ids in the same order and
lands where it landed before; a run that would take a new label while another trial of its task already holds the
same work (the same files pointed at from another folder) is that trial (:func:`twin`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

from kvjudge.errors import IngestError
from kvjudge.retention import events as ev
from kvjudge.retention.events import canonical_json, content_hash
from kvjudge.retention.ingest.harbor import finished_since
from kvjudge.retention.ingest.model import ParsedRun

if TYPE_CHECKING:
    from kvjudge.retention.store import Store

#: Where a run's id stands (:func:`place`): free; holding this run (the same content); holding this run imported
#: from a Harbor trial before it finished, which has since; holding another run (other work).
NEW, PRESENT, FINISHED, TAKEN = "new", "present", "finished since", "taken"

#: The events that are the run's work (what the agent did), as opposed to how it was imported or graded.
_WORK_KINDS = (ev.BranchOpened, ev.TransitionRecorded)
#: Run-file endings a path label leaves out (the file's kind, not what tells two runs apart).
_SUFFIXES = (".gz", ".traj.json", ".traj", ".demo.yaml", ".jsonl", ".json", ".eval", ".yaml")
_UNSAFE = re.compile(r"[\s/\\]+")
_WORK_LABEL = 12  # hex digits of the work digest in a label


def work_digest(events: Iterable[ev.Event]) -> str:
    """The digest of a run's work: its task and prompt, branches and transitions — not its id, tenant, agent,
    metadata, grades or lifecycle. Two documents with the same work are the same run.

    Each event's canonical JSON is the one the content hash made already (cached on the event), its ``run`` member
    cut from the text: keys are sorted, and ``run`` is never the last of these kinds, so it is ``"run":<id>,``."""
    digest = hashlib.sha256()
    for event in events:
        if isinstance(event, ev.RunStarted):
            digest.update(canonical_json([event.task_id, event.task_prompt_ref]).encode())
        elif isinstance(event, _WORK_KINDS):
            text = event.to_json().replace(f'"run":{canonical_json(event.run)},', "", 1)
            digest.update(f"{event.kind} {text}\n".encode())
    return "sha256:" + digest.hexdigest()


def labels(run: ParsedRun, within: str | None, work: str) -> Iterator[str]:
    """The trial labels a run could take, best first: the harness's ids for it, its path label, its work digest."""
    offered = [*run.marks, path_label(within, run.task_id), work.removeprefix("sha256:")[:_WORK_LABEL]]
    for label in dict.fromkeys(clean(label) for label in offered if label):
        if label:
            yield label


def path_label(within: str | None, task_id: str | None) -> str | None:
    """The label a file's path within what was pointed at gives: its folders (``:``-joined) and its name without
    the run-file ending — the name left out where it only repeats the task (``<instance>.traj``)."""
    if not within:
        return None
    *folders, name = within.replace("\\", "/").strip("/").split("/")
    for suffix in _SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
    parts = folders if folders and task_id is not None and name == task_id.rsplit("/", 1)[-1] else [*folders, name]
    return ":".join(part for part in parts if part) or None


def clean(label: str) -> str:
    """A label safe at the end of a run id: no ``/``, no whitespace."""
    return _UNSAFE.sub("_", label.strip()).strip("_")


def as_trial(run: ParsedRun, label: str, base: tuple[str, str | None]) -> str:
    """Rename ``run`` (settled) to its trial ``label`` — from ``base``, the id and trial it was parsed with — (see
    the module docstring) and settle its content hash again; returns the new content hash."""
    base_id, base_trial = base
    if base_trial is not None and base_id.endswith("/" + base_trial):
        trial = f"{base_trial}-{label}"
        run_id = base_id[: -len(base_trial)] + trial
    else:
        trial = label if base_trial is None else f"{base_trial}-{label}"
        run_id = f"{base_id}/{label}"
    events: list[ev.Event] = []
    for event in run.events:
        if isinstance(event, ev.RunStarted):
            events.append(dataclasses.replace(event, run=run_id, trial=trial, content_hash=None))
        else:
            events.append(dataclasses.replace(event, run=run_id))
    digest = content_hash(events)
    events[0] = dataclasses.replace(events[0], content_hash=digest)
    run.events, run.run_id, run.trial, run.content_hash = events, run_id, trial, digest
    return digest


#: What an import remembers of each run it took: where, its content hash, its work digest, its marks.
Seen = tuple[str, str, str, tuple[str, ...]]


def place(store: Store, where: str, run: ParsedRun, digest: str, work: str, earlier: Seen | None) -> str:
    """Where ``run``'s id stands (:data:`NEW`, :data:`PRESENT`, :data:`FINISHED`, :data:`TAKEN`), given what this
    import remembers of the run that took it first (``earlier``), else the store. IngestError where it holds the same
    work with other content — unless the harness's own ids tell the two apart (two inspect evals of one sample, the
    second rescoring the first) — or the document named the id itself."""
    if earlier is not None:
        if earlier[1] == digest:
            return PRESENT
        if run.named or (earlier[2] == work and earlier[3] == run.marks):
            raise IngestError(f"{where}: run {run.run_id!r} appears twice with different content "
                              f"({earlier[0]}: {earlier[1]}; here: {digest})")
        return TAKEN
    stored = stored_content_hash(store, run.run_id, len(run.events))
    if stored is None:
        return NEW
    if stored == digest:
        return PRESENT
    if finished_since(store.runs.run(run.run_id).metadata, run):
        return FINISHED
    if run.named or work_digest(event for _, event in store.events.iter_events(run.run_id)) == work:
        raise IngestError(
            f"{where}: run {run.run_id!r} is already in the store with other content (stored {stored}, this input "
            f"{digest}) — a run id names one content, and --results grades, --agent and --tenant are part of it "
            f"(grades that came later: kvjudge grade RUN --results FILE)")
    return TAKEN


def twin(store: Store, seen: Mapping[str, Seen], run: ParsedRun, base_id: str, work: str) -> str | None:
    """The id of a run of this import or the store, another trial of ``run``'s task and agent, holding the same work
    (None: none does). A run found again under another label — its folder named from another place — is that run."""
    for run_id, (_, _, other, marks) in seen.items():
        if other == work and marks == run.marks and run_id.startswith(base_id):
            return run_id
    for run_id in store.runs.run_ids(task=run.task_id, agent=run.agent) if run.task_id and run.agent else ():
        if run_id != base_id and run_id.startswith(base_id) and \
                work_digest(event for _, event in store.events.iter_events(run_id)) == work:
            return run_id
    return None


def stored_content_hash(store: Store, run_id: str, n_events: int) -> str | None:
    """The content hash of ``run_id`` as imported, or None when the store has no such run.

    Runs imported since content hashes exist carry theirs in RunStarted. For an older run it is computed over
    its first ``n_events`` logged events — the length of the run it is compared with.
    """
    if not store.runs.has_run(run_id):
        return None
    first = next(iter(store.events.iter_events(run_id)))[1]
    if isinstance(first, ev.RunStarted) and first.content_hash:
        return first.content_hash
    return ev.content_hash(event for _, event in itertools.islice(store.events.iter_events(run_id), n_events))
