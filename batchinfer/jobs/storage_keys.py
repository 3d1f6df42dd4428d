"""Where each file of a job or work unit lives in storage."""


def job_input(job_id: str) -> str:
    return f"jobs/{job_id}/input.jsonl"


def job_prepared(job_id: str) -> str:
    return f"jobs/{job_id}/prepared.jsonl"


def job_invalid(job_id: str) -> str:
    return f"jobs/{job_id}/invalid.jsonl"


def job_output(job_id: str) -> str:
    return f"jobs/{job_id}/output.jsonl"


def job_errors(job_id: str) -> str:
    return f"jobs/{job_id}/errors.jsonl"


def unit_input(unit_id: str) -> str:
    return f"units/{unit_id}/input.jsonl"


def unit_results(unit_id: str, attempt: int) -> str:
    return f"units/{unit_id}/results-{attempt}.jsonl"
