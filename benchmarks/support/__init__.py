"""The process and cluster harness that the tests and the benchmarks share (services, worker start-up, paged
batches and torch references for the kernels). It imports nothing of tests/; the product never imports it."""
