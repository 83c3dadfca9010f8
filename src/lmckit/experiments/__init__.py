"""Resumable runs built from the library's functions."""
