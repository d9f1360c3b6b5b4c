"""Pipelines as users declare them on Swarm: service labels, read by the manager every tick.

    dqoes.pipeline=NAME               on every stage (a Swarm service) of pipeline NAME
    dqoes.next=STAGE[,STAGE...]       the stage(s) a stage forwards its requests to (service
                                      names; a DAG: fan-out and fan-in allowed; none: a sink)
    dqoes.pipeline.target=35s         the end-to-end target, on exactly one stage
    dqoes.pipeline.metric=mean        its statistic (optional, on the same stage; default p95)

Labels are hostile input. A pipeline with a cycle, a `dqoes.next` naming no stage of its
own (an unknown service, or a stage of another pipeline: a stage is in one pipeline), no
target or two, a stage with a target of its own (`dqoes.target`) or malformed labels, stages
that are not connected, or more stages, fan-out or paths than the bounds below, is refused
with a one-line reason and left unmanaged; every other pipeline stays managed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from ..duration import parse_duration
from ..engines.client import MAX_LABEL_CHARS
from ..membership.labels import (
    MAX_VALUE,
    NEXT,
    PIPELINE,
    PIPELINE_METRIC,
    PIPELINE_TARGET,
    TARGET,
)
from ..membership.objective import DEFAULT_METRIC, METRICS, check_target
from .swarmapi import SwarmService

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")  # a pipeline's, as Swarm's names
MAX_PIPELINES = 64
MAX_STAGES = 32  # in one pipeline
MAX_NEXT = 8  # downstream stages of one stage
MAX_PATHS = 256  # source-to-sink paths of one pipeline (each is a constraint of the split)


@dataclass(frozen=True)
class Stage:
    service_id: str
    name: str  # the service's
    next: tuple[int, ...]  # indices of its downstream stages in Pipeline.stages


@dataclass(frozen=True)
class Pipeline:
    name: str
    target_s: float  # end to end
    metric: str
    stages: tuple[Stage, ...]  # in topological order (a stage before those it feeds)
    paths: tuple[tuple[int, ...], ...]  # every source-to-sink path, as stage indices


@dataclass(frozen=True)
class Refused:
    """A declaration that is not a pipeline, and why (one line)."""

    name: str
    reason: str
    service_ids: tuple[str, ...]


def declared(services: Iterable[SwarmService]) -> tuple[list[Pipeline], list[Refused]]:
    """The pipelines the services' labels declare, and those refused, both by name."""
    groups: dict[str, list[SwarmService]] = {}
    refused: list[Refused] = []
    for s in sorted(services, key=lambda s: s.name):
        if not s.pipeline:
            continue
        name = s.pipeline.get(PIPELINE)
        if name is None:
            refused.append(Refused(f"({s.name})", f"service {s.name} has "
                                   f"{', '.join(sorted(s.pipeline))} without {PIPELINE}",
                                   (s.id,)))
        elif not NAME.match(name):
            refused.append(Refused(f"{name[:MAX_VALUE]!r}", f"service {s.name}: a pipeline "
                                   "name is 1 to 63 letters, digits, '_', '.' or '-'",
                                   (s.id,)))
        else:
            groups.setdefault(name, []).append(s)
    owner = {s.name: name for name, stages in groups.items() for s in stages}
    pipelines = []
    for i, (name, stages) in enumerate(sorted(groups.items())):
        ids = tuple(s.id for s in stages)
        try:
            if i >= MAX_PIPELINES:
                raise ValueError(f"more than {MAX_PIPELINES} pipelines")
            pipelines.append(_pipeline(name, stages, owner))
        except ValueError as e:
            refused.append(Refused(name, str(e), ids))
    return pipelines, sorted(refused, key=lambda r: r.name)


