"""LTX-2 (building blocks; the family itself is not registered yet: docs/video.md)."""
