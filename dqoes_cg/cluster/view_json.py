"""`dqoesctl cluster status`'s answer: the cluster view as JSON (view.py's `to_json`), made
once per view and shared by every client that asks while that view is the last one; and
within it, each node's tasks encoded again only when the manager made them again (a new
list in the view's `by_node`). A status then costs the encoding of the tasks that changed
since the one before, and a join of the others' text, where encoding 100,000 tasks took
seconds."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from ..jsonline import Encoded, dumps
from .view import ClusterView, TaskView, task_json


class ViewJSON:
    """The answers to `cluster status`, view after view (from any thread)."""

    def __init__(self) -> None:
        # One made at a time: a client asking while it is made waits for it and shares it.
        self._lock = threading.Lock()
        self._view: ClusterView | None = None
        self._encoded: Encoded | None = None
        # node ID: its tasks' list as the view had it (kept: the IDs of its tasks stay
        # theirs) and each task's JSON by id()
        self._groups: dict[str, tuple[Sequence[TaskView], dict[int, str]]] = {}

    def of(self, view: ClusterView) -> Encoded:
        with self._lock:
            if view is not self._view or self._encoded is None:
                self._encoded, self._view = Encoded(self._text(view)), view
            return self._encoded

    def _text(self, view: ClusterView) -> str:
        groups = {}
        texts: dict[int, str] = {}
        for node_id, tasks in view.task_groups().items():
            known = self._groups.get(node_id)
            if known is None or known[0] is not tasks:
                known = tasks, {id(t): dumps(task_json(t)) for t in tasks}
            groups[node_id] = known
            texts.update(known[1])
        self._groups = groups
        tasks_text = "[" + ",".join(texts[id(t)] for t in view.tasks) + "]"
        return "{" + ",".join(
            dumps(key) + ":" + (tasks_text if key == "tasks" else dumps(value))
            for key, value in view.to_json(with_tasks=False).items()) + "}"
