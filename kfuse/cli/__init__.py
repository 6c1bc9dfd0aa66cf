"""The kfuse command line."""
