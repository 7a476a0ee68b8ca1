"""The `roformer` subcommands, a module per kind (models, runs, studies), each listing its own COMMANDS."""
