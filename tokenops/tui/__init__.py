"""The ``tokenops dashboard`` Textual app. Only the CLI imports this package, lazily."""