def _pipeline(name: str, services: list[SwarmService], owner: dict[str, str]) -> Pipeline:
    """Pipeline `name` of these stages; ValueError with a one-line reason."""
    if len(services) > MAX_STAGES:
        raise ValueError(f"{len(services)} stages (at most {MAX_STAGES})")
    for s in services:
        if s.error:
            raise ValueError(f"stage {s.name}: labels refused: {s.error}")
        for key, value in sorted(s.pipeline.items()):
            if len(value) >= MAX_LABEL_CHARS:  # perhaps cut where it was read (swarmapi.py)
                raise ValueError(f"stage {s.name}: {key} is longer than "
                                 f"{MAX_LABEL_CHARS - 1} characters")
        if s.objective is not None:
            raise ValueError(f"stage {s.name} has a {TARGET} of its own (the pipeline's "
                             "target is split among its stages)")
    target_s, metric = _target(services)
    index = {s.name: i for i, s in enumerate(services)}
    edges: list[list[int]] = []
    for s in services:
        names = [n.strip() for n in s.pipeline.get(NEXT, "").split(",") if n.strip()]
        if len(names) > MAX_NEXT:
            raise ValueError(f"stage {s.name} has {len(names)} next stages (at most "
                             f"{MAX_NEXT})")
        after = []
        for n in names:
            if n not in index:
                other = owner.get(n)
                raise ValueError(
                    f"stage {s.name}: next stage {n[:MAX_VALUE]!r} is "
                    + (f"a stage of pipeline {other} (a stage is in one pipeline)" if other
                       else "no stage of this pipeline"))
            after.append(index[n])
        edges.append(sorted(set(after)))
    order = _topological(edges, [s.name for s in services])
    _connected(edges, [s.name for s in services])
    renumber = {old: new for new, old in enumerate(order)}
    stages = tuple(Stage(services[old].id, services[old].name,
                         tuple(sorted(renumber[j] for j in edges[old]))) for old in order)
    return Pipeline(name, target_s, metric, stages, _paths(stages))


def _target(services: list[SwarmService]) -> tuple[float, str]:
    with_target = [s for s in services if PIPELINE_TARGET in s.pipeline]
    for s in services:
        if PIPELINE_METRIC in s.pipeline and PIPELINE_TARGET not in s.pipeline:
            raise ValueError(f"stage {s.name} has {PIPELINE_METRIC} without "
                             f"{PIPELINE_TARGET}")
    if not with_target:
        raise ValueError(f"no stage has {PIPELINE_TARGET}")
    if len(with_target) > 1:
        raise ValueError(f"two stages have {PIPELINE_TARGET}: {with_target[0].name}, "
                         f"{with_target[1].name} (one end-to-end target per pipeline)")
    labels = with_target[0].pipeline
    try:
        target_s = parse_duration(labels[PIPELINE_TARGET])
        metric = labels.get(PIPELINE_METRIC, DEFAULT_METRIC)
        if metric not in METRICS:
            raise ValueError(f"unknown metric {metric[:MAX_VALUE]!r} (one of "
                             f"{', '.join(METRICS)})")
        check_target(target_s, metric)
    except ValueError as e:
        raise ValueError(f"{PIPELINE_TARGET}: {e}") from None
    return target_s, metric


def _topological(edges: list[list[int]], names: list[str]) -> list[int]:
    """The stages in an order where each comes before those it feeds (Kahn's);
    ValueError naming the stages on a cycle."""
    incoming = [0] * len(edges)
    for after in edges:
        for j in after:
            incoming[j] += 1
    ready = [i for i, n in enumerate(incoming) if n == 0]
    order = []
    while ready:
        i = ready.pop(0)
        order.append(i)
        for j in edges[i]:
            incoming[j] -= 1
            if incoming[j] == 0:
                ready.append(j)
    if len(order) < len(edges):
        left = sorted(names[i] for i in range(len(edges)) if incoming[i] > 0)
        raise ValueError(f"a cycle through {', '.join(left)} ({NEXT} must make a DAG)")
    return order


def _connected(edges: list[list[int]], names: list[str]) -> None:
    """ValueError unless the stages form one graph (ignoring the edges' direction)."""
    neighbours: list[set[int]] = [set() for _ in edges]
    for i, after in enumerate(edges):
        for j in after:
            neighbours[i].add(j)
            neighbours[j].add(i)
    seen, todo = {0}, [0]
    while todo:
        for j in neighbours[todo.pop()] - seen:
            seen.add(j)
            todo.append(j)
    if len(seen) < len(edges):
        apart = sorted(names[i] for i in range(len(edges)) if i not in seen)
        raise ValueError(f"stages {', '.join(apart)} are not connected to stage {names[0]} "
                         f"(no {NEXT} between them)")


def _paths(stages: tuple[Stage, ...]) -> tuple[tuple[int, ...], ...]:
    """Every source-to-sink path; ValueError past MAX_PATHS."""
    fed = {j for s in stages for j in s.next}
    paths: list[tuple[int, ...]] = []
    todo = [(i,) for i in range(len(stages)) if i not in fed]
    while todo:
        path = todo.pop()
        after = stages[path[-1]].next
        if not after:
            paths.append(path)
            if len(paths) > MAX_PATHS:
                raise ValueError(f"more than {MAX_PATHS} source-to-sink paths")
        todo.extend((*path, j) for j in after)
    return tuple(sorted(paths))
