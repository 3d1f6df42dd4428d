"""Finalize, the last stage: a job's output and error files assembled from its units' results."""
