"""The `mapstream` command line (the only place that prints)."""
