"""Which sequences run each step: the scheduler, a request's sequence, parallel samples, step statistics."""
