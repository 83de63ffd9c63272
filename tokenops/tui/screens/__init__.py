"""Dashboard screens, one class per module."""
