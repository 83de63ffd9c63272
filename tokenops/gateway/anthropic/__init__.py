"""Anthropic's Messages API (``/v1/messages``): request bodies, content blocks and event streams."""
