"""Dashboard widgets, one class per module."""
