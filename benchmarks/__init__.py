"""The benchmarks, beside the product: `batchinfer bench <benchmark>` once installed with the `[bench]` extra
(`pip install -e '.[bench]'` from a checkout). The product never imports this package (import-linter)."""
