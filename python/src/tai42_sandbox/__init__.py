"""The client of the tai42 daemon: a provider of the sandbox contract."""
