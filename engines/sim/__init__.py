"""The simulated engine: a vLLM / trtllm-serve look-alike with a power model and ground-truth energy."""
