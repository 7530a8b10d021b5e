"""The command line as a user meets it: real ``python -m bundlefs`` subprocesses, exit codes,
messages, credentials off the command line, completion, the installed package."""
