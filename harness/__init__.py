"""offload-harness: a benchmark harness for optimizer-state offloading inside DeepSpeed's DeepCompile."""
