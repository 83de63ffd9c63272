"""Built-in technique plugins, imported as ``tokenops_plugins``; each module is
registered under the ``tokenops`` entry-point group like any third-party plugin."""
