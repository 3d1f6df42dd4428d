"""One module per endpoint kind (chat, completions, responses, embeddings, Anthropic messages): what its input line
is and what its result body is. batch_line is the Batch format around them; kinds finds one by url."""
