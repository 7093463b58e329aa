"""llm-kernel-lib benchmark suites (also shipped inside llmk-meta as ``llm_kernels._benchmarks``)."""
