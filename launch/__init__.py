"""distgnn's launcher: starts servers and trainers on every machine of an ip_config.

Standard library only: it must run on a login node without torch. May import: nothing else of distgnn.
"""
