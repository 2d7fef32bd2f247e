"""`speclab dashboard`: a local, read-only web page over a runs directory (see server.py)."""
