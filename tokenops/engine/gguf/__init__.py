"""GGUF files: header, reader, quant types, tokenizer, weights and transcoding."""
