"""Stand-in for vLLM's `vllm serve`, for tests on machines without a GPU. See ../README.md."""
