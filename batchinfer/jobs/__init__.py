"""The job system, by pipeline stage: intake -> dispatch -> units -> finalize, each a package that imports none
after it, with state/ (the only writer of statuses) the floor they all write through. Beneath them: records and
record_store (what crosses a seam, and its files), endpoints/ (one module per endpoint kind), faults and outage.
Above them: the commands people call (service, lifecycle, retry, message_batches, files) and views/."""
