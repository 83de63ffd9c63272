"""The KV cache: paged blocks, int8 quantization, offload to host memory."""
