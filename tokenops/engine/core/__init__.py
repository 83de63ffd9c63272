"""The engine's core: requests, sequences, the scheduler, the step loop and its outputs, the config."""
