"""`batchinfer bench`: generated workloads run side by side on the engine, transformers and llama.cpp."""
