"""Where each file of a job or work unit lives in storage."""


def job_input(job_id: str) -> str:
    return f"jobs/{job_id}/input.jsonl"


def job_prepared(job_id: str) -> str:
    return f"jobs/{job_id}/prepared.jsonl"


PART_LINES = 1000  # a prepared part holds the valid requests of indexes PART_LINES*k .. PART_LINES*(k+1)-1


def job_prepared_part(job_id: str, part: int) -> str:
    """Prepared requests of one part of the file, stored before the rows it holds are committed (so a dispatch
    can read them while the file is still validated: prepared.jsonl is visible only once closed)."""
    return f"jobs/{job_id}/prepared-parts/{part:06d}.jsonl"


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
