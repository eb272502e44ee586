"""Engine adapters: each subpackage turns one serving engine's page or chunk
identities into gdrkv keys and calls gdrkv.Client."""
