"""The run's configuration: gin parsed and resolved at the edge, the CLIs' flags, `--print_config`."""
