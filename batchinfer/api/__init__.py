"""The HTTP API in the shapes of OpenAI's Files and Batches (`batchinfer serve`)."""
