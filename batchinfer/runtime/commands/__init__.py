"""What a worker does when asked, one command each: a Celery task (workers/tasks.py) builds one and calls run().
The policy (the dispatch lock and its rounds, what a fault means for a unit, where a validation's dispatch goes)
lives here, so the API, the CLI and the worker take one path with one error policy."""
