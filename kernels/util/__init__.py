"""Helpers every room uses, at the bottom of the import table: atomic writes and cache locks
(`cache_lock.py`), the weights' digest (`digest.py`), timing probes (`timing.py`) and the
measurements remembered per machine (`machine_records.py`)."""
