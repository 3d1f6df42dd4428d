"""Celery app and task entry points: thin wrappers over the batchinfer package."""
