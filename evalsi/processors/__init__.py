"""The built-in processors, each a module of its own (registered by `evalsi.collector.builtin`)."""
