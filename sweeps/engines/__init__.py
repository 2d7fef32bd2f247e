"""Serving engines speclab builds and drives on this machine (llama.cpp: llama_cpp.py)."""
