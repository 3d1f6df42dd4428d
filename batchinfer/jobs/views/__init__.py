"""What people and clients see of a job: the OpenAI and Anthropic batch objects, statistics, prefix reports, the ETA."""
