"""What a job produces: result and error lines, the assembled files, and the views of a job (OpenAI, Anthropic, stats)."""
