"""OpenAI's wire API: chat and text completions, models, embeddings, images, and vLLM's /tokenize beside them."""
