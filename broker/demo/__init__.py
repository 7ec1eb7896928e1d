"""`skyfed demo`: the whole system on embedded defaults, narrated (see runner.py)."""
