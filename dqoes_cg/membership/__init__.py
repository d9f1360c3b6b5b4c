"""Membership: which containers the daemon manages, and with which objective.

    objective.py  the vocabulary: an `Objective` (a latency target and the metric compared
                  with it, or a training job), the `Target` it becomes, and what is valid
    labels.py     the objective a container's `dqoes.` labels describe (hostile input)
    targets.py    the targets: added, changed, unset, bound to cgroups, released and
                  re-adopted, each change persisted first (state.py is the journal)
    rings.py      each target's ring path: its volume's, or its own, made and removed with it
    engine_targets.py  the targets that follow the container engine's labels, applied
                  once per tick (the controller calls it), and what the engine's watcher
                  (engines/watcher.py) reports to it: `Seen`, `Changes`

Nothing here imports the engines (engines/): they import membership's vocabulary. The
controller reads the bound set by its version (`Targets.version`) and rebuilds its
per-slot tables when it moves.
"""
