"""Units, the third stage: a work unit runs on a generator, reports live progress and waits out outages."""
