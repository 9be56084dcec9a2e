"""One module per subcommand of python -m distperf: add_arguments(parser) and main(args)."""
