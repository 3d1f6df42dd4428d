"""The job state machine: the only code that writes the status of jobs, requests and work units.

`table` declares every move and the states it may start from; `validation`, `units` and `ending` are the
moves themselves, each one short transaction (or a step inside the caller's). runtime, cluster, workers and
api call these and write no status themselves (tests/test_state_writes.py keeps it so).

Lock order, everywhere: a work unit's row (start, or the commit fence), then job rows in id order, then request
rows. Every move here follows it, so two transactions cannot deadlock on each other.
"""
