"""Store implementations, one module per store, each importing its own driver."""
